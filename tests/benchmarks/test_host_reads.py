"""The host's reads of device values, counted per training step, log step and validation batch of a real
Lightning fit: a read asked for in the step is counted at its line, a loop without one counts none, and
ablate's own loops read nothing between log steps."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from ablate.benchmarks.host_reads import ReadCount
from tests.lightning import bare_trainer


class _Line(pl.LightningModule):
    """A linear fit whose training step reads its loss ``reads`` times (``.item()``) and logs every 4 steps."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.layer, self.reads = torch.nn.Linear(4, 1), reads

    def logs_this_step(self) -> bool:
        return (self.global_step + 1) % 4 == 0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        for _ in range(self.reads):
            loss.detach().item()
        if self.logs_this_step():
            float(loss.detach())
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        out = self.layer(batch)
        out[out > 0]  # indexed by a mask: the result's size is read from the values

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _counted(reads: int, warmup: int = 2, steps: int = 12) -> ReadCount:
    data = DataLoader(torch.randn(64, 4), batch_size=2)
    count = ReadCount(torch.device("cpu"), warmup, steps)
    trainer = bare_trainer(100, val_every=8, val_batches=3, callbacks=[count])
    trainer.fit(_Line(reads), data, data)
    return count


def test_reads_in_the_step_are_counted_at_their_line_by_kind():
    count = _counted(reads=2)
    r = count.reads
    # steps 2..13 counted: 12 steps, of which 3 log (steps 3, 7, 11 zero-based: (g + 1) % 4 == 0)
    assert r.seen["training step"] + r.seen["log step"] == 12 and r.seen["log step"] == 3
    assert r.per("training step") == 2.0
    (site,) = r.sites["training step"]
    assert site.startswith("benchmarks/test_host_reads.py:") and site.endswith("(training_step) item")
    # a log step reads twice at that line and once at the next; on a CPU every tensor read counts, so
    # Lightning's own read of its loader's state when a validation starts shows too (not a device's)
    ours = {s: n for s, n in r.sites["log step"].items() if s.startswith("benchmarks/")}
    assert sorted(ours.values()) == [3, 6] and site in ours
    # two validations (after step 8, and where the fit stopped) of 3 batches, each batch reading once
    assert r.seen["validation batch"] == 6 and r.per("validation batch") == 1.0
    assert [s.rsplit(" ", 1)[1] for s in r.sites["validation batch"]] == ["__getitem__"]
    lines = r.lines()
    assert lines[0].startswith("- device reads per training step: 2.00 (over 9): 2 benchmarks/test_host_reads.py:")


def test_what_reads_a_value_or_a_size_made_of_values():
    from ablate.benchmarks.host_reads import _reads

    x, mask = torch.ones(4), torch.tensor([True, False, True, False])
    assert _reads("item", (x,), {}) and _reads("nonzero", (x,), {}) and _reads("__getitem__", (x, mask), {})
    assert _reads("__setitem__", (x, (mask,), 0.0), {}) and _reads("where", (mask,), {})
    assert _reads("repeat_interleave", (x, torch.tensor([1, 2, 1, 1])), {})
    # sizes known without the values: no read
    assert not _reads("where", (mask, x, x), {}) and not _reads("__getitem__", (x, torch.tensor([0, 2])), {})
    assert not _reads("repeat_interleave", (x, torch.tensor([1, 2, 1, 1])), {"output_size": 5})
    assert not _reads("add", (x, x), {}) and not _reads("repeat_interleave", (x, 2), {})


def test_a_loop_without_reads_counts_none_and_the_fit_stops_where_asked():
    count = _counted(reads=0, warmup=1, steps=5)
    r = count.reads
    assert r.per("training step") == 0.0 and r.sites["training step"] == {}
    assert r.seen["training step"] + r.seen["log step"] == 5
    assert r.lines()[0] == "- device reads per training step: 0.00 (over 4)"
