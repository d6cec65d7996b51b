"""Timing a model as it is deployed (``ablate report``'s latency columns): at one thread and at every
thread, targets timed in turns a round at a time (:class:`Target`, :class:`TorchTarget`, :class:`Turns`,
:func:`time_round`, :func:`paired_metrics`), each repeat followed by the reference workload; and the
CPU's instruction sets beside the figures (docs/reports.md, "Remeasured by default, as deployed")."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import nn

from ablate.lightning_modules.measure import profiling
from ablate.lightning_modules.measure.measuring import autocast_for, forked_rng, random_batch, sync
from ablate.lightning_modules.measure.reference_load import Workload

#: Suffix of the every-thread latencies (``latency_ms_b32_all``); the default (one thread) has none.
ALL_THREADS = "_all"
#: What a report names -> the ``/proc/cpuinfo`` flags, any of which says the CPU has it.
INSTRUCTION_SETS: dict[str, tuple[str, ...]] = {
    "AVX2": ("avx2",),
    "AVX-512": ("avx512f",),
    "VNNI": ("avx512_vnni", "avx_vnni"),
    "AMX": ("amx_tile", "amx_int8", "amx_bf16"),
}
Call = Callable[[], object]
#: :func:`paired_metrics` keeps the quietest 1/QUIET_SHARE of the turns (at least 3).
QUIET_SHARE = 3


def instruction_sets(path: Path = Path("/proc/cpuinfo")) -> dict[str, bool] | None:
    """Which of :data:`INSTRUCTION_SETS` the CPU has; None where ``path`` cannot be read (not Linux)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    return {name: any(f in flags for f in names) for name, names in INSTRUCTION_SETS.items()}


def describe_instruction_sets(sets: Mapping[str, bool] | None = None) -> str:
    """``AVX2 yes, AVX-512 yes, VNNI yes, AMX no`` (of this CPU when ``sets`` is None), or ``unknown (no
    /proc/cpuinfo)``."""
    have = instruction_sets() if sets is None else sets
    if have is None:
        return "unknown (no /proc/cpuinfo)"
    return ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in have.items())


