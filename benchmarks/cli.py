"""``ablate bench [train|precision|data|pruning|loop|study STUDY.yaml]``: run a benchmark, print its table, and
optionally write it as markdown (``--out``). While it runs it says what it is doing on stderr
(:mod:`ablate.benchmarks.status`: live on a terminal, plain lines otherwise)."""

from __future__ import annotations

import argparse
import os
import platform
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ablate.benchmarks.cases import CASES
from ablate.benchmarks.finetune_tasks import DEFAULT_TASK, TASKS
from ablate.benchmarks.status import progress_for
from ablate.lightning_modules.config import paths
from ablate.lightning_modules.config.errors import ConfigError

if TYPE_CHECKING:  # torch is imported by the benchmarks themselves: `ablate --help` answers without it
    import torch

SUITES = ("train", "precision", "data", "pruning", "loop", "study", "deploy")
REGIMES = ("pretrain", "distill", "prune", "finetune")
SST2_ENV = "ABLATE_SST2"  # a GLUE SST-2 folder (train.tsv, validation.tsv) for `ablate bench loop --regime finetune`
console = Console(highlight=False, soft_wrap=True)  # the tables: stdout
status = Console(stderr=True, highlight=False, soft_wrap=True)  # what the bench is doing: stderr


def positive_int(text: str) -> int:
    """argparse type: an integer above 0 (``error: --steps: must be a positive integer, got 0``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def device_name(text: str) -> str:
    """argparse type: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, and present on this machine."""
    name = text.strip().lower()
    if name in ("auto", "cpu"):
        return name
    if not re.fullmatch(r"cuda(:\d+)?|mps", name):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N, mps or auto, got {text!r}")
    import torch

    if name == "mps":
        if not torch.backends.mps.is_available():
            raise argparse.ArgumentTypeError("mps: no MPS device on this machine")
        return name
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(name.partition(":")[2] or 0)
    if index >= count:
        have = f"{count} CUDA device{'s' * (count != 1)}" if count else "no CUDA device"
        raise argparse.ArgumentTypeError(f"{name}: this machine has {have}")
    return name


def output_file(text: str) -> Path:
    """argparse type: a file that can be written (checked before a benchmark runs, not after)."""
    try:
        return paths.output_file(text, "--out")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--out: ")) from None


def sst2_folder(text: str) -> Path:
    """argparse type: a folder holding GLUE SST-2's ``train.tsv`` and ``validation.tsv``."""
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a folder (expected one with train.tsv and validation.tsv)")
    missing = [name for name in ("train.tsv", "validation.tsv") if not (folder / name).is_file()]
    if missing:
        raise argparse.ArgumentTypeError(f"{text}: no {' or '.join(missing)} in it")
    return folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "suite",
        nargs="?",
        choices=SUITES,
        default="train",
        help="train: ablate vs transformers (default); precision: fp32 vs bf16 (and compile) over "
        "300 steps; data: the pipeline's tokens/s and streaming memory; pruning: a 12-trial "
        "study with and without pruning; loop: a real `ablate train` against its isolated step; study: "
        "where a study's time goes, run by run (STUDY.yaml after it); deploy: a bert-base-sized classifier as "
        "PyTorch fp32 and ONNX Runtime fp32, int8 and 4-bit, batch 1 and 32 (the onnx extra)",
    )
    parser.add_argument("study", nargs="?", default=None, help="study only: the study file (STUDY.yaml)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="study: run the study's smoke form (as `ablate sweep --smoke` makes it) instead of the study; "
        "deploy: a tiny model, two rounds",
    )
    parser.add_argument(
        "--case",
        action="append",
        choices=list(CASES),
        help="configuration(s) for train/precision/loop (default: for train, the CPU-sized cases "
        "on a CPU and the GPU-sized ones on CUDA; for loop, the regime's own: albert-tiny, distill-mini, "
        "bert-tiny, bert-tiny; one small case for precision)",
    )
    parser.add_argument("--corpus", default="norvig-big", help="corpus the batches come from (default: norvig-big)")
    parser.add_argument("--steps", type=positive_int, default=None, help="timed steps (train: 20; precision: 300)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="train, precision: also time ablate with torch.compile; loop --regime finetune: also the compiled run "
        "(both always on CUDA)",
    )
    parser.add_argument("--device", type=device_name, default="auto", help="cpu, cuda or auto (default)")
    parser.add_argument("--out", type=output_file, default=None, help="also write the tables as markdown here")
    parser.add_argument(
        "--regime",
        choices=REGIMES,
        default=None,
        help="loop only: the training run timed (default pretrain; distill: a teacher and its student; prune: "
        "schuBERT's gates; finetune: a GLUE task or SQuAD, --task)",
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default=None,
        help=f"loop --regime finetune: the task fine-tuned (default {DEFAULT_TASK}; the others are read by their "
        "hub names through the data catalog, $ABLATE_DATA_CATALOG; squad and squad_v2 train on the first "
        "questions of the dev file where the catalog maps only that)",
    )
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        help="loop --regime finetune: examples (SQuAD: windows) per step (default 32; a GPU study's SST-2 stage: 128)",
    )
    parser.add_argument(
        "--sst2",
        type=sst2_folder,
        default=None,
        help=f"loop --regime finetune: a folder with SST-2's train.tsv and validation.tsv (default: ${SST2_ENV}, "
        "else synthetic sentences)",
    )


