"""What each ``ablate`` command and mode does (:mod:`ablate.parsers` reads the command line and calls one):
params, train, sweep, bench; :mod:`ablate.results` the commands that read finished runs. Each imports what
it runs when it runs, so that ``ablate --help`` and a config error answer before torch is loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ablate.lightning_modules.config.errors import ConfigError
from ablate.sweeps.engine.interrupt import Interrupted

if TYPE_CHECKING:  # annotations only
    from optuna import Study
    from optuna.trial import FrozenTrial

    from ablate.lightning_modules.config.experiment import ExperimentConfig
    from ablate.lightning_modules.measure.profiling import Measured
    from ablate.reports.spec import ReportSpec
    from ablate.sweeps.base import StudyBase
    from ablate.sweeps.overrides import Overridden
    from ablate.sweeps.spec import StudySpec


def _config(target: str, overrides: list[str]) -> ExperimentConfig:
    """A config from a preset name or a YAML path, with overrides."""
    from ablate.lightning_modules.config.load import build_config, load_config, parse_overrides
    from ablate.lightning_modules.config.presets import PRESETS

    if target in PRESETS:
        return build_config({"model": {"preset": target}}, parse_overrides(overrides))
    if not target.endswith((".yaml", ".yml")) and not Path(target).exists():
        raise ConfigError(f"{target}: neither a preset ({', '.join(PRESETS)}) nor a config file")
    from ablate.kinds import check_kind

    check_kind(target, "config")  # a study or report spec is named as such
    return load_config(target, overrides)


def cmd_params(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = _config(args.target, args.overrides)  # config errors answer before torch is imported
    from ablate.lightning_modules.methods.quantization.apply import quantized_report

    report = quantized_report(cfg.model, cfg.objective, cfg.data.max_length, cfg.quant)
    measured = _measure(cfg) if args.measure else None
    if args.json:
        print(json.dumps({**report.as_dict(), **(measured.as_dict() if measured else {})}))
        return
    m = cfg.model
    table = Table(
        title=f"{args.target}: V={m.vocab_size} E={m.embed_dim} H={m.hidden_dim} L={m.num_layers} "
        f"A={m.num_heads} ffn={m.ffn_dim} F={m.num_ffn} sharing={m.sharing}"
    )
    table.add_column("part")
    table.add_column("parameters", justify="right")
    table.add_column("", justify="right")
    rows = [
        ("backbone (embeddings + encoder)", report.backbone),
        ("  embedding", report.embedding),
        ("  encoder", report.encoder),
        ("heads (not in backbone)", report.heads),
        ("  MLM head (decoder tied)", report.mlm_head),
        ("  sentence head (pooler + classifier)", report.sentence_head),
        ("backbone + pooler (ALBERT paper / HF rule)", report.paper_count),
    ]
    for name, n in rows:
        table.add_row(name, f"{n:,}", f"{n / 1e6:.2f}M")
    q = cfg.quant
    parts = [
        *([q.method] if q.method != "none" else []),
        *([f"embeddings {q.embeddings}"] if q.embeddings != "none" else []),
    ]
    stored = "stored model, bytes" + (f" ({', '.join(parts)})" if parts else " (each tensor at its dtype)")
    table.add_row(stored, f"{report.model_bytes:,}", f"{report.model_bytes / 2**20:.1f} MiB")
    table.add_row(
        f"forward FLOPs/token (T={report.seq_len})",
        f"{report.flops_per_token:,}",
        f"{report.flops_per_token / 1e6:.2f}M",
    )
    if measured:
        on = f"{measured.device}, T={report.seq_len}"
        table.add_row(f"encoder latency, batch 1 ({on})", f"{measured.latency_ms_b1:,.2f}", "ms")
        table.add_row(f"encoder latency, batch 32 ({on})", f"{measured.latency_ms_b32:,.2f}", "ms")
        if measured.train_activation_mb == measured.train_activation_mb:  # NaN for a quantized model: it does not train
            table.add_row(f"train activation memory, batch 32 ({on})", f"{measured.train_activation_mb:,.1f}", "MiB")
    Console().print(table)


def _measure(cfg: ExperimentConfig) -> Measured:
    """Build the real model on cuda (if available) or cpu and measure latency and activation memory."""
    from typing import cast

    import torch

    from ablate.lightning_modules.measure.profiling import measure
    from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_pretraining_model(cfg.model, cfg.objective).to(device)
    if cfg.quant.enabled:  # a quantized model runs on the CPU and does not train: its latency only
        from ablate.lightning_modules.measure.measuring import describe_device
        from ablate.lightning_modules.measure.profiling import Measured, measure_latencies
        from ablate.lightning_modules.methods.quantization.apply import quantize

        cpu = torch.device("cpu")
        quantized = cast(PretrainingModel, quantize(model, cfg.quant))  # the same model, its layers quantized
        lat = measure_latencies(quantized, cfg.model.vocab_size, cfg.data.max_length, cpu)
        return Measured(**lat, train_activation_mb=float("nan"), device=describe_device(cpu))
    return measure(model, cfg.model.vocab_size, cfg.data.max_length, device)


def cmd_train_print_config(args: argparse.Namespace) -> None:
    """``ablate train print-config CONFIG``: the resolved config (loadable by load_config), before torch is
    imported."""
    from ablate.lightning_modules.config.experiment import to_yaml

    print(to_yaml(_config(args.config, args.overrides)), end="")


def cmd_train_print_plan(args: argparse.Namespace) -> None:
    """``ablate train print-plan CONFIG``: the phases and finishers the config makes, nothing run; after
    every check ``ablate train`` makes before it writes (a plan that prints is a run that starts)."""
    cfg = _config(args.config, args.overrides)
    from ablate.sweeps.checks import Machine, check_run
    from ablate.sweeps.engine import runner

    check_run(cfg, None, None)  # names, folders, data files, columns and labels, sources named
    try:  # a config for another machine (a GPU profile) still prints; it says why it would not run here
        check_run(cfg, None, Machine.here())
        here = ""
    except ConfigError as exc:
        here = f" (not runnable on this machine: {exc})"
    print(f"{cfg.name}: regime {cfg.regime}{here}")
    print(runner.plan(cfg).describe())


def cmd_train(args: argparse.Namespace) -> None:
    cfg = _config(args.config, args.overrides) if args.config else None  # config errors answer before torch
    if cfg is None and args.resume is None:
        raise ConfigError("config: give CONFIG.yaml or a preset name (or --resume RUN_ID)")
    from ablate.lightning_modules.config.run import DEFAULT_ROOT
    from ablate.sweeps.checks import Machine, check_run, check_sqlite
    from ablate.sweeps.engine import checkpoints, tracking
    from ablate.sweeps.engine.context import RunContext
    from ablate.sweeps.engine.runner import train

    resume: str | bool = False
    if args.resume is not None:
        root = cfg.tracking.root if cfg is not None else DEFAULT_ROOT
        uri = tracking.resolve_tracking_uri(args.tracking_uri or (cfg.tracking.tracking_uri if cfg else None), root)
        if not args.resume:  # --resume alone: which runs it can continue
            stopped = checkpoints.stopped_runs(uri)
            where = tracking.redact(uri)
            raise ConfigError(
                f"--resume: give a run id; stopped runs in {where}: {'; '.join(stopped)}"
                if stopped
                else f"--resume: no stopped run with a checkpoint in {where}"
            )
        cfg, resume = checkpoints.resume_run(uri, args.resume, cfg)
    assert cfg is not None
    check_run(cfg, args.checkpoints, Machine.here())  # machine, names, folders: before anything is written
    check_sqlite(args.tracking_uri, "--tracking-uri")
    if resume:
        print(f"resuming run {args.resume} from {resume}")
    uri = tracking.resolve_tracking_uri(args.tracking_uri or cfg.tracking.tracking_uri, cfg.tracking.root)
    plan = checkpoints.run_place(checkpoints.location(args.checkpoints, uri, cfg.tracking.root), cfg.tracking.root, cfg)
    ctx = RunContext(
        tracking_uri=args.tracking_uri,
        checkpoint=plan,
        resume=resume,
        reopen=args.resume or None,
        started=lambda run: _say_started(uri, run.run_id, going_on=bool(resume)),
    )
    try:
        result = train(cfg, ctx)
    except Interrupted as stop:
        stop.advice = _train_advice(uri, stop.runs[-1] if stop.runs else None)
        raise
    shown = {k: round(v, 4) for k, v in result.metrics.items() if not k.startswith(("train/", "lr-", "epoch"))}
    _after_bars(cfg.trainer.progress)
    print(f"run {result.run_id} finished: {shown}")
    _print_ui_hint(result.tracking_uri, run_id=result.run_id)


def _resume_command(uri: str, run_id: str) -> str:
    """``ablate train --resume RUN_ID`` (with the store, where ``--resume`` would not look by itself)."""
    from ablate.lightning_modules.config.run import DEFAULT_ROOT
    from ablate.sweeps.engine import tracking

    elsewhere = uri != tracking.resolve_tracking_uri(None, DEFAULT_ROOT)
    store = f" --tracking-uri {tracking.redact(uri)}" if elsewhere else ""
    return f"ablate train --resume {run_id}{store}"


def _say_started(uri: str, run_id: str, going_on: bool) -> None:
    """The run's first line: its id, its store and the command that resumes it (a run killed without a
    word, out of memory or preempted, can still be found)."""
    from ablate.sweeps.engine import tracking

    what = "goes on" if going_on else "started"
    print(
        f"run {run_id} {what} in {tracking.redact(uri)}; if it stops: {_resume_command(uri, run_id)}",
        file=sys.stderr,
        flush=True,
    )


def _train_advice(uri: str, run_id: str | None) -> str:
    """What resumes an ``ablate train`` that a signal stopped: the run's id, or why it cannot be resumed."""
    if run_id is None:
        return "it was stopped before its run was created; nothing was recorded"
    from ablate.sweeps.engine import checkpoints, tracking

    if checkpoints.resumable(tracking.existing(uri), run_id):
        return f"run {run_id} is KILLED; resume it with: {_resume_command(uri, run_id)}"
    return (
        f"run {run_id} is KILLED; it was stopped before its first validation, so it kept no checkpoint and "
        "cannot be resumed: run the same command again to start it over"
    )


