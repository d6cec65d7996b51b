"""The ``ablate`` command line as argparse parsers: every command, and every mode of a command (``sweep
check``, ``report experiment``, ``bench loop``), a subcommand with only the options it reads and its own
``--help``; the store options from one parent parser. A usage error raises :class:`UsageError`, one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import NoReturn

from ablate.benchmarks.cli import add_benches, positive_int
from ablate.commands import (
    cmd_bench,
    cmd_params,
    cmd_sweep,
    cmd_sweep_check,
    cmd_sweep_print_config,
    cmd_sweep_smoke,
    cmd_train,
    cmd_train_print_config,
    cmd_train_print_plan,
)
from ablate.results import cmd_export, cmd_predict, cmd_report, cmd_report_experiment

Command = Callable[[argparse.Namespace], int | None]
"""What a command or mode does (:mod:`ablate.commands`, :mod:`ablate.results`): None or an exit status."""


class UsageError(Exception):
    """A command line argparse refuses, as one line (without argparse's usage block)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise :class:`UsageError`: ``--n-trials: must be a positive integer,
    got 0``; ``ablate sweep: the following arguments are required: STUDY (see ablate sweep --help)``."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):  # argument --n-trials: must be ...
            raise UsageError(message.removeprefix("argument "))
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _add(
    sub: argparse._SubParsersAction[Parser],
    name: str,
    help: str,
    func: Command | None = None,
    *,
    prog: str | None = None,
    parents: tuple[Parser, ...] = (),
    was: str = "",
) -> Parser:
    """A command or mode: its one-line ``help`` in its parent's list and as its description (``was``: the
    old spelling it still accepts); ``func`` runs it (None: a command of modes)."""
    description = help[0].upper() + help[1:] + "." + (f" Also spelled {was}." if was else "")
    p = sub.add_parser(name, help=help, description=description, prog=prog, parents=list(parents))
    if func is not None:
        p.set_defaults(func=func, leaf=p.prog)
    return p


def _modes(p: Parser, what: str) -> argparse._SubParsersAction[Parser]:
    return p.add_subparsers(dest="mode", metavar="MODE", required=True, title="modes", description=what)


def _overrides(p: argparse.ArgumentParser, what: str = "key=value, e.g. model.sharing=none") -> None:
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value", help=what)


def _params(sub: argparse._SubParsersAction[Parser]) -> None:
    s = _add(sub, "params", "parameter counts and FLOPs/token of a preset or config", cmd_params)
    s.add_argument("target", metavar="PRESET|CONFIG.yaml", help="preset name or CONFIG.yaml")
    _overrides(s)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument(
        "--measure",
        action="store_true",
        help="also build the model and measure encoder latency (batch 1, 32) and train activation memory",
    )


def _train(sub: argparse._SubParsersAction[Parser], store: Parser) -> None:
    modes = _modes(
        _add(sub, "train", "train one config as one MLflow run (or print its config or plan)"),
        "ablate train CONFIG trains it (ablate train run CONFIG, the same); the others print and exit",
    )
    s = _add(modes, "run", "train one config as one MLflow run", cmd_train, prog="ablate train", parents=(store,))
    s.add_argument("config", nargs="?", metavar="CONFIG", help="CONFIG.yaml or a preset name (with --resume: optional)")
    _overrides(s)
    s.add_argument(
        "--resume",
        metavar="RUN_ID",
        nargs="?",
        const="",
        help="continue a killed or failed run from its last checkpoint (no RUN_ID: list the store's stopped runs)",
    )
    s.add_argument(
        "--checkpoints",
        metavar="WHERE",
        help="where last.ckpt and best.ckpt go: a folder, an fsspec URL or mlflow (artifacts)",
    )
    for name, what, func in (
        ("print-config", "print the resolved config as YAML and exit", cmd_train_print_config),
        ("print-plan", "print the run's phases and finishers (what it will do) and exit", cmd_train_print_plan),
    ):
        s = _add(modes, name, what, func, was=f"ablate train CONFIG --{name}")
        s.add_argument("config", metavar="CONFIG", help="CONFIG.yaml or a preset name")
        _overrides(s)


STUDY_OVERRIDES = (
    "set a config field in the study's base (every trial), e.g. trainer.max_steps=50; not a searched field; the "
    "changed study is a study of its own, named STUDY-<digest> (or name=NEW)"
)


def _sweep(sub: argparse._SubParsersAction[Parser], store: Parser) -> None:
    modes = _modes(
        _add(sub, "sweep", "run (or resume) a study as an Optuna sweep; or check, smoke-run or print it"),
        "ablate sweep STUDY runs it (ablate sweep run STUDY, the same)",
    )
    s = _add(
        modes, "run", "run (or resume) a study as an Optuna sweep", cmd_sweep, prog="ablate sweep", parents=(store,)
    )
    s.add_argument("study", metavar="STUDY", help="STUDY.yaml")
    _overrides(s, STUDY_OVERRIDES)
    s.add_argument("--n-trials", type=positive_int, metavar="N", help="run at most this many more trials")
    s.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: sqlite in ./ablate-runs)")
    for name, what, func in (
        (
            "check",
            "validate the study (every trial's config, tasks, report) and estimate its time; run nothing",
            cmd_sweep_check,
        ),
        (
            "smoke",
            "run every arm, task, teacher and phase of the study for a few steps on a little data, in "
            "<tracking.root>/smoke/STUDY (a GPU study on a machine without one: its models built on the meta device)",
            cmd_sweep_smoke,
        ),
        ("print-config", "print the config of the study's first grid point as YAML and exit", cmd_sweep_print_config),
    ):
        s = _add(modes, name, what, func, was=f"ablate sweep STUDY --{name}")
        s.add_argument("study", metavar="STUDY", help="STUDY.yaml")
        _overrides(s, STUDY_OVERRIDES)


