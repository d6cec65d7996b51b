"""Stateless callbacks go to Lightning as one: a real fit calls each member's hooks as often and in the
same order as when each is its own callback; what the Trainer looks up by type, and what has a state of
its own, stays apart; a profiler's run keeps every callback apart to time it."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint
from torch.utils.data import DataLoader

from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.grouped import Grouped, groupable, grouped
from ablate.sweeps.engine.trainer import FiniteLoss, LoopProgressBar, ValidateAtEnd, build_trainer
from tests.lightning import bare_trainer


class Recorder(Callback):
    """Writes down every call of the hooks it has, into a shared list."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name, self.calls = name, calls

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.calls.append((self.name, f"batch_end {batch_idx}"))

    def on_validation_end(self, trainer, pl_module) -> None:
        self.calls.append((self.name, f"validation_end {trainer.global_step}"))

    def on_train_end(self, trainer, pl_module) -> None:
        self.calls.append((self.name, "train_end"))


class BatchStarts(Callback):
    def __init__(self, calls: list[tuple[str, str]]) -> None:
        self.calls = calls

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.calls.append(("starts", f"batch_start {batch_idx}"))


class Stateful(Callback):
    """Counts the steps; its count is saved in checkpoints under its own key."""

    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_end(self, *args: object) -> None:
        self.steps += 1

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}


class Line(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/loss", self.layer(batch).sum())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(callbacks: list[Callback], root: Path) -> pl.Trainer:
    torch.manual_seed(0)
    data = DataLoader([torch.randn(2, 4) for _ in range(12)], batch_size=None)  # type: ignore[arg-type]
    trainer = bare_trainer(7, val_every=3, val_batches=2, callbacks=callbacks, sanity_steps=2, root=root)
    trainer.fit(Line(), data, data)
    return trainer


def test_a_fit_calls_each_member_as_it_calls_callbacks_apart(tmp_path):
    apart: list[tuple[str, str]] = []
    _fit([Recorder("a", apart), BatchStarts(apart), Recorder("b", apart)], tmp_path / "apart")
    together: list[tuple[str, str]] = []
    members = [Recorder("a", together), BatchStarts(together), Recorder("b", together)]
    trainer = _fit(grouped(members), tmp_path / "together")
    assert [type(c) for c in trainer.callbacks] == [Grouped]
    assert together == apart  # the same calls, in the same order
    assert ("a", "batch_end 6") in together and ("starts", "batch_start 0") in together
    assert ("b", "validation_end 6") in together and together[-1] == ("b", "train_end")
    group = trainer.callbacks[0]
    assert isinstance(group, Grouped)
    assert group.by_hook["on_train_batch_start"] == (members[1],)  # only the member that has the hook
    assert group.by_hook["on_before_backward"] == ()


def test_what_the_trainer_looks_up_and_what_has_a_state_stays_apart(tmp_path):
    stop, saving, bar, counts = (
        EarlyStopping("val/loss"),
        ModelCheckpoint(dirpath=tmp_path),
        LoopProgressBar(),
        Stateful(),
    )
    guard, lr, at_end = FiniteLoss(10), LearningRateMonitor(), ValidateAtEnd()
    assert [groupable(c) for c in (stop, saving, bar, counts, guard, lr, at_end)] == [False] * 4 + [True] * 3
    out = grouped([lr, guard, bar, at_end, stop, counts, saving])
    assert [type(c) for c in out] == [Grouped, LoopProgressBar, EarlyStopping, Stateful, ModelCheckpoint]
    assert out[0].members == (lr, guard, at_end)  # type: ignore[attr-defined]
    assert grouped([lr, bar]) == [lr, bar]  # one groupable callback: nothing to group
    # a stateful callback's state is saved under its own key, as if nothing were grouped
    trainer = _fit(grouped([Recorder("a", []), Stateful(), Recorder("b", [])]), tmp_path / "fit")
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    states = torch.load(tmp_path / "c.ckpt", weights_only=False)["callbacks"]
    assert states == {"Stateful": {"steps": 7}}


def test_build_trainer_groups_its_callbacks_unless_a_profiler_times_them():
    cfg = build_config({"trainer": {"accelerator": "cpu", "progress": True}})
    mine = [Recorder("a", []), Stateful()]
    trainer = build_trainer(cfg, None, mine)
    assert [type(c) for c in trainer.callbacks] == [Grouped, LoopProgressBar, Stateful]
    assert [type(c) for c in trainer.callbacks[0].members] == [FiniteLoss, Recorder]
    profiled = build_trainer(build_config({"trainer": {"accelerator": "cpu", "profiler": "simple"}}), None, mine)
    Path(profiled.profiler.dirpath).rmdir()
    assert [type(c) for c in profiled.callbacks] == [FiniteLoss, LoopProgressBar, Recorder, Stateful]