def machine(device: torch.device) -> str:
    """The machine, as the tables state it."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu}, {torch.get_num_threads()} threads"
    return f"{where}; torch {torch.__version__}"


def run(args: argparse.Namespace) -> int:
    """Run the suite ``args.suite``; 0 when every target it checks holds, 1 otherwise."""
    warnings.filterwarnings("ignore", message=".*self.log.*")  # the step runs outside a Trainer
    warnings.filterwarnings("ignore", category=UserWarning)
    loop_only = [
        name for name, value in (("--regime", args.regime), ("--sst2", args.sst2), ("--batch", args.batch)) if value
    ]
    if args.suite != "loop" and loop_only:
        raise ConfigError(f"{loop_only[0]}: only for `ablate bench loop`")
    if args.suite != "study" and args.study is not None:
        raise ConfigError(f"{args.study}: only for `ablate bench study STUDY.yaml`")
    if args.compile and args.suite not in ("train", "precision", "loop"):
        raise ConfigError(f"--compile: not for `ablate bench {args.suite}`")
    if args.compile and args.suite == "loop" and args.regime != "finetune":
        raise ConfigError(
            "--compile: for `ablate bench loop` only with --regime finetune (pre-training compiles on CUDA)"
        )
    if args.suite not in ("study", "deploy") and args.smoke:
        raise ConfigError("--smoke: only for `ablate bench study STUDY.yaml` and `ablate bench deploy`")
    if args.suite == "deploy":
        from ablate.lightning_modules.interop.onnx_check import require_onnx

        require_onnx()  # the onnx extra: one line before anything runs
    if args.suite == "study" and args.study is None:
        raise ConfigError("ablate bench study: a study file is needed (ablate bench study STUDY.yaml)")
    for name, value in (("--task", args.task), ("--sst2", args.sst2), ("--batch", args.batch)):
        if value is not None and (args.suite != "loop" or args.regime != "finetune"):
            raise ConfigError(f"{name}: only for `ablate bench loop --regime finetune`")
    if args.sst2 is not None and args.task not in (None, DEFAULT_TASK):
        raise ConfigError(f"--sst2: only for --task {DEFAULT_TASK} (--task {args.task} reads the data catalog)")
    if args.sst2 is None and args.task in (None, DEFAULT_TASK) and os.environ.get(SST2_ENV):
        try:
            args.sst2 = sst2_folder(os.environ[SST2_ENV])
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"${SST2_ENV}: {exc}") from None
    import torch

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    from ablate.benchmarks import data_speed, deploy, loop, precision, study_bench, sweep_pruning, train_table

    suites = {
        "train": train_table.main,
        "precision": precision.main,
        "data": data_speed.main,
        "pruning": sweep_pruning.main,
        "loop": loop.main,
        "study": study_bench.main,
        "deploy": deploy.main,
    }
    if args.suite == "loop":
        loop.chosen(args, device)  # a case the regime cannot run: one line, before anything runs
    with progress_for(status) as progress:
        lines, ok = suites[args.suite](args, device, progress)
    text = "\n".join([f"Machine: {machine(device)}", "", *lines])
    console.print(text, markup=False)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        console.print(f"written to {args.out}")
    return 0 if ok else 1