def _report(sub: argparse._SubParsersAction[Parser], store: Parser) -> None:
    from ablate.reports.catalog import names

    modes = _modes(
        _add(
            sub, "report", "regenerate a study's table and plots from MLflow (or tabulate an experiment's train runs)"
        ),
        "ablate report TARGET reports a study's trials (ablate report study TARGET, the same)",
    )
    s = _add(
        modes,
        "study",
        "regenerate a study's table and plots from its trials in MLflow",
        cmd_report,
        prog="ablate report",
        parents=(store,),
    )
    s.add_argument(
        "spec",
        metavar="TARGET",
        help=f"STUDY.yaml, REPORT.yaml, a shipped report ({', '.join(names())}) or a shipped study (quickstart, ...)",
    )
    s.add_argument("--study", metavar="NAME", help="the study (MLflow experiment) to read; default: the spec's")
    s.add_argument("--out", metavar="DIR", help="output folder (default: ./ablate-runs/reports/STUDY)")
    s.add_argument(
        "--remeasure",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time every run's model again as it is deployed (ONNX Runtime for a fine-tuned model, PyTorch "
        "otherwise; one thread and every thread), in one process, and show those latencies: the default where the "
        "report shows a latency; --no-remeasure: the latencies the runs logged while they trained",
    )
    s = _add(
        modes,
        "experiment",
        "tabulate the ablate train runs of an MLflow experiment: one row each, its varying config fields and its "
        "final metrics",
        cmd_report_experiment,
        parents=(store,),
        was="ablate report --experiment NAME",
    )
    s.add_argument("experiment", metavar="NAME", help="the MLflow experiment (tracking.experiment; default ablate)")
    s.add_argument(
        "--tag",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="only runs with this tag or param (model.sharing=all); repeatable",
    )
    s.add_argument("--out", metavar="DIR", help="output folder (default: ./ablate-runs/reports/experiment-NAME)")