def _study(
    args: argparse.Namespace, said: TextIO | None = None
) -> tuple[StudySpec, StudyBase, Overridden | None, ReportSpec | None]:
    """The study of ``ablate sweep [MODE] STUDY [key=value ...]``: its file (a config or report spec given
    instead is named as such), its overrides applied (:mod:`ablate.sweeps.overrides`) and said (on ``said``,
    default stdout), the whole validated, and its report read (a bad report fails now, not after the sweep),
    before anything is written."""
    from ablate.kinds import check_kind
    from ablate.reports.catalog import study_report
    from ablate.sweeps.spec import load_study, validate_study

    check_kind(args.study, "study")
    spec, base = load_study(args.study)
    if not args.overrides:
        return spec, base, None, study_report(spec, args.study)
    from ablate.sweeps.overrides import override_study

    changed = override_study(spec, base, args.overrides)
    validate_study(changed.spec, changed.base, args.study)
    print(f"study {changed.spec.name}: {changed.original} with {changed.shown}, a study of its own", file=said)
    return changed.spec, changed.base, changed, study_report(changed.spec, args.study)


def cmd_sweep_smoke(args: argparse.Namespace) -> int:
    """``ablate sweep smoke STUDY``: the study's smoke run (:mod:`ablate.sweeps.smoke`), or, where this machine
    cannot run its trials, every arm built on the meta device; 1 when a run of the smoke failed."""
    spec, base, _, _ = _study(args)  # a bad study answers before torch is imported
    from ablate.sweeps.arms import check_arms
    from ablate.sweeps.checks import Machine, check_study
    from ablate.sweeps.smoke import run_smoke

    check_study(spec, base, args.study, None)
    n = check_arms(spec, base, args.study)
    try:
        check_study(spec, base, args.study, Machine.here())
    except ConfigError as exc:  # a study for another machine: its models checked, not trained
        print(
            f"smoke of study {spec.name}: not run on this machine ({exc}); the models of its {n} trials and its "
            "study model were built on the meta device and what their methods need checked"
        )
        return 0
    return run_smoke(spec, base, args.study)


