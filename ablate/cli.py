"""The ``ablate`` command line: params, train, sweep, report, export, predict, bench (what each does is in
:mod:`ablate.commands`).

Errors a user can cause end with one line ``error: ...`` and exit status 2; SIGINT and SIGTERM with
the signal's status (130, 143) and what resumes the work.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys

from ablate.benchmarks.cli import positive_int
from ablate.commands import cmd_export, cmd_params, cmd_report, cmd_sweep, cmd_train
from ablate.lightning_modules.config.errors import AblateError
from ablate.sweeps.engine.interrupt import Interrupted

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parser() -> argparse.ArgumentParser:
    from ablate.reports.catalog import names as report_names

    p = argparse.ArgumentParser(
        prog="ablate", description="BERT compression ablations: params, train, sweep, report, export, predict."
    )
    p.add_argument("--version", action="version", version=f"ablate {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("params", help="parameter counts and FLOPs/token of a preset or config")
    s.add_argument("target", help="preset name or CONFIG.yaml")
    s.add_argument("overrides", nargs="*", help="key=value, e.g. model.sharing=none")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument(
        "--measure",
        action="store_true",
        help="also build the model and measure encoder latency (batch 1, 32) and train activation memory",
    )
    s.set_defaults(func=cmd_params)
    s = sub.add_parser("train", help="train one config as one MLflow run")
    s.add_argument("config", nargs="?", help="CONFIG.yaml or a preset name (with --resume: the run's own)")
    s.add_argument("overrides", nargs="*", help="key=value")
    s.add_argument("--tracking-uri", help="MLflow tracking URI (default: ./ablate-runs/mlflow.db)")
    s.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    s.add_argument(
        "--print-plan", action="store_true", help="print the run's phases and finishers (what it will do) and exit"
    )
    s.add_argument("--resume", metavar="RUN_ID", help="continue a killed or failed run from its last checkpoint")
    s.add_argument(
        "--checkpoints", help="where last.ckpt and best.ckpt go: a folder, an fsspec URL or mlflow (artifacts)"
    )
    s.set_defaults(func=cmd_train)
    s = sub.add_parser("sweep", help="run (or resume) a study as an Optuna sweep")
    s.add_argument("study", help="STUDY.yaml")
    s.add_argument(
        "overrides",
        nargs="*",
        help="key=value: set a config field in the study's base (every trial), e.g. trainer.max_steps=50; not a "
        "searched field; the changed study is a study of its own, named STUDY-<digest> (or name=NEW)",
    )
    s.add_argument("--n-trials", type=positive_int, help="run at most this many more trials")
    s.add_argument("--storage", help="Optuna storage URL (default: sqlite in ./ablate-runs)")
    s.add_argument("--tracking-uri", help="MLflow tracking URI")
    s.add_argument("--check", action="store_true", help="validate the study (every trial's config, tasks, report) only")
    s.add_argument(
        "--print-config", action="store_true", help="print the config of the study's first grid point as YAML and exit"
    )
    s.add_argument(
        "--smoke",
        action="store_true",
        help="run every arm, task, teacher and phase of the study for a few steps on a little data, in "
        "<tracking.root>/smoke/STUDY (a GPU study on a machine without one: its models built on the meta device)",
    )
    s.set_defaults(func=cmd_sweep)
    s = sub.add_parser(
        "report", help="regenerate a study's table and plots from MLflow (or tabulate an experiment's train runs)"
    )
    s.add_argument(
        "spec",
        metavar="TARGET",
        nargs="?",
        help="STUDY.yaml, REPORT.yaml, a shipped report (" + ", ".join(report_names()) + ") or a shipped study "
        "(quickstart, ...)",
    )
    s.add_argument("--study", help="the study (MLflow experiment) to read; default: the spec's")
    s.add_argument(
        "--experiment",
        metavar="NAME",
        help="instead of TARGET: the ablate train runs of this MLflow experiment (tracking.experiment; default "
        "ablate), one row each: its varying config fields and its final metrics",
    )
    s.add_argument(
        "--tag",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="with --experiment: only runs with this tag or param (model.sharing=all); repeatable",
    )
    s.add_argument("--out", help="output folder (default: ./ablate-runs/reports/STUDY)")
    s.add_argument("--tracking-uri", help="MLflow tracking URI")
    s.add_argument(
        "--remeasure",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time every run's model again as it is deployed (ONNX Runtime for a fine-tuned model, PyTorch "
        "otherwise; one thread and every thread), in one process, and show those latencies: the default where the "
        "report shows a latency; --no-remeasure: the latencies the runs logged while they trained",
    )
    s.set_defaults(func=cmd_report)
    s = sub.add_parser(
        "export",
        help="export a run's trained weights, tokenizer and model card (a transformers model when expressible; "
        "a fine-tuning run's classifier as a sequence classifier)",
    )
    s.add_argument("run", help="MLflow run id or runs:/RUN_ID (the run must have saved its model/ artifacts)")
    s.add_argument("out_dir", help="new or empty output folder")
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
    s.add_argument("--tracking-uri", help="MLflow tracking URI (default: ./ablate-runs/mlflow.db)")
    s.add_argument(
        "--labels",
        metavar="NAME,NAME,...",
        help="a classifier's class names in label-id order, as its id2label (default: the run's "
        "finetune.label_names, else LABEL_0, LABEL_1, ...)",
    )
    s.add_argument("--push-to-hub", metavar="REPO", help="then upload the folder to this Hugging Face Hub repo")
    s.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    s.set_defaults(func=cmd_export)
    s = sub.add_parser(
        "predict",
        help="a fine-tuning run's model predicts a file of its task: GLUE's submission TSV (index, prediction), "
        "or SQuAD's predictions.json",
    )
    s.add_argument("run", help="MLflow run id or runs:/RUN_ID of a fine-tuning run (its model/ artifacts)")
    s.add_argument(
        "file",
        help="a file of the run's task: .tsv/.csv/.json/.jsonl with its text columns (labels not needed), "
        "or a SQuAD JSON",
    )
    s.add_argument(
        "--out",
        metavar="PATH",
        help="the file to write (default: GLUE's submission name, SST-2.tsv, RTE.tsv, ...; <task>.tsv; "
        "predictions.json for SQuAD)",
    )
    s.add_argument("--tracking-uri", help="MLflow tracking URI (default: ./ablate-runs/mlflow.db)")
    s.set_defaults(func=cmd_predict)
    s = sub.add_parser("bench", help="benchmarks: ablate vs transformers, precision, data pipeline, pruning")
    from ablate.benchmarks.cli import add_arguments

    add_arguments(s)
    s.set_defaults(func=cmd_bench)
    return p


def cmd_bench(args: argparse.Namespace) -> int | None:
    """``ablate bench``: a study given to ``bench study`` is checked to be one first (a config or a
    report spec is named as such), then the suite runs."""
    from ablate.benchmarks.cli import run

    if getattr(args, "suite", None) == "study" and args.study is not None:
        from ablate.kinds import check_kind

        check_kind(args.study, "study")
    return run(args)


def cmd_predict(args: argparse.Namespace) -> None:
    """``ablate predict``: a fine-tuning run's predictions for a file of its task
    (:mod:`ablate.sweeps.engine.predict`)."""
    from pathlib import Path

    from ablate.lightning_modules.config.run import DEFAULT_ROOT
    from ablate.sweeps.engine import tracking
    from ablate.sweeps.engine.predict import predict_run
    from ablate.sweeps.engine.weights import RUNS

    run_id = args.run.removeprefix(RUNS).strip("/")
    uri = tracking.resolve_tracking_uri(args.tracking_uri, DEFAULT_ROOT)
    done = predict_run(uri, run_id, args.file, Path(args.out) if args.out is not None else None)
    print(f"{done.rows} predictions of run {run_id} ({done.task}) written to {done.path.resolve()}")


def _version() -> str:
    """The installed ablate's version (``unknown`` when it runs from a tree that was not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ablate")
    except PackageNotFoundError:
        return "unknown"