def _export(sub: argparse._SubParsersAction[Parser], store: Parser) -> None:
    s = _add(
        sub,
        "export",
        "export a run's trained weights, tokenizer and model card (a transformers model when expressible; "
        "a fine-tuning run's classifier as a sequence classifier)",
        cmd_export,
        parents=(store,),
    )
    s.add_argument("run", metavar="RUN", help="MLflow run id or runs:/RUN_ID (the run must have saved its model/)")
    s.add_argument("out_dir", metavar="OUT_DIR", help="new or empty output folder")
    s.add_argument(
        "--format",
        choices=["auto", "transformers", "ablate", "onnx"],
        default="auto",
        help="auto (default): a transformers checkpoint when expressible, else ablate safetensors; onnx: an ONNX "
        "graph of a fine-tuned classifier or span model, checked against ablate's on the run's dev rows (the onnx "
        "extra)",
    )
    s.add_argument(
        "--quantize",
        metavar="HOW",
        help="with --format onnx: dynamic-int8, static-int8 (calibrated on the task's training rows), int4 "
        "(weight-only MatMulNBits; also weight-int2, weight-int8)",
    )
    s.add_argument(
        "--labels",
        metavar="NAME,NAME,...",
        help="a classifier's class names in label-id order, as its id2label (default: the run's "
        "finetune.label_names, else LABEL_0, LABEL_1, ...)",
    )
    s.add_argument("--push-to-hub", metavar="REPO", help="then upload the folder to this Hugging Face Hub repo")
    s.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")


def _predict(sub: argparse._SubParsersAction[Parser], store: Parser) -> None:
    s = _add(
        sub,
        "predict",
        "a fine-tuning run's model predicts a file of its task: GLUE's submission TSV (index, prediction), "
        "or SQuAD's predictions.json",
        cmd_predict,
        parents=(store,),
    )
    s.add_argument("run", metavar="RUN", help="MLflow run id or runs:/RUN_ID of a fine-tuning run (its model/)")
    s.add_argument(
        "file",
        metavar="FILE",
        help="a file of the run's task: .tsv/.csv/.json/.jsonl with its text columns (labels not needed), "
        "or a SQuAD JSON",
    )
    s.add_argument(
        "--out",
        metavar="PATH",
        help="the file to write (default: GLUE's submission name, SST-2.tsv, RTE.tsv, ...; <task>.tsv; "
        "predictions.json for SQuAD)",
    )


def _bench(sub: argparse._SubParsersAction[Parser]) -> None:
    s = _add(sub, "bench", "benchmarks: ablate vs transformers, precision, data pipeline, pruning, loop, study, deploy")
    for bench in add_benches(s).values():
        bench.set_defaults(func=cmd_bench, leaf=bench.prog)


def parser() -> Parser:
    """The whole command line: each command (and mode) with its own options."""
    p = Parser(prog="ablate")
    p.add_argument("--version", action="version", version=f"ablate {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, title="commands")
    store = Parser(add_help=False)  # the store options: one parent for every command that reads or writes one
    store.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI (default: ./ablate-runs/mlflow.db)")
    _params(sub)
    for add in (_train, _sweep, _report, _export, _predict):
        add(sub, store)
    _bench(sub)
    for leaf in leaves(p):  # every command and mode: the library notes ablate hides, shown (ablate.quiet)
        leaf.add_argument("--verbose", action="store_true", help="also show the library notes ablate hides")
    p.description = f"BERT compression ablations: {', '.join(sub.choices)}."
    return p


def _version() -> str:
    """The installed ablate's version (``unknown`` when it runs from a tree that was not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ablate")
    except PackageNotFoundError:
        return "unknown"


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``p`` by name: the commands, or a command's modes (none for a command without)."""
    subs = (a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {name: child for a in subs for name, child in a.choices.items()}


def leaves(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every command and mode of ``p`` that runs (``ablate sweep check``, ``ablate bench loop``), once each."""
    below = subcommands(p)
    if not below:
        yield p
    for child in dict.fromkeys(below.values()):
        yield from leaves(child)