def cmd_sweep_check(args: argparse.Namespace) -> None:
    """``ablate sweep check STUDY``: the study validated (every trial's config, paths, names and arms) and its
    wall time estimated; nothing run."""
    spec, base, _, report = _study(args)  # a bad study answers before torch is imported
    from ablate.sweeps.arms import check_arms
    from ablate.sweeps.checks import Machine, check_study
    from ablate.sweeps.estimate import print_estimate

    check_study(spec, base, args.study, None)  # every trial's config, paths and names
    check_arms(spec, base, args.study)  # every arm's models, built on the meta device
    model = spec.study_model
    uses = f", {model.SECTION}: {model.source or 'trained once'}" if model is not None else ""
    tasks = f", fine-tuned on {', '.join(t.task for t in spec.tasks)}" if spec.tasks else ""
    tasks += f" from {spec.source} (no pre-training)" if spec.source is not None else ""
    optimize = f", {spec.optimize.direction.removesuffix('e')}ing {spec.optimize.metric}"
    title, n = report.title if report else "none", spec.total_trials()
    try:  # a study for another machine (a GPU profile) is valid; it says why it would not run here
        check_study(spec, base, args.study, Machine.here())
        here = ""
    except ConfigError as exc:
        here = f"; not runnable on this machine ({exc})"
    print(f"study {spec.name}: valid; {n} trial{'s' * (n != 1)}{uses}{tasks}{optimize}; report: {title}{here}")
    print_estimate(spec, base, args.study)  # a GPU study's wall time (sweeps/estimate.py)


