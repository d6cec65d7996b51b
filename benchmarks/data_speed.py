"""``ablate bench data``: is data ever the bottleneck? The pipeline's tokens/s per worker in one process,
the share of the quickstart's training loop spent waiting for a batch (Lightning's SimpleProfiler),
and the peak RSS of streaming one shard against every shard of ``--corpus`` (docs/performance.md, "Data")."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch
from rich.progress import Progress

from ablate.benchmarks import mark
from ablate.datamodules.stream import PretrainStream
from ablate.datamodules.tokenizer import load_or_train_tokenizer
from ablate.lightning_modules.config.experiment import DataConfig, ObjectiveConfig

TARGET_TOKENS_S, TARGET_WAIT, TARGET_RSS = 100_000, 0.05, 0.10
BATCHES = 200


def _config(corpus: str) -> tuple[DataConfig, ObjectiveConfig]:
    """T=128, B=32, SOP pairs, n-gram masking on ``corpus``."""
    return (
        DataConfig(corpus=corpus, max_length=128, batch_size=32, num_workers=0, tokenizer_docs=5000),
        ObjectiveConfig(sentence="sop", masking="ngram"),
    )


def pipeline_tokens_per_s(corpus: str, batches: int = BATCHES) -> tuple[float, int, str]:
    """Tokens (non-padding) per second of one reader, how many it produced, and the tokenizer (JSON)."""
    data, objective = _config(corpus)
    tokenizer, _ = load_or_train_tokenizer(data, 8192)
    stream = iter(PretrainStream(data, objective, tokenizer.to_str(), 0, "train"))
    next(stream)  # opening the corpus is not throughput
    start, tokens = time.perf_counter(), 0
    for batch in islice(stream, batches):
        tokens += int(batch["attention_mask"].sum())
    return tokens / (time.perf_counter() - start), tokens, tokenizer.to_str()


def loader_wait(steps: int = 200) -> tuple[float, float]:
    """The quickstart's first trial (albert-tiny, E=32, all shared, F=1) for ``steps`` steps under
    SimpleProfiler: (share of the loop waiting for data, steps/s)."""
    import lightning.pytorch as pl
    from lightning.pytorch.profilers import SimpleProfiler

    from ablate.datamodules.pretrain import PretrainDataModule
    from ablate.lightning_modules.methods.pretrain import PretrainModule
    from ablate.sweeps.spec import load_study, trial_config

    study = Path(__file__).resolve().parents[1] / "sweeps" / "studies" / "quickstart.yaml"
    spec, base = load_study(study)
    cfg = trial_config(base, spec, {"model.embed_dim": 32, "model.sharing": "all", "model.num_ffn": 1, "seed": 0}, None)
    pl.seed_everything(0, verbose=False)
    data = PretrainDataModule(cfg.data, cfg.objective, cfg.model.vocab_size, cfg.seed, val_batches=1)
    profiler = SimpleProfiler(dirpath=tempfile.mkdtemp(prefix="ablate-bench-"), filename="profile")
    trainer = pl.Trainer(
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=profiler,
        accelerator="cpu",
        devices=1,
    )
    start = time.perf_counter()
    trainer.fit(PretrainModule(cfg), datamodule=data)
    elapsed = time.perf_counter() - start
    durations = profiler.recorded_durations
    waiting = sum(sum(v) for k, v in durations.items() if k.endswith("train_dataloader_next"))
    batches = sum(sum(v) for k, v in durations.items() if k.endswith("run_training_batch"))
    return waiting / (waiting + batches), steps / elapsed


def _rss_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss(corpus: str, batches: int, tokenizer_file: str) -> dict[str, float]:
    """In this process: read ``batches`` batches of ``corpus`` with the given tokenizer (nothing
    trained here); RSS before streaming, and the peak, MiB."""
    data, objective = _config(corpus)
    stream = iter(PretrainStream(data, objective, Path(tokenizer_file).read_text(), 0, "train"))
    before = _rss_mib("VmRSS")
    for _ in islice(stream, batches):
        pass
    return {"before": before, "peak": _rss_mib("VmHWM")}


def streaming_rss(one: str, every: str, tokenizer_json: str, batches: int = 5 * BATCHES) -> dict[str, dict[str, float]]:
    """Peak RSS of reading ``batches`` batches from ``one`` shard and from ``every`` shard, each in
    a new process, both with the same tokenizer (so that neither trains one)."""
    out = {}
    tokenizer_file = Path(tempfile.mkdtemp(prefix="ablate-bench-")) / "tokenizer.json"
    tokenizer_file.write_text(tokenizer_json)
    for label, corpus in (("one shard", one), ("all shards", every)):
        code = (
            "import json, sys; from ablate.benchmarks.data_speed import _peak_rss; "
            f"print(json.dumps(_peak_rss({corpus!r}, {batches}, {str(tokenizer_file)!r})))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        out[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _shards(corpus: str) -> tuple[str, str] | None:
    """(first shard, every shard) of a folder or glob of several training files, else None."""
    path = Path(corpus)
    files = sorted(path.glob("train-*")) if path.is_dir() else sorted(Path().glob(corpus))
    if len(files) < 2:
        return None
    return str(files[0]), str(path / "train-*") if path.is_dir() else corpus


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    task = progress.add_task("pipeline tokens/s", total=None)
    speed, tokens, tokenizer_json = pipeline_tokens_per_s(args.corpus)
    progress.update(task, description="quickstart under SimpleProfiler")
    wait, steps_s = loader_wait(args.steps or 200)
    speed_ok, wait_ok = speed >= TARGET_TOKENS_S, wait < TARGET_WAIT
    lines = [
        f"### Data pipeline ({args.corpus}; T=128, B=32, SOP, n-gram masking)",
        "",
        "| measure | value | target |",
        "|---|---:|---|",
        f"| tokens/s, one worker ({tokens:,} tokens) | {speed:,.0f} | >= {TARGET_TOKENS_S:,} ({mark(speed_ok)}) |",
        f"| quickstart: loop waiting for data ({steps_s:.1f} steps/s) | {wait:.1%} | < {TARGET_WAIT:.0%} "
        f"({mark(wait_ok)}) |",
    ]
    ok = speed_ok and wait_ok
    shards = _shards(args.corpus)
    if shards is not None:
        progress.update(task, description="streaming RSS: one shard, all shards")
        rss = streaming_rss(*shards, tokenizer_json)
        gap = rss["all shards"]["peak"] / rss["one shard"]["peak"] - 1
        lines += [
            f"| peak RSS, {5 * BATCHES} batches from {label} | {r['peak']:,.0f} MiB (+{r['peak'] - r['before']:,.0f} "
            f"while streaming) | |"
            for label, r in rss.items()
        ]
        lines.append(f"| all shards vs one | {gap:+.1%} | < {TARGET_RSS:.0%} ({mark(abs(gap) < TARGET_RSS)}) |")
        ok &= abs(gap) < TARGET_RSS
    else:
        lines.append("| streaming RSS | not measured: --corpus is not a folder or glob of several train-* shards | |")
    progress.remove_task(task)
    return lines + [""], ok
