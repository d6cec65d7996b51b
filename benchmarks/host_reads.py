"""Host reads of device values in the training loop, per training step, log step and validation batch,
with the line that asked: on a GPU each drains the device's queue, which a CPU's timings do not show. On
a CPU every read of a tensor counts; on CUDA, torch's synchronizing operations
(``torch.cuda.set_sync_debug_mode``). docs/performance.md, "Device reads"."""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.overrides import TorchFunctionMode

# tensor methods that hand a value to the host: a GPU waits for the kernels that make it (``.to("cpu")``
# is not among them: on a CPU it cannot be told from a move to the run's device)
READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "__format__", "numpy", "cpu"})
# operations whose result's size depends on the values: the host reads that size before it goes on
SIZED_BY_VALUES = frozenset({"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "bincount"})
KINDS = ("training step", "log step", "validation batch")
_SKIPPED = (str(Path(torch.__file__).parent), __file__, warnings.__file__)  # frames that only pass a read on
_OPTIM = str(Path(torch.optim.__file__).parent)  # torch's optimizers read only their step counts, host-side


def _reads(name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> bool:
    """Whether ``name`` called with ``args`` reads a value (or a size made of values) on the host."""
    if name in READS or name in SIZED_BY_VALUES:
        return True
    if name == "where":  # torch.where(condition): the positions
        return len(args) == 1 and not kwargs
    if name == "repeat_interleave":  # repeats given as a tensor, without output_size
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    if name in ("__getitem__", "__setitem__") and len(args) > 1:  # indexing by a boolean mask
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return False


def _site() -> str | None:
    """Where the read was asked for: the innermost frame outside torch and this module; None for a read by
    one of torch's optimizers (of a step count kept on the host even on a GPU, which a CPU run cannot tell)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(_OPTIM):
            return None
        if not frame.filename.startswith(_SKIPPED):
            path = Path(frame.filename)
            return f"{path.parent.name}/{path.name}:{frame.lineno} ({frame.name})"
    return "torch"


class _Reads(TorchFunctionMode):
    """Tells ``seen`` where each read of a tensor on ``device_type`` came from."""

    def __init__(self, device_type: str, seen: Callable[[str | None], None]) -> None:
        super().__init__()
        self.device_type, self.seen = device_type, seen

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: object,
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        first = args[0] if args else None
        name = getattr(func, "__name__", "")
        if isinstance(first, torch.Tensor) and first.device.type == self.device_type and _reads(name, args, kwargs):
            site = _site()
            self.seen(None if site is None else f"{site} {name}")
        return func(*args, **kwargs)


@dataclass
class Reads:
    """What one counted run read: per kind (:data:`KINDS`), how many of that kind ran and the reads
    at each site."""

    seen: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    sites: dict[str, Counter[str]] = field(default_factory=lambda: {k: Counter() for k in KINDS})

    def per(self, kind: str) -> float:
        """Reads per ``kind`` (0 where none of that kind ran)."""
        n = self.seen[kind]
        return sum(self.sites[kind].values()) / n if n else 0.0

    def lines(self) -> list[str]:
        """One line per kind: the reads per step or batch, and where they come from."""
        out = []
        for kind in KINDS:
            if not self.seen[kind]:
                continue
            n = self.seen[kind]
            where = "; ".join(f"{c / n:.2g} {site}" for site, c in self.sites[kind].most_common(6))
            out.append(f"- device reads per {kind}: {self.per(kind):.2f} (over {n}){': ' + where if where else ''}")
        return out


class ReadCount(pl.Callback):
    """Counts the host's reads of device values at each training step (after the first ``warmup``),
    log step and validation batch of a fit, and stops the fit after ``steps`` training steps."""

    def __init__(self, device: torch.device, warmup: int, steps: int) -> None:
        self.device, self.warmup, self.steps = device, warmup, steps
        self.reads = Reads()
        self._kind: str | None = None
        self._stack = contextlib.ExitStack()

    def _seen(self, site: str | None) -> None:
        if self._kind is not None and site is not None:
            self.reads.sites[self._kind][site] += 1

    def _begin(self, kind: str | None, counted: bool = True) -> None:
        self._kind = kind
        if kind is not None and counted:
            self.reads.seen[kind] += 1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stack.enter_context(_watching(self.device, self._seen))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        if trainer.global_step < self.warmup:
            return self._begin(None)
        logs = getattr(pl_module, "logs_this_step", lambda: False)()
        self._begin("log step" if logs else "training step")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if trainer.global_step >= self.warmup + self.steps:
            trainer.should_stop = True
            self._begin(None)  # what follows is the fit's end (a validation there is counted)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._begin("validation batch", counted=False)  # the reads at its start and end are the batches' share

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._begin("validation batch")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._begin(None)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._begin(None)
        self._stack.close()


@contextlib.contextmanager
def _watching(device: torch.device, seen: Callable[[str | None], None]) -> Iterator[None]:
    """Reads of tensors on ``device`` told to ``seen`` while inside: on CUDA the synchronizing operations
    torch warns of; elsewhere every read of a tensor (the CPU stands in for the device)."""
    if device.type != "cuda":
        with _Reads(device.type, seen):
            yield
        return

    def shown(message: Warning | str, *rest: object, **kw: object) -> None:
        if "synchroniz" in str(message):
            seen(_site())

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = shown  # restored by catch_warnings
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
