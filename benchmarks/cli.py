"""``ablate bench BENCH``: run one benchmark (:data:`BENCHES`: each with its own options and ``--help``),
print its table, and optionally write it as markdown (``--out``). While it runs it says what it is doing on
stderr (:mod:`ablate.benchmarks.status`: live on a terminal, plain lines otherwise)."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
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
    from rich.progress import Progress

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


Option = Callable[[argparse.ArgumentParser], object]
"""One option of a bench: added to the parser of each bench that lists it."""
Main = Callable[["argparse.Namespace", "torch.device", "Progress"], tuple[list[str], bool]]


def _cases(default: str, many: bool = True) -> Option:
    what = "configuration(s) timed; repeatable" if many else "the configuration timed"
    return lambda p: p.add_argument("--case", action="append", choices=list(CASES), help=f"{what} (default: {default})")


def _steps(what: str) -> Option:
    return lambda p: p.add_argument("--steps", type=positive_int, default=None, metavar="N", help=what)


def _compile(what: str) -> Option:
    return lambda p: p.add_argument("--compile", action="store_true", help=what)


def _smoke(what: str) -> Option:
    return lambda p: p.add_argument("--smoke", action="store_true", help=what)


def _device(what: str) -> Option:
    return lambda p: p.add_argument("--device", type=device_name, default="auto", metavar="DEVICE", help=what)


def _corpus(p: argparse.ArgumentParser) -> object:
    return p.add_argument("--corpus", default="norvig-big", help="corpus the batches come from (default: norvig-big)")


def _study(p: argparse.ArgumentParser) -> object:
    return p.add_argument("study", metavar="STUDY", help="the study file (STUDY.yaml)")


def _loop_only(p: argparse.ArgumentParser) -> object:
    """``bench loop``'s own options: the regime timed, and a fine-tuning regime's task, batch and data."""
    p.add_argument(
        "--regime",
        choices=REGIMES,
        default=None,
        help="the training run timed (default pretrain; distill: a teacher and its student; prune: schuBERT's "
        "gates; finetune: a GLUE task or SQuAD, --task)",
    )
    p.add_argument(
        "--task",
        choices=TASKS,
        default=None,
        help=f"with --regime finetune: the task fine-tuned (default {DEFAULT_TASK}; the others are read by their "
        "hub names through the data catalog, $ABLATE_DATA_CATALOG; squad and squad_v2 train on the first "
        "questions of the dev file where the catalog maps only that)",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --regime finetune: examples (SQuAD: windows) per step (default 32; a GPU study's SST-2 stage: 128)",
    )
    return p.add_argument(
        "--sst2",
        type=sst2_folder,
        default=None,
        metavar="DIR",
        help=f"with --regime finetune: a folder with SST-2's train.tsv and validation.tsv (default: ${SST2_ENV}, "
        "else synthetic sentences)",
    )


def _nothing(args: argparse.Namespace) -> None:
    """A bench whose options need no check beyond their types."""


def _loop_check(args: argparse.Namespace) -> None:
    """``bench loop``: the options that only a fine-tuning regime reads, and its data folder (given, or
    ``$ABLATE_SST2``)."""
    if len(args.case or []) > 1:
        raise ConfigError("--case: `ablate bench loop` times one case")
    if args.compile and args.regime != "finetune":
        raise ConfigError(
            "--compile: for `ablate bench loop` only with --regime finetune (pre-training compiles on CUDA)"
        )
    for name, value in (("--task", args.task), ("--sst2", args.sst2), ("--batch", args.batch)):
        if value is not None and args.regime != "finetune":
            raise ConfigError(f"{name}: only for `ablate bench loop --regime finetune`")
    if args.sst2 is not None and args.task not in (None, DEFAULT_TASK):
        raise ConfigError(f"--sst2: only for --task {DEFAULT_TASK} (--task {args.task} reads the data catalog)")
    if args.sst2 is None and args.task in (None, DEFAULT_TASK) and os.environ.get(SST2_ENV):
        try:
            args.sst2 = sst2_folder(os.environ[SST2_ENV])
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"${SST2_ENV}: {exc}") from None


def _onnx(args: argparse.Namespace) -> None:
    from ablate.lightning_modules.interop.onnx_check import require_onnx

    require_onnx()  # the onnx extra: one line before anything runs


def _loop_case(args: argparse.Namespace, device: torch.device) -> None:
    from ablate.benchmarks.loop import chosen

    chosen(args, device)  # a case the regime cannot run, a task that cannot be read: one line, before anything runs


def _anywhere(args: argparse.Namespace, device: torch.device) -> None:
    """A bench that runs whatever the device."""


@dataclass(frozen=True)
class Bench:
    """One ``ablate bench`` command: what it times, the module whose ``main`` runs it, its options (``--out``
    besides), a check of their combination before torch is imported and one once the device is known."""

    help: str
    module: str
    options: tuple[Option, ...]
    check: Callable[[argparse.Namespace], None] = _nothing
    ready: Callable[[argparse.Namespace, torch.device], None] = _anywhere

    def main(self) -> Main:
        main: Main = importlib.import_module(f"ablate.benchmarks.{self.module}").main
        return main


DEVICE = _device("cpu, cuda, cuda:N, mps or auto (default: cuda when there is one)")
BENCHES: dict[str, Bench] = {
    "train": Bench(
        "ablate vs transformers: the same model, weights and batches, alternated in one process",
        "train_table",
        (
            _cases("the CPU-sized cases on a CPU, the GPU-sized ones on CUDA"),
            _corpus,
            _steps("timed steps (default 20)"),
            _compile("also time ablate and transformers in torch.compile (always on CUDA)"),
            DEVICE,
        ),
    ),
    "precision": Bench(
        "fp32 vs bf16 (and torch.compile) over the same batches, ablate only",
        "precision",
        (
            _cases("albert-tiny on a CPU, bert-small on CUDA"),
            _corpus,
            _steps("steps (default 300)"),
            _compile("also time ablate in torch.compile"),
            DEVICE,
        ),
    ),
    "data": Bench(
        "the data pipeline's tokens/s, the loader's wait and the memory of streaming shards",
        "data_speed",
        (_corpus, _steps("steps of the training run whose loader wait is measured (default 200)")),
    ),
    "pruning": Bench(
        "a 12-trial study with and without Optuna pruning: the wall time pruning saves",
        "sweep_pruning",
        (_corpus, _steps("training steps of each trial (default 300)")),
    ),
    "loop": Bench(
        "a real `ablate train` (Lightning loop, streamed data, MLflow) against its isolated step, per regime",
        "loop",
        (
            _cases("the regime's own: on a CPU albert-tiny, distill-mini, bert-tiny, bert-tiny", many=False),
            _corpus,
            _steps("timed steps (default 40 on a CPU, 300 on CUDA)"),
            _compile("with --regime finetune: also the compiled run (always on CUDA)"),
            DEVICE,
            _loop_only,
        ),
        check=_loop_check,
        ready=_loop_case,
    ),
    "study": Bench(
        "where a study's time goes, run by run (start-up, steps, validation, teardown)",
        "study_bench",
        (
            _study,
            _smoke("run the study's smoke form (as `ablate sweep smoke` makes it) instead of the study"),
            _device("cpu, cuda, cuda:N or mps: every run's trainer.accelerator (default: each run's own)"),
        ),
    ),
    "deploy": Bench(
        "a bert-base-sized classifier as PyTorch fp32 and ONNX Runtime fp32, int8 and 4-bit, batch 1 and 32 "
        "(the onnx extra)",
        "deploy",
        (_smoke("a tiny model, two rounds (its figures mean nothing)"),),
        check=_onnx,
    ),
}
"""Every bench, by name: ``ablate bench NAME`` (``ablate bench`` alone: ``train``)."""


def add_benches(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each of :data:`BENCHES` as a subcommand of ``parser``, with its options and ``--out``; by name."""
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True, title="benches")
    out = {}
    for name, bench in BENCHES.items():
        p = sub.add_parser(name, help=bench.help, description=f"{bench.help[0].upper()}{bench.help[1:]}.")
        for option in bench.options:
            option(p)
        p.add_argument(
            "--out", type=output_file, default=None, metavar="FILE", help="also write the tables as markdown here"
        )
        p.set_defaults(suite=name)
        out[name] = p
    return out


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
    """Run the bench ``args.suite``; 0 when every target it checks holds, 1 otherwise."""
    bench = BENCHES[args.suite]
    warnings.filterwarnings("ignore", message=".*self.log.*")  # the step runs outside a Trainer
    warnings.filterwarnings("ignore", category=UserWarning)
    bench.check(args)
    import torch

    where = getattr(args, "device", "auto")  # a bench without --device: wherever it runs
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if where == "auto" else where)
    bench.ready(args, device)
    main = bench.main()
    with progress_for(status) as progress:
        lines, ok = main(args, device, progress)
    text = "\n".join([f"Machine: {machine(device)}", "", *lines])
    console.print(text, markup=False)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        console.print(f"written to {args.out}")
    return 0 if ok else 1
