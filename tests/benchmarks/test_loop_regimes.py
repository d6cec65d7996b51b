"""``ablate bench loop --regime distill|prune|finetune`` on tiny real runs: each regime runs its
real ``ablate train`` (a teacher's distillation, schuBERT's gates, SST-2 fine-tuning) and its step
alone in turns, and prints the table whose last line is the efficiency. No timed assertion:
speed is the benchmark's job."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
import torch

from ablate.benchmarks.cases import CASES, Case
from ablate.benchmarks.loop import measure, report
from ablate.benchmarks.regimes import synthetic_sst2

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(name: str) -> Case:
    """The regime's default case at a test's size: one layer, a 2048-token vocabulary, T=32, B=4."""
    case = CASES[name]()

    def small(model):
        return replace(model, vocab_size=2048, num_layers=1, max_position=32)

    teacher = None if case.teacher is None else small(case.teacher)
    return replace(case, model=small(case.model), teacher=teacher, seq_len=32, batch=4)


@pytest.mark.parametrize(
    ("regime", "name"), [("distill", "distill-mini"), ("prune", "bert-tiny"), ("finetune", "bert-tiny")]
)
def test_each_regime_runs_and_prints_its_table(regime, name, wiki_validation):
    case = _tiny(name)
    r = measure(case, str(wiki_validation), torch.device("cpu"), warmup=2, steps=5, block=1, regime=regime)
    assert r.regime == regime and r.cfg.regime == regime
    assert [n for _, n in r.loop.blocks] == [n for _, n in r.step.blocks] == [1, 1, 1, 1]
    for side in (r.loop, r.step):
        assert side.steps == 4 and side.tokens > 0 and side.tokens_per_s > 0
    assert r.phases["validation"] > 0 and r.phases["step alone in the run"] > 0
    lines, ok = report(r, "wiki")
    task = " --task sst2" if regime == "finetune" else ""  # fine-tuning names its task (SST-2 by default)
    assert lines[0].startswith(f"### {case.name}: ablate train --regime {regime}{task} (")
    assert any(line.startswith("| the loop (ablate train) |") for line in lines)
    assert lines[-1] == f"loop efficiency: {r.efficiency:.2f}" and ok == (r.efficiency >= 0.9)
    # the host reads no device value between log steps (on a GPU each read waits for the device's queue)
    assert r.reads is not None and r.reads.seen["training step"] > 0 and r.reads.per("training step") == 0
    assert "- device reads per training step: 0.00 (over" in "\n".join(lines)
    if regime == "finetune":  # the dev metrics do not check their arguments (a torch.unique per batch)
        assert r.reads.seen["validation batch"] > 0
        assert not [site for site in r.reads.sites["validation batch"] if site.endswith(" unique")]
    # fine-tuning also times its step on the same batches padded to max_length
    assert any(line.startswith("- padding to the longest row: **") for line in lines) == (regime == "finetune")


def test_fine_tuning_compiled_runs_bucketed_and_reports_its_host_time(wiki_validation):
    """``--compile`` on a CPU (always on CUDA): the fine-tuning run a GPU study makes, compiled with bucketed
    widths, at the micro case the host time per step is read at; the table says so, and the host time."""
    from ablate.benchmarks.loop import sides
    from ablate.benchmarks.regimes import TaskChoice

    assert sides("finetune", torch.device("cpu"), compile_too=False) == [False]
    assert sides("finetune", torch.device("cuda"), compile_too=False) == [False, True]  # the last: compiled
    assert sides("pretrain", torch.device("cuda"), compile_too=True) == [None]
    case = CASES["micro"]()
    cpu = torch.device("cpu")
    r = measure(case, str(wiki_validation), cpu, 2, 4, 1, regime="finetune", choice=TaskChoice(batch=8), compiled=True)
    assert r.cfg.trainer.compile and r.cfg.finetune.batch_size == 8
    lines, _ = report(r, "wiki")
    assert "B=8 sentences bucketed widths" in lines[0] and "compiled default" in lines[0]
    host = next(line for line in lines if line.startswith("- host time per step: "))
    gaps = [a / n - b / m for (a, n), (b, m) in zip(r.loop.blocks, r.step.blocks, strict=True)]
    assert float(host.split()[5]) == pytest.approx(1e3 * statistics.median(gaps), abs=0.006)


def test_the_loop_and_the_step_alone_see_the_same_batches(wiki_validation):
    """Fine-tuning batches differ in length (padded to their longest sentence): the step alone's
    timed steps are the loop's own batches, so both count the same real tokens."""
    r = measure(_tiny("bert-tiny"), str(wiki_validation), torch.device("cpu"), 2, 5, 1, regime="finetune")
    assert r.loop.tokens == r.step.tokens


def test_synthetic_sst2_has_its_format_and_short_sentences(tmp_path):
    folder = synthetic_sst2(tmp_path, train=200, validation=20)
    rows = (folder / "train.tsv").read_text().splitlines()
    assert rows[0] == "sentence\tlabel" and len(rows) == 201
    lengths = [len(row.split("\t")[0].split()) for row in rows[1:]]
    assert all(1 <= n <= 50 for n in lengths) and sorted(lengths)[100] < 20
    assert {row.rsplit("\t", 1)[1] for row in rows[1:]} == {"0", "1"}
    assert len((folder / "validation.tsv").read_text().splitlines()) == 21


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["bench", "train", "--regime", "distill"],
            "error: --regime: only for `ablate bench loop` (not ablate bench train)",
        ),
        (
            ["bench", "loop", "--regime", "prune", "--sst2", "SST2"],
            "error: --sst2: only for `ablate bench loop --regime",
        ),
        (["bench", "loop", "--sst2", "EMPTY"], "error: --sst2: EMPTY: no train.tsv or validation.tsv in it"),
        (
            ["bench", "loop", "--regime", "prune", "--case", "albert-tiny"],
            "error: --case: albert-tiny cannot be pruned",
        ),
        (["bench", "loop", "--regime", "distill", "--case", "bert-tiny"], "error: --case: bert-tiny has no teacher"),
        (["bench", "loop", "--batch", "64"], "error: --batch: only for `ablate bench loop --regime finetune`"),
        (["bench", "train", "--batch", "64"], "error: --batch: only for `ablate bench loop` (not ablate bench train)"),
        (["bench", "loop", "--compile"], "error: --compile: for `ablate bench loop` only with --regime finetune"),
        (
            ["bench", "deploy", "--compile"],
            "error: --compile: only for `ablate bench train`, `ablate bench precision` and `ablate bench loop` "
            "(not ablate bench deploy)",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys, wiki_validation):
    from ablate.cli import main

    (tmp_path / "sst2").mkdir()
    for name in ("train.tsv", "validation.tsv"):
        (tmp_path / "sst2" / name).write_text("sentence\tlabel\ngood\t1\n")
    (tmp_path / "empty").mkdir()
    paths = {"SST2": str(tmp_path / "sst2"), "EMPTY": str(tmp_path / "empty")}
    argv = [paths.get(a, a) for a in argv] + ["--corpus", str(wiki_validation)]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(message.replace("EMPTY", paths["EMPTY"])), err