def all_threads() -> int:
    """The CPUs this process may run on (its affinity; else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_settings() -> dict[str, int]:
    """Metric suffix -> threads: ``""`` one thread, :data:`ALL_THREADS` every one (:func:`all_threads`)."""
    return {"": 1, ALL_THREADS: all_threads()}


def latency_name(batch: int, suffix: str = "") -> str:
    """``latency_ms_b32`` (one thread), ``latency_ms_b32_all`` (``suffix`` :data:`ALL_THREADS`)."""
    return profiling.latency_metric(batch) + suffix


def latency_names() -> tuple[str, ...]:
    """Every latency a deployed timing gives, each with ``_spread`` and ``_reference`` beside it."""
    return tuple(latency_name(b, s) for s in ("", ALL_THREADS) for b in profiling.LATENCY_BATCHES)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op threads set to ``threads`` while inside (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Target(Protocol):
    """Something to time: ``label`` says which runtime and form (``ORT int8``, ``ORT fp32``, ``PyTorch``)."""

    @property
    def label(self) -> str: ...

    @property
    def device(self) -> torch.device: ...

    def call(self, threads: int, batch: int) -> Call:
        """One forward at batch size ``batch`` on fixed random ids, run with ``threads`` intra-op threads."""
        ...


@dataclass
class TorchTarget:
    """A PyTorch model timed as it runs: ``forward(model, batch)`` in eval mode, under inference mode and the
    autocast of ``precision``, on ``device``, on random ids of ``seq_len`` tokens (the model's own copy: it is
    moved and left in eval mode)."""

    model: nn.Module
    forward: Callable[[nn.Module, dict[str, torch.Tensor]], object]
    vocab_size: int
    seq_len: int
    device: torch.device = torch.device("cpu")
    precision: str = "32-true"
    label: str = "PyTorch"

    def __post_init__(self) -> None:
        self.model.to(self.device).eval()

    def call(self, threads: int, batch: int) -> Call:
        with forked_rng(self.device):
            inputs = random_batch(self.vocab_size, batch, self.seq_len, self.device)
        inputs = {k: inputs[k] for k in ("input_ids", "token_type_ids", "attention_mask")}

        def run() -> object:
            with torch.inference_mode(), autocast_for(self.precision, self.device):
                return self.forward(self.model, inputs)

        return run


@dataclass
class Turns:
    """Every timed repeat of one target, by (thread suffix, batch size), over the rounds timed so far.

    Attributes:
        target: what is timed.
        times: (suffix, batch) -> each timed repeat, ms.
        refs: (suffix, batch) -> the reference workload's run after each repeat, ms.
    """

    target: Target
    times: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    refs: dict[tuple[str, int], list[float]] = field(default_factory=dict)

    def time_round(self, repeats: int, warmup: int, reference: Workload, settings: Mapping[str, int]) -> None:
        """One round of this target alone (:func:`time_round`)."""
        time_round([self], repeats, warmup, {str(self.target.device): reference}, settings)

    def time_once(self, run: Call, key: tuple[str, int], reference: Workload) -> None:
        """One timed forward ``run`` kept under ``key``, then one run of ``reference``."""
        dev = self.target.device
        sync(dev)
        start = time.perf_counter()
        run()
        sync(dev)
        self.times.setdefault(key, []).append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        reference()
        sync(dev)
        self.refs.setdefault(key, []).append((time.perf_counter() - start) * 1e3)

    def metrics(self) -> dict[str, float]:
        """Each latency (:func:`latency_name`: the fastest repeat over every round), its ``_spread`` and its
        ``_reference`` (:func:`~ablate.lightning_modules.measure.profiling.latency_metrics`)."""
        out: dict[str, float] = {}
        for (suffix, batch), times in self.times.items():
            lat = profiling.Latency(tuple(times), tuple(self.refs.get((suffix, batch), ())))
            for name, value in profiling.latency_metrics({batch: lat}).items():
                base = profiling.latency_metric(batch)
                out[latency_name(batch, suffix) + name[len(base) :]] = value
        return out


def time_round(
    turns: Sequence[Turns], repeats: int, warmup: int, references: Mapping[str, Workload], settings: Mapping[str, int]
) -> None:
    """One round over every target of ``turns``, interleaved as finely as timing allows: at each thread setting
    of ``settings`` (suffix -> threads; on a GPU the default only) and each batch size of
    :data:`~ablate.lightning_modules.measure.profiling.LATENCY_BATCHES`, every target runs ``warmup`` untimed
    forwards, then the targets take turns, one timed forward each (and its device's reference workload,
    ``references`` by ``str(device)``), ``repeats`` times. A load that comes and goes meets every target alike,
    so their ratios hold."""
    for suffix, threads in settings.items():
        timed = [t for t in turns if not suffix or t.target.device.type == "cpu"]
        with torch_threads(threads):
            for batch in profiling.LATENCY_BATCHES:
                runs = [t.target.call(threads, batch) for t in timed]
                for run in runs:
                    for _ in range(warmup):
                        run()
                for _ in range(repeats):
                    for t, run in zip(timed, runs, strict=True):
                        t.time_once(run, (suffix, batch), references[str(t.target.device)])


def paired_metrics(turns: Sequence[Turns]) -> list[dict[str, float]]:
    """Each target's :meth:`Turns.metrics`, its latencies taken from the turns it shared with the others
    (:func:`time_round`): where several targets on one device took the same turns at a thread setting and
    batch size, a target's latency is ``exp(median over turns of (log t - mean log t of the turn))`` times the
    quietest turn's geometric mean, over the quietest of the turns (a third: :data:`QUIET_SHARE`; a heavy load
    slows models unlike each other). A load that slows a whole turn slows every target in it alike and drops
    out of their ratios; the median keeps a load that slowed one target's forward in one turn out; and the
    figure is that of the quietest turn (a lone target: its fastest repeat, as before). Spreads and
    references stay each target's own."""
    out = [t.metrics() for t in turns]
    groups: dict[tuple[str, tuple[str, int]], list[int]] = {}
    for i, t in enumerate(turns):
        for key in t.times:
            groups.setdefault((str(t.target.device), key), []).append(i)
    for (_, key), members in groups.items():
        lengths = {len(turns[i].times[key]) for i in members}
        if len(members) < 2 or len(lengths) != 1:
            continue
        logs = np.log(np.array([turns[i].times[key] for i in members]))  # (targets, turns)
        turn = logs.mean(axis=0)
        quiet = np.argsort(turn)[: max(3, len(turn) // QUIET_SHARE)]  # the quietest turns: loads distort ratios
        shares = np.median(logs[:, quiet] - turn[quiet], axis=1)
        for i, share in zip(members, shares, strict=True):
            out[i][latency_name(key[1], key[0])] = float(np.exp(share + turn.min()))
    return out
