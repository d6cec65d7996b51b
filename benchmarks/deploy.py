"""``ablate bench deploy``: what a compressed classifier gains where it is deployed, as ratios in one run:
a bert-base-sized classifier (random weights) as PyTorch fp32 and as the graphs ``ablate export --format
onnx`` writes (fp32, dynamic and static int8, 4-bit), in turns at batch 1 and 32, one thread and every
core; last line ``int8 over PyTorch fp32, batch 32: X.XXx`` (target 1.5x). ``--smoke``: a tiny model
(docs/performance.md; figures: docs/guides/quantization.md, "Deployed: ONNX Runtime")."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress

from ablate.benchmarks import mark
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.interop.onnx_check import TaskRows, feed, session
from ablate.lightning_modules.interop.onnx_export import to_onnx
from ablate.lightning_modules.interop.onnx_quant import QUANTIZERS
from ablate.lightning_modules.model.classifier import Classifier, build_classifier
from ablate.lightning_modules.model.heads import build_pretraining_model

BERT_BASE = {"preset": "bert-base", "vocab_size": 30522}
TINY = {"preset": "bert-tiny", "num_layers": 2, "hidden_dim": 64, "num_heads": 2, "ffn_dim": 128, "vocab_size": 1000}
SEQ = 128
BATCHES = (1, 32)
TARGET = 1.5  # ONNX Runtime dynamic int8 over PyTorch fp32, batch 32, every core
CPU_FLAGS = {  # what the table names -> /proc/cpuinfo flags, any of which
    "AVX2": ("avx2",),
    "AVX-512": ("avx512f",),
    "VNNI": ("avx512_vnni", "avx_vnni"),
    "AMX": ("amx_tile", "amx_int8", "amx_bf16"),
}
ONNX_SETTINGS = {  # setting -> how its graph is made from the fp32 one (None: the fp32 graph itself)
    "ONNX Runtime fp32": None,
    "ONNX Runtime dynamic int8": "dynamic-int8",
    "ONNX Runtime static int8": "static-int8",
    "ONNX Runtime 4-bit (MatMulNBits)": "int4",
}
TORCH = "PyTorch fp32"


@dataclass(frozen=True)
class Size:
    """The model and how long to time it."""

    model: dict[str, object]
    rounds: dict[int, int]  # batch -> rounds
    calibration: int  # static int8's calibration rows


SIZES = {"full": Size(BERT_BASE, {1: 30, 32: 5}, 64), "smoke": Size(TINY, {1: 2, 32: 2}, 32)}


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> dict[str, bool]:
    """Which of :data:`CPU_FLAGS` the CPU has (all False where ``/proc/cpuinfo`` cannot be read)."""
    try:
        flags = next(
            (line.split(":", 1)[1].split() for line in path.read_text().splitlines() if line.startswith("flags")), []
        )
    except OSError:
        flags = []
    have = set(flags)
    return {name: any(f in have for f in names) for name, names in CPU_FLAGS.items()}


def _inputs(batch: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, SEQ), generator=g)
    ids[:, 0] = 2  # [CLS]
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(batch, SEQ, dtype=torch.bool),
        "token_type_ids": torch.zeros(batch, SEQ, dtype=torch.long),
    }


def _model(size: Size) -> tuple[Classifier, int]:
    cfg = build_config({"model": size.model})
    torch.manual_seed(0)
    model = build_classifier(build_pretraining_model(cfg.model, cfg.objective), 2, 0.1, 0.02).eval()
    return model, cfg.model.vocab_size


def _graphs(model: Classifier, vocab: int, size: Size, folder: Path, progress: Progress) -> dict[str, Path]:
    """Each ONNX setting's graph file, made as ``ablate export --format onnx [--quantize]`` makes it."""
    task = progress.add_task("exporting to ONNX", total=len(ONNX_SETTINGS))
    fp32 = folder / "fp32.onnx"
    to_onnx(model, fp32, _inputs(2, vocab))
    calibration = [_inputs(8, vocab, seed) for seed in range(1, size.calibration // 8 + 1)]
    rows = TaskRows("classification", dev=[], train=calibration)
    paths: dict[str, Path] = {}
    for name, how in ONNX_SETTINGS.items():
        progress.update(task, description=f"exporting: {name}")
        if how is None:
            paths[name] = fp32
        else:
            quantizer = QUANTIZERS[how]
            paths[name] = folder / f"{how}.onnx"
            quantizer.run(fp32, paths[name], rows, quantizer.bits)
        progress.advance(task)
    progress.remove_task(task)
    return paths


def _runners(model: Classifier, graphs: dict[str, Path], threads: int) -> dict[str, Callable[..., object]]:
    """Each setting's call on a batch, at ``threads`` threads."""
    sessions = {name: session(path, threads) for name, path in graphs.items()}

    def pytorch(batch: dict[str, torch.Tensor]) -> object:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            return model(batch)

    runners: dict[str, Callable[..., object]] = {TORCH: pytorch}
    for name, sess in sessions.items():
        runners[name] = lambda batch, s=sess: s.run(None, feed(batch))
    return runners


def _time(runners: dict[str, Callable[..., object]], batch: dict[str, torch.Tensor], rounds: int) -> dict[str, float]:
    """Milliseconds per call: each setting once per round, in turns (one warm-up round first); medians."""
    took: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(rounds + 1):
        for name, call in runners.items():
            start = time.perf_counter()
            call(batch)
            if r > 0:
                took[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(ms) for name, ms in took.items()}


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    size = SIZES["smoke" if args.smoke else "full"]
    cores = os.cpu_count() or 1
    model, vocab = _model(size)
    with tempfile.TemporaryDirectory(prefix="ablate-bench-deploy-") as tmp:
        graphs = _graphs(model, vocab, size, Path(tmp), progress)
        ms: dict[tuple[int, int], dict[str, float]] = {}  # (threads, batch) -> setting -> ms
        thread_counts = sorted({1, cores})
        task = progress.add_task("timing", total=len(thread_counts) * len(BATCHES))
        for threads in thread_counts:
            runners = _runners(model, graphs, threads)
            for batch in BATCHES:
                progress.update(task, description=f"timing: {threads} thread(s), batch {batch}")
                ms[threads, batch] = _time(runners, _inputs(batch, vocab), size.rounds[batch])
                progress.advance(task)
        progress.remove_task(task)
    flags = cpu_flags()
    which = "bert-base-sized (H 768, L 12, A 12, FFN 3072, V 30522)" if not args.smoke else "tiny (--smoke)"
    lines = [
        f"### deploy: a {which} classifier, sequence length {SEQ}, random weights",
        "",
        "- instruction sets: " + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in flags.items()),
        f"- threads: 1 and {cores} (every core); ONNX Runtime {_ort_version()}, all graph optimizations; "
        f"medians of {size.rounds[1]} rounds (batch 1) and {size.rounds[32]} (batch 32), settings timed in turns",
        "",
        "| setting | threads | batch 1 ms | x PyTorch fp32 | batch 32 ms | x PyTorch fp32 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for threads in thread_counts:
        for name in ms[threads, 1]:
            one, many = ms[threads, 1][name], ms[threads, 32][name]
            base1, base32 = ms[threads, 1][TORCH], ms[threads, 32][TORCH]
            lines.append(f"| {name} | {threads} | {one:.2f} | {base1 / one:.2f}x | {many:.1f} | {base32 / many:.2f}x |")
    top = ms[cores, 32]
    ratio = top[TORCH] / top["ONNX Runtime dynamic int8"]
    ok = args.smoke or ratio >= TARGET
    lines += [
        "",
        f"- ONNX Runtime fp32 over PyTorch fp32, batch 32, {cores} threads: "
        f"{top[TORCH] / top['ONNX Runtime fp32']:.2f}x",
        f"- int8 over ONNX Runtime fp32, batch 32, {cores} threads: "
        f"{top['ONNX Runtime fp32'] / top['ONNX Runtime dynamic int8']:.2f}x",
        f"- 4-bit over ONNX Runtime fp32, batch 32, {cores} threads: "
        f"{top['ONNX Runtime fp32'] / top['ONNX Runtime 4-bit (MatMulNBits)']:.2f}x",
        f"- target: ONNX Runtime dynamic int8 at least {TARGET}x PyTorch fp32 at batch 32, {cores} threads: "
        + ("not checked (--smoke)" if args.smoke else mark(ok)),
        f"int8 over PyTorch fp32, batch 32: {ratio:.2f}x",
    ]
    return lines, ok


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)