class UsageError(Exception):
    """A command line argparse refuses, as one line (without argparse's usage block)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``parser().parse_args``; a usage error raises :class:`UsageError`, one line naming the option:
    ``--n-trials: must be a positive integer, got 0``. ``--help`` still exits (status 0)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        found = re.match(r"^(.*?): error: (.*)$", lines[-1]) if lines else None
        if found is None:
            raise UsageError(" ".join(lines) or "invalid command line (see ablate --help)") from None
        prog, message = found.groups()
        if message.startswith("argument "):  # argument --n-trials: must be ...
            raise UsageError(message.removeprefix("argument ")) from None
        raise UsageError(f"{prog}: {message} (see {prog} --help)") from None
    sys.stderr.write(captured.getvalue())
    return args


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (a message is one line by rule; a multi-line one is joined)."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ablate.process import prepare

    prepare()  # all that ablate changes in its process, once, here (library notes hidden too)
    try:
        code = args.func(args)  # None, or a benchmark's 1 when a target was missed
    except AblateError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Interrupted as stop:  # SIGINT or SIGTERM: the runs it stopped are KILLED, with the signal as reason
        print(f"\ninterrupted by {stop.name}: {stop.advice or 'no run was left RUNNING'}", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:  # before the handlers were installed
        print("\ninterrupted by SIGINT", file=sys.stderr)
        return 130
    except Exception as exc:  # what no check foresaw: still one line (its run is FAILED, the reason tagged)
        if os.environ.get("ABLATE_TRACEBACK"):
            raise
        first = _one_line(exc)
        print(f"error: {type(exc).__name__}: {first} (ABLATE_TRACEBACK=1 shows where)", file=sys.stderr)
        return 2
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
