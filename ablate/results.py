"""What the commands that read finished runs do (:mod:`ablate.parsers` reads the command line and calls one):
report (a study's trials, or an experiment's train runs), export and predict. Each imports what it runs when
it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ablate.lightning_modules.config.errors import ConfigError


def cmd_report(args: argparse.Namespace) -> None:
    from ablate.lightning_modules.config.paths import output_folder
    from ablate.reports.build import build_report, latency_columns, render_console
    from ablate.reports.target import resolve_target
    from ablate.sweeps.engine import tracking

    if Path(args.spec).is_file():  # a run config is named as such
        from ablate.kinds import check_kind

        check_kind(args.spec, "report", also=("study",), hint="; its runs' report: ablate report experiment NAME")
    target = resolve_target(args.spec, args.study)  # a study, report file, shipped report or shipped study
    uri = tracking.resolve_tracking_uri(args.tracking_uri or target.tracking_uri, target.root)  # read, not created
    out = Path(args.out) if args.out else Path(target.root) / "reports" / target.study
    output_folder(out, "--out")  # before the store is read
    remeasure = args.remeasure if args.remeasure is not None else bool(latency_columns(target.report))
    result = build_report(
        target.report, target.study, uri, out, remeasure=remeasure, expected=target.expected, sweep=target.sweep
    )
    render_console(result)
    tables = [path.name for path in result.files if path not in result.plots]
    n = len(result.plots)
    plots = [f"{n} plot" + ("s" if n > 1 else "")] if n else []
    print(f"report written to {out.resolve()}/ ({', '.join(tables + plots)})")
    _ui_hint(uri, study=target.study)


def cmd_report_experiment(args: argparse.Namespace) -> None:
    """``ablate report experiment NAME [--tag KEY=VALUE ...]``: the experiment's ``ablate train`` runs."""
    from ablate.lightning_modules.config.paths import output_folder
    from ablate.lightning_modules.config.run import DEFAULT_ROOT
    from ablate.reports.build import render_console
    from ablate.reports.experiment import build_experiment_report
    from ablate.sweeps.engine import tracking

    where = {}
    for text in args.tag:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--tag {text!r}: expected KEY=VALUE (a run's tag or param), e.g. model.sharing=all")
        where[key.strip()] = value
    uri = tracking.resolve_tracking_uri(args.tracking_uri, DEFAULT_ROOT)  # read, not created
    out = Path(args.out) if args.out else Path(DEFAULT_ROOT) / "reports" / f"experiment-{args.experiment}"
    output_folder(out, "--out")  # before the store is read
    result = build_experiment_report(args.experiment, where, uri, out)
    render_console(result)
    print(f"report written to {out.resolve()}/ (report.md, report.tex, report.csv, runs.csv)")
    _ui_hint(uri)


def cmd_export(args: argparse.Namespace) -> None:
    from ablate.lightning_modules.config.paths import output_folder
    from ablate.lightning_modules.config.run import DEFAULT_ROOT
    from ablate.sweeps.engine import tracking
    from ablate.sweeps.engine.onnx_run import check_onnx_request
    from ablate.sweeps.engine.weights import RUNS, export_run

    check_onnx_request(args.format, args.quantize)  # the onnx extra, --quantize: before anything
    out = output_folder(args.out_dir, "out_dir", empty=True)  # before downloading anything
    if args.private and not args.push_to_hub:
        raise ConfigError("--private: only with --push-to-hub REPO")
    api = None
    if args.push_to_hub:
        from ablate.lightning_modules.interop.hub import hub_api

        api = hub_api(args.push_to_hub)  # no package, bad repo id or no token: before exporting
    run_id = args.run.removeprefix(RUNS).strip("/")
    uri = tracking.resolve_tracking_uri(args.tracking_uri, DEFAULT_ROOT)
    labels = [name.strip() for name in args.labels.split(",")] if args.labels is not None else None
    if args.format == "onnx":
        from ablate.sweeps.engine.onnx_run import export_run_onnx

        onnx = export_run_onnx(uri, run_id, out, quantize=args.quantize, labels=labels)
        what = f"onnx format, {onnx.quantize or 'fp32'}"  # a quantized run's own form when none was asked
        print(f"run {run_id} exported to {out.resolve()}/ ({what}; {onnx.describe()})")
    else:
        written = export_run(uri, run_id, out, format=args.format, repo=args.push_to_hub, labels=labels)
        extra = "; a fine-tuned sequence classifier" if written.classifier else ""
        extra += "" if written.tokenizer else "; no tokenizer: the run logged none"
        print(f"run {run_id} exported to {out.resolve()}/ ({written.format} format{extra})")
    if api is not None:
        from ablate.lightning_modules.interop.hub import push_to_hub

        print(f"pushed to {push_to_hub(api, out, args.push_to_hub, private=args.private)}")


def cmd_predict(args: argparse.Namespace) -> None:
    """``ablate predict``: a fine-tuning run's predictions for a file of its task
    (:mod:`ablate.sweeps.engine.predict`)."""
    from ablate.lightning_modules.config.run import DEFAULT_ROOT
    from ablate.sweeps.engine import tracking
    from ablate.sweeps.engine.predict import predict_run
    from ablate.sweeps.engine.weights import RUNS

    run_id = args.run.removeprefix(RUNS).strip("/")
    uri = tracking.resolve_tracking_uri(args.tracking_uri, DEFAULT_ROOT)
    done = predict_run(uri, run_id, args.file, Path(args.out) if args.out is not None else None)
    print(f"{done.rows} predictions of run {run_id} ({done.task}) written to {done.path.resolve()}")


def _ui_hint(uri: str, *, study: str | None = None) -> None:
    from ablate.mlflow_ui import hint

    print("\n".join(hint(uri, study=study)))
