"""``ablate report --remeasure`` and the spread marker: a real MLflow store whose trial runs were
logged by the runner's own logging (``log_run_inputs``: params, config.yaml, the measured
metrics), one with the runner's real measurement and the others with deliberately bogus latencies."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient
from rich.console import Console

from ablate import cli
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure import measuring, profiling
from ablate.lightning_modules.measure.accounting import metric_counts
from ablate.lightning_modules.measure.deployed import describe_instruction_sets
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.reports import build_report, render_console
from ablate.reports.build import LOGGED_NOTE
from ablate.reports.remeasure import REMEASURED_METRICS, RUNTIME, remeasure_runs
from ablate.reports.render import cells, to_latex
from ablate.reports.runs import load_runs
from ablate.reports.spec import ReportSpec
from ablate.reports.tables import REFERENCE_SUFFIX, SPREAD_LIMIT, SPREAD_MARK, SPREAD_NOTE, SPREAD_SUFFIX, aggregate
from ablate.sweeps.engine.tracking import log_run_inputs

STUDY = "latency-check"
BOGUS = 9999.0  # what the bogus runs logged as their latency: no real tiny model is this slow


def tiny_cfg(num_layers: int) -> ExperimentConfig:
    model = {"preset": "albert-tiny", "vocab_size": 1000, "embed_dim": 16, "hidden_dim": 32, "num_heads": 2}
    return build_config(
        {
            "model": {**model, "num_layers": num_layers, "ffn_dim": 64, "max_position": 32},
            "data": {"max_length": 32, "batch_size": 4},
            "trainer": {"accelerator": "cpu"},
        }
    )


@dataclass
class Study:
    uri: str
    root: Path
    ids: dict[str, str]  # run name -> run id

    def client(self) -> MlflowClient:
        return MlflowClient(tracking_uri=self.uri)


def _trial(client: MlflowClient, exp: str, parent: str, n: int, name: str, state: str = "COMPLETE") -> str:
    tags = {"mlflow.parentRunId": parent, "ablate.role": "trial", "ablate.study": STUDY}
    tags |= {"ablate.trial": str(n), "ablate.state": state}
    return client.create_run(exp, run_name=name, tags=tags).info.run_id


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    root = tmp_path_factory.mktemp("remeasure")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(STUDY, artifact_location=(root / "art").as_uri())
    parent = client.create_run(exp, run_name=STUDY, tags={"ablate.role": "study", "ablate.study": STUDY}).info.run_id
    ids: dict[str, str] = {}
    # L=1: measured as a run measures before training (metric_counts: the same metrics, spread included)
    cfg = tiny_cfg(1)
    counts, _ = metric_counts(build_pretraining_model(cfg.model, cfg.objective), cfg.model, cfg)
    ids["L=1"] = _trial(client, exp, parent, 0, "L=1")
    log_run_inputs(client, ids["L=1"], cfg, counts, None)
    # the bogus runs log L=1's reference times: the reference marker (its own tests are in
    # test_reference_load.py) would otherwise mark them whenever the machine's load moved between the two
    # measurements, and these tests are about the spread marker
    references = {m: v for m, v in counts.items() if m.endswith(REFERENCE_SUFFIX)}
    assert references
    # L=4, two seeds: bogus latencies, one of them logged on a busy machine (spread far over the limit)
    cfg = tiny_cfg(4)
    counts, _ = metric_counts(build_pretraining_model(cfg.model, cfg.objective), cfg.model, cfg)
    for n, (seed, spread) in enumerate([(0, 0.5), (1, 0.01)], start=1):
        bogus = {m: BOGUS for m in ("latency_ms_b1", "latency_ms_b32")}
        bogus |= {m + SPREAD_SUFFIX: spread for m in bogus} | references
        ids[f"L=4 seed={seed}"] = _trial(client, exp, parent, n, f"L=4 seed={seed}")
        log_run_inputs(client, ids[f"L=4 seed={seed}"], cfg, {**counts, **bogus}, None)
    # a failed trial is not in the table, so not measured either
    ids["failed"] = _trial(client, exp, parent, 3, "failed", state="FAIL")
    log_run_inputs(client, ids["failed"], tiny_cfg(2), {}, None)
    for rid in [*ids.values(), parent]:
        client.set_terminated(rid, "FINISHED")
    return Study(uri, root, ids)


def spec(**extra: object) -> ReportSpec:
    return ReportSpec.from_mapping(
        {
            "title": "Layers",
            "study": STUDY,
            "rows": ["model.num_layers"],
            "row_labels": {"model.num_layers": "L"},
            "metrics": [
                {"name": "params.backbone", "label": "Params", "format": "millions", "digits": 3},
                {"name": "latency_ms_b1", "label": "ms/b1", "digits": 2, "better": "lower"},
                {"name": "latency_ms_b32", "label": "ms/b32", "digits": 2, "better": "lower"},
            ],
            **extra,
        }
    )


def test_a_run_logs_the_fastest_repeat_and_its_spread(study: Study) -> None:
    metrics = study.client().get_run(study.ids["L=1"]).data.metrics
    logged = [profiling.latency_metric(b) + s for b in profiling.LATENCY_BATCHES for s in ("", SPREAD_SUFFIX)]
    for name in [*logged, *(profiling.latency_metric(b) + REFERENCE_SUFFIX for b in profiling.LATENCY_BATCHES)]:
        assert name in metrics and metrics[name] >= 0 and not math.isnan(metrics[name])
    assert 0 < metrics["latency_ms_b1"] < BOGUS


def test_remeasure_replaces_the_logged_latencies_and_says_where(study: Study, tmp_path: Path) -> None:
    res = build_report(spec(), STUDY, study.uri, tmp_path / "out", remeasure=True, progress=False)
    again = pd.read_csv(res.remeasured)
    assert sorted(again["run_id"]) == sorted(study.ids[k] for k in ("L=1", "L=4 seed=0", "L=4 seed=1"))  # not failed
    assert set(again["device"]) == {measuring.describe_device("cpu")} and (again["machine"] != "").all()
    assert (again.loc[again["run_name"] != "L=1", "logged/latency_ms_b32"] == BOGUS).all()
    # the seeds share one architecture: timed once, the same figure for both
    l4 = again[again["run_name"].str.startswith("L=4")]
    assert l4["latency_ms_b32"].nunique() == 1 and (l4["latency_ms_b32"] < BOGUS).all()
    assert (again["latency_ms_b32_spread"] >= 0).all()
    # the table's latency cells are this pass's figures, not the logged ones
    st = res.table.stats.set_index("model.num_layers")
    for layers, name in ((1, "L=1"), (4, "L=4 seed=0")):
        row = again[again["run_name"] == name].iloc[0]
        assert st.at[layers, "latency_ms_b32.mean"] == pytest.approx(row["latency_ms_b32"])
        assert st.at[layers, "latency_ms_b1.mean"] == pytest.approx(row["latency_ms_b1"])
    md = res.markdown.read_text()
    assert f"{BOGUS:.2f}" not in md and "9999" not in res.latex.read_text()
    machine = measuring.describe_machine("cpu")
    assert measuring.cpu_model() in machine
    note = next(line for line in md.splitlines() if line.startswith("Latency re-measured"))
    assert machine in note and "load average" in note and "UTC" in note
    assert "2 models for 3 runs" in note and "3 rounds of 6 turns" in note and "of the 18 turns" in note
    # pre-training runs: no task head to deploy, timed in PyTorch, and the table says so
    assert set(again[RUNTIME]) == {"PyTorch"} and (again["why"].str.startswith("a pre-trained model")).all()
    assert describe_instruction_sets() in note and "AVX2" in note
    assert "| timed by |" in md and "| PyTorch |" in md and "PyTorch, not ONNX Runtime, for L=1" in md
    assert (again["latency_ms_b32_all"] > 0).all() and (again["instruction_sets"] == describe_instruction_sets()).all()
    assert "re-measured" in res.latex.read_text() and res.remeasured in res.files
    console = Console(record=True, width=200)
    render_console(res, console)
    assert "Latency re-measured" in console.export_text()
    # the runs themselves keep what they logged
    assert study.client().get_run(study.ids["L=4 seed=0"]).data.metrics["latency_ms_b32"] == BOGUS


def test_a_wide_spread_gets_the_marker_and_the_footnote(study: Study, tmp_path: Path) -> None:
    runs, _ = load_runs(study.uri, STUDY)
    table = aggregate(runs, spec())
    headers, text, _ = cells(table)
    by_layers = {row[0]: dict(zip(headers, row, strict=True)) for row in text}
    # L=4: one of its two runs was measured with spread 0.5 > SPREAD_LIMIT (the row's largest counts)
    assert by_layers["4"]["ms/b32"] == f"{BOGUS:.2f}{SPREAD_MARK}" and SPREAD_LIMIT < 0.5
    assert not by_layers["4"]["Params"].endswith(SPREAD_MARK)  # no spread logged: never marked
    assert "\\dagger" in to_latex(table) and "spread over 10 \\%" in to_latex(table)
    res = build_report(spec(), STUDY, study.uri, tmp_path / "out", log_to_parent=False)
    md = res.markdown.read_text()
    assert f"{BOGUS:.2f}{SPREAD_MARK}" in md and SPREAD_NOTE in md
    assert "latency_ms_b32.spread" in res.csv.read_text()
    # below the limit: no marker, no footnote
    quiet = runs.assign(**{m: 0.01 for m in REMEASURED_METRICS if m.endswith(SPREAD_SUFFIX)})
    _, text, _ = cells(aggregate(quiet, spec()))
    assert not any(c.endswith(SPREAD_MARK) for row in text for c in row)


def test_remeasure_leaves_out_a_run_without_config_and_says_so(study: Study) -> None:
    runs, _ = load_runs(study.uri, STUDY)
    runs = pd.concat([runs[runs["run_name"] == "L=1"], runs.assign(run_id="no-such-run", run_name="ghost").iloc[:1]])
    again = remeasure_runs(runs, study.uri, repeats=2, warmup=0, progress=False)
    assert list(again.frame["run_name"]) == ["L=1"] and again.models == 1
    assert len(again.missing) == 1 and again.missing[0].startswith("run ghost (no-such-run): latency not re-measured")
    applied = again.apply(runs)
    assert math.isnan(applied.loc[applied["run_name"] == "ghost", "latency_ms_b32"].iloc[0])  # no stale figure


def test_cli_remeasure(study: Study, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "layers.yaml"
    report.write_text(yaml.safe_dump({**_spec_dict(), "tracking_uri": study.uri}))
    out = tmp_path / "out"
    assert cli.main(["report", str(report), "--remeasure", "--out", str(out)]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # the note is wrapped to the table's width
    assert "Latency re-measured" in shown and measuring.describe_device("cpu") in shown and "remeasured.csv" in shown
    assert (out / "remeasured.csv").is_file()
    # the default: a report with a latency column times its models again
    assert cli.main(["report", str(report), "--out", str(tmp_path / "default")]) == 0
    assert "Latency re-measured" in " ".join(capsys.readouterr().out.split())
    assert (tmp_path / "default" / "remeasured.csv").is_file()
    # --no-remeasure: the logged figures, and the table says so
    assert cli.main(["report", str(report), "--no-remeasure", "--out", str(tmp_path / "logged")]) == 0
    md = (tmp_path / "logged" / "report.md").read_text()
    assert LOGGED_NOTE in md and "Latency re-measured" not in md and f"{BOGUS:.2f}" in md
    assert not (tmp_path / "logged" / "remeasured.csv").exists()
    # a report without a latency column has nothing to re-measure: one error line, nothing written
    plain = {**_spec_dict(), "tracking_uri": study.uri, "metrics": [{"name": "params.backbone"}]}
    report.write_text(yaml.safe_dump(plain))
    assert cli.main(["report", str(report), "--remeasure", "--out", str(tmp_path / "none")]) == 2
    assert "error: --remeasure: this report shows no latency" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def _spec_dict() -> dict[str, object]:
    return {
        "title": "Layers",
        "study": STUDY,
        "rows": ["model.num_layers"],
        "metrics": [{"name": "latency_ms_b32", "label": "ms/b32", "digits": 2, "better": "lower"}],
    }


def test_report_and_profiling_agree_on_the_names() -> None:
    from ablate.reports import remeasure
    from ablate.sweeps.chain import PRETRAIN_RUN

    assert SPREAD_SUFFIX == profiling.SPREAD_SUFFIX == remeasure.SPREAD_SUFFIX
    assert remeasure.PRETRAIN_RUN == PRETRAIN_RUN
    assert {profiling.latency_metric(b) for b in profiling.LATENCY_BATCHES} <= set(REMEASURED_METRICS)


def test_a_chained_trial_is_timed_as_the_classifier_it_deploys(tmp_path: Path) -> None:
    """A chained trial (pre-training, then fine-tuning stages) deploys its first fine-tuning stage's classifier:
    that stage's config is what is rebuilt and timed, not the pre-training stage's encoder."""
    from ablate.lightning_modules.config.experiment import to_yaml
    from ablate.reports.remeasure import _run_config

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("chained", artifact_location=str(tmp_path / "artifacts"))
    trial = client.create_run(exp, tags={"ablate.stage": "trial"}).info.run_id
    pre = client.create_run(exp, tags={"mlflow.parentRunId": trial, "ablate.stage": "pretrain"}).info.run_id
    client.set_tag(trial, "ablate.pretrain_run", pre)
    ft = client.create_run(exp, tags={"mlflow.parentRunId": trial, "ablate.stage": "finetune:sst2"}).info.run_id
    model = {"preset": "bert-tiny", "num_layers": 2}
    task = {"source": "runs:/x", "task": "sst2", "train": "a.tsv", "validation": "b.tsv", "max_length": 48}
    for run, tree in ((pre, {"model": model}), (ft, {"model": model, "finetune": task})):
        (tmp_path / run).mkdir()
        (tmp_path / run / "config.yaml").write_text(to_yaml(build_config(tree)), encoding="utf-8")
        client.log_artifact(run, str(tmp_path / run / "config.yaml"), "model")
    assert _run_config(client, trial, tmp_path / "w1").regime == "finetune"  # the stage that deploys
    assert _run_config(client, pre, tmp_path / "w2").regime == "pretrain"
    client.delete_run(ft)  # no fine-tuning stage: the pre-training stage's model
    assert _run_config(client, trial, tmp_path / "w3").regime == "pretrain"