def cmd_sweep_print_config(args: argparse.Namespace) -> None:
    """``ablate sweep print-config STUDY``: the config of the study's first grid point (a placeholder for the
    study model's run) as YAML, alone on stdout."""
    spec, base, _, _ = _study(args, said=sys.stderr)
    from ablate.lightning_modules.config.experiment import to_yaml
    from ablate.sweeps.spec import corner_configs

    print(to_yaml(corner_configs(spec, base)[0]), end="")


def cmd_sweep(args: argparse.Namespace) -> None:
    """``ablate sweep STUDY``: the study checked against this machine, then run (or resumed) as an Optuna
    sweep; what it did said after."""
    spec, base, overridden, report = _study(args)  # a bad study answers before torch is imported
    from ablate.sweeps.arms import check_arms
    from ablate.sweeps.checks import Machine, check_sqlite, check_study
    from ablate.sweeps.engine import tracking
    from ablate.sweeps.estimate import print_estimate
    from ablate.sweeps.overrides import TAG
    from ablate.sweeps.study import run_study

    check_study(spec, base, args.study, Machine.here())  # what every trial asks of this machine
    check_arms(spec, base, args.study)  # every arm's models, built on the meta device
    check_sqlite(args.storage, "--storage")
    check_sqlite(args.tracking_uri, "--tracking-uri")
    print_estimate(spec, base, args.study)  # a GPU study's wall time, before it starts (sweeps/estimate.py)
    try:
        result = run_study(
            spec,
            base,
            storage=args.storage,
            tracking_uri=args.tracking_uri,
            n_trials=args.n_trials,
            where=args.study,
            tags={TAG: overridden.shown} if overridden is not None else None,
        )
    except Interrupted as stop:
        stores = (("--storage", args.storage), ("--tracking-uri", args.tracking_uri))
        command = f"ablate sweep {args.study}" + (f" {overridden.shown}" if overridden is not None else "")
        again = " ".join([command, *(f"{k} {tracking.redact(v)}" for k, v in stores if v)])
        stop.advice = (
            f"this worker's runs are KILLED; the other workers take its configuration, and the study's run stays "
            f"RUNNING until they end (the same command adds this worker again: {again})"
            if stop.others_go_on
            else f"the study's running runs are KILLED; resume the study with the same command ({again}): "
            "a trial that validated goes on from its checkpoint in the same run"
        )
        raise
    _after_bars(True)  # the runs' bars, on stderr
    _said_after(result.study, spec, result.storage)
    if overridden is not None and report is not None:
        print(f"its report: ablate report {args.study} --study {spec.name}")
    _print_ui_hint(result.tracking_uri, study=spec.name)


def _said_after(study: Study, spec: StudySpec, storage: str) -> None:
    """What a sweep did: its trials' states, failures no later trial made good, the best trial and the one an
    accuracy guard chose."""
    from ablate.sweeps import guard, workers
    from ablate.sweeps.engine import tracking

    def state(t: FrozenTrial) -> str:
        return "INTERRUPTED" if workers.INTERRUPTED in t.user_attrs else t.state.name

    counts = dict(Counter(state(t) for t in study.trials))
    print(f"study {spec.name}: {counts} (storage {tracking.redact(storage)})")
    done = {workers.key(t.params) for t in study.trials if t.state in workers.DONE}
    for t in study.trials:  # failures not made good by a later trial of the same configuration
        reason = t.user_attrs.get(tracking.FAIL_REASON)
        if state(t) == "FAIL" and reason and workers.key(t.params) not in done:
            print(f"trial {t.number} {t.params} failed: {reason} (run the command again to retry it)")
    try:
        best = study.best_trial
        print(f"best trial {best.number}: {spec.optimize.metric}={best.value:.4f} {best.params}")
    except ValueError:
        pass
    chosen = guard.chosen_line(study, spec.optimize.metric, spec.optimize.direction) if spec.optimize.guard else None
    if chosen is not None:  # the best within the accuracy bound, or the closest to it when none is
        print(chosen)


def cmd_bench(args: argparse.Namespace) -> int:
    """``ablate bench BENCH``: a study given to ``bench study`` is checked to be one first (a config or a
    report spec is named as such), then the bench runs (:mod:`ablate.benchmarks.cli`)."""
    from ablate.benchmarks.cli import run

    if args.suite == "study":
        from ablate.kinds import check_kind

        check_kind(args.study, "study")
    return run(args)


def _after_bars(shown: bool) -> None:
    """End the line a progress bar may have left the cursor on (its last frame after a ``\\r``, or a
    cleared line), so that what the command prints next starts a line of its own, in a terminal and
    in a log file alike."""
    sys.stderr.flush()
    if shown:
        print(flush=True)


def _print_ui_hint(uri: str, *, study: str | None = None, run_id: str | None = None) -> None:
    from ablate.mlflow_ui import hint

    print("\n".join(hint(uri, study=study, run_id=run_id)))
