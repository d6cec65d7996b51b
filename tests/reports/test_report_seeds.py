"""Seeds in a report: each cell's 95% t-interval and median over its seeds, Welch's t-test against the
reference row, a chained trial's fine-tuning seeds read from its stage runs, the one-seed line, the
CSV columns and the plots' error bars, from real MLflow stores written here."""

from __future__ import annotations

import io
import math
import statistics

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from scipy import stats

from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports.build import build_report
from ablate.reports.plots import axis_values
from ablate.reports.render import footnotes, to_csv, to_latex, to_markdown
from ablate.reports.runs import load_runs, load_stages
from ablate.reports.spec import ReportSpec
from ablate.reports.tables import aggregate

# t(0.975, 2) from a table of Student's t: the 95% interval of a mean over 3 seeds is mean ± 4.303 s / sqrt(3)
T_975_2 = 4.302652729911275

# variant -> its three trials' val/mlm_acc (a study's seeds: one trial per seed)
SEEDED = {"base": [0.60, 0.62, 0.64], "near": [0.61, 0.63, 0.66], "far": [0.80, 0.81, 0.82]}
# variant -> per fine-tuning seed (0, 1, 2): sst2/best_accuracy, mnli/best_accuracy, mnli-mm/best_accuracy
CHAINED = {
    "base": [(0.80, 0.60, 0.62), (0.82, 0.64, 0.63), (0.84, 0.62, 0.61)],
    "wide": [(0.90, 0.70, 0.71), (0.91, 0.71, 0.72), (0.92, 0.72, 0.70)],
}


def _run(client, exp, name, tags, params, metrics, status="FINISHED"):
    rid = client.create_run(exp, run_name=name, tags=tags).info.run_id
    client.log_batch(
        rid,
        metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
        params=[Param(k, str(v)) for k, v in params.items()],
    )
    client.set_terminated(rid, status)
    return rid


def _trial(client, exp, study, parent, number, params, metrics):
    tags = {"mlflow.parentRunId": parent, "ablate.role": "trial", "ablate.study": study}
    tags |= {"ablate.trial": str(number), "ablate.state": "COMPLETE", "ablate.stage": "trial"}
    return _run(client, exp, f"{study} {number}", tags, params, metrics)


def _stage(client, exp, trial, task, seed, metric, metrics, status="FINISHED"):
    tags = {"mlflow.parentRunId": trial, "ablate.role": "run", "ablate.stage": f"finetune:{task}"}
    params = {"seed": seed, "regime": "finetune", "finetune.task": task, "finetune.metric": metric}
    return _run(client, exp, f"{task} seed={seed}", tags, params, metrics, status)


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    for study in ("seeded", "chained", "single"):
        exp = client.create_experiment(study, artifact_location=(root / study).as_uri())
        parent = _run(client, exp, study, {"ablate.role": "study", "ablate.study": study}, {}, {})
        if study == "seeded":
            for i, (variant, values) in enumerate((v, x) for v, xs in SEEDED.items() for x in [xs]):
                for seed, value in enumerate(values):
                    params = {"variant": variant, "seed": seed}
                    metrics = {"val/mlm_acc": value, "params.backbone": 4.0e6}
                    _trial(client, exp, study, parent, 3 * i + seed, params, metrics)
        if study == "single":
            for i, (variant, values) in enumerate(SEEDED.items()):
                _trial(client, exp, study, parent, i, {"variant": variant, "seed": 0}, {"val/mlm_acc": values[0]})
        if study == "chained":
            for i, (variant, per_seed) in enumerate(CHAINED.items()):
                sst2, mnli, mm = (statistics.fmean(col) for col in zip(*per_seed, strict=True))
                carried = {  # what chain.py logs on the trial: the means, the std, the average of the tasks
                    "sst2/best_accuracy": sst2,
                    "mnli/best_accuracy": mnli,
                    "mnli-mm/best_accuracy": mm,
                    "sst2/best_accuracy_std": statistics.stdev(s for s, _, _ in per_seed),
                    "downstream/avg": (sst2 + mnli) / 2,
                    # the mean of the tasks' scores (MNLI's over both dev sets); wide's made some other way
                    "glue/score": (sst2 + (mnli + mm) / 2) / 2 if variant == "base" else 0.5,
                    "glue/bert_avg": (sst2 + mnli + mm) / 3,  # BERT's: MNLI-m and -mm two columns
                    "params.backbone": 4.0e6,
                }
                trial = _trial(client, exp, study, parent, i, {"variant": variant, "seed": 0}, carried)
                pre = {"mlflow.parentRunId": trial, "ablate.stage": "pretrain"}
                _run(client, exp, "pretrain", pre, {"seed": 0}, {"val/mlm_acc": 0.5})
                for seed, (s, m, mm_) in enumerate(per_seed):
                    if seed == 1:  # an earlier attempt's stages: killed, and finished with another figure
                        _stage(client, exp, trial, "sst2", seed, "accuracy", {"sst2/best_accuracy": 0.1}, "KILLED")
                        _stage(client, exp, trial, "sst2", seed, "accuracy", {"sst2/best_accuracy": 0.2})
                    _stage(
                        client, exp, trial, "sst2", seed, "accuracy", {"sst2/best_accuracy": s, "sst2/best_score": s}
                    )
                    ft = {"mnli/best_accuracy": m, "mnli-mm/best_accuracy": mm_, "mnli/best_score": (m + mm_) / 2}
                    ft |= {"params.backbone": 1.0}
                    _stage(client, exp, trial, "mnli", seed, "accuracy", ft)
    return uri


def _spec(**extra):
    return ReportSpec.from_mapping(
        {
            "title": "Seeds",
            "rows": ["variant"],
            "order": {"variant": ["base", "near", "far", "wide"]},
            "metrics": [
                {"name": "params.backbone", "label": "Params", "format": "millions"},
                {"name": "val/mlm_acc", "label": "MLM", "format": "percent", "digits": 2, "better": "higher"},
            ],
            **extra,
        }
    )


def _table(uri, study, spec):
    runs, _ = load_runs(uri, study)
    return aggregate(runs, spec, stages=load_stages(uri, study, runs["run_id"].to_list()))


def _welch_by_hand(a, b):
    """Welch's t and its Welch-Satterthwaite degrees of freedom, from the formulas; two-sided p."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return 2 * stats.t.sf(abs(t), df)


def test_a_cell_over_seeds_is_its_mean_t_interval_and_median(uri):
    table = _table(uri, "seeded", _spec())
    st = table.stats.set_index("variant")
    # base: 0.60, 0.62, 0.64: mean 0.62, s = 0.02, half-width 4.3027 * 0.02 / sqrt(3) = 0.049683
    assert st.at["base", "val/mlm_acc.mean"] == pytest.approx(0.62)
    assert st.at["base", "val/mlm_acc.std"] == pytest.approx(0.02)
    assert st.at["base", "val/mlm_acc.half_width"] == pytest.approx(0.049683, abs=1e-6)
    assert st.at["base", "val/mlm_acc.half_width"] == pytest.approx(T_975_2 * 0.02 / math.sqrt(3), rel=1e-9)
    assert (st.at["base", "val/mlm_acc.ci_low"], st.at["base", "val/mlm_acc.ci_high"]) == pytest.approx(
        (0.62 - 0.049683, 0.62 + 0.049683), abs=1e-6
    )
    # near: 0.61, 0.63, 0.66: the median 0.63 beside the mean 0.6333
    assert st.at["near", "val/mlm_acc.median"] == pytest.approx(0.63)
    assert st.at["near", "val/mlm_acc.mean"] == pytest.approx(0.633333, abs=1e-6)
    assert st.at["near", "val/mlm_acc.n"] == 3 and st.at["near", "n"] == 3
    md = to_markdown(table)
    assert "| base | 4.0M | 62.00 ± 4.97 (med 62.00, n=3) | 3 |" in md  # params: the same every seed, no ±
    assert "| far | 4.0M | **81.00 ± 2.48 (med 81.00, n=3)** | 3 |" in md  # 4.3027 * 0.01 / sqrt(3) = 0.0248


def test_welch_marks_cells_within_noise_of_the_reference_row(uri):
    table = _table(uri, "seeded", _spec())  # reference: the first row with runs, base
    st = table.stats.set_index("variant")
    assert table.reference == 0 and math.isnan(st.at["base", "val/mlm_acc.welch_p"])
    near = _welch_by_hand(SEEDED["near"], SEEDED["base"])  # 0.47: within noise
    far = _welch_by_hand(SEEDED["far"], SEEDED["base"])  # 0.0016: a real difference
    assert st.at["near", "val/mlm_acc.welch_p"] == pytest.approx(near, rel=1e-9) and near > 0.05
    assert st.at["far", "val/mlm_acc.welch_p"] == pytest.approx(far, rel=1e-9) and far < 0.01
    assert st.at["near", "val/mlm_acc.within_noise"] and not st.at["far", "val/mlm_acc.within_noise"]
    assert math.isnan(st.at["near", "params.backbone.welch_p"])  # no spread on either side: not tested
    md = to_markdown(table)
    assert "| near | 4.0M | 63.33 ± 6.25 (med 63.00, n=3)≈ | 3 |" in md
    notes = footnotes(table)
    assert (
        "≈ within noise of the reference row variant=base: Welch's t-test over seeds "
        "(scipy.stats.ttest_ind, equal_var=False), p >= 0.05" in notes
    )
    assert r"63.33 $\pm$ 6.25 (med 63.00, n=3)$^{\approx}$" in to_latex(table)

    # the reference named by a row's values: far now, and both others differ from it
    table = _table(uri, "seeded", _spec(reference={"variant": "far"}))
    st = table.stats.set_index("variant")
    assert st.at["base", "val/mlm_acc.welch_p"] == pytest.approx(far, rel=1e-9)
    assert not st["val/mlm_acc.within_noise"].any() and "≈" not in to_markdown(table)
    assert any(n.endswith("p >= 0.05; no cell here is") and "variant=far" in n for n in footnotes(table))

    # reference: none: nothing tested, no note
    table = _table(uri, "seeded", _spec(reference="none"))
    assert table.reference is None and not table.stats["val/mlm_acc.within_noise"].any()
    assert not any("Welch" in n for n in footnotes(table))
    # a reference no row with runs has: said, nothing marked
    table = _table(uri, "seeded", _spec(reference={"variant": "huge"}))
    assert table.reference is None and "≈: the reference row (variant=huge) has no runs" in footnotes(table)[1]


def test_a_chained_trials_fine_tuning_seeds_come_from_its_stage_runs(uri):
    spec = ReportSpec.from_mapping(
        {
            "title": "Chained",
            "rows": ["variant"],
            "metrics": [
                {"name": "sst2/best_accuracy", "label": "SST-2", "format": "percent"},
                {"name": "mnli-mm/best_accuracy", "label": "MNLI-mm", "format": "percent"},
                {"name": "downstream/avg", "label": "Avg", "format": "percent"},
                {"name": "glue/score", "label": "GLUE", "format": "percent"},
                {"name": "glue/bert_avg", "label": "BERT avg", "format": "percent"},
                {"name": "params.backbone", "label": "Params", "format": "millions"},
            ],
        }
    )
    table = _table(uri, "chained", spec)
    st = table.stats.set_index("variant")
    sst2 = [s for s, _, _ in CHAINED["base"]]  # 0.80, 0.82, 0.84: the later finished seed 1 counts, not 0.2
    assert st.at["base", "n"] == 1 and st.at["base", "sst2/best_accuracy.n"] == 3
    assert st.at["base", "sst2/best_accuracy.std"] == pytest.approx(statistics.stdev(sst2))
    assert st.at["base", "sst2/best_accuracy.half_width"] == pytest.approx(T_975_2 * 0.02 / math.sqrt(3))
    mm = [x for _, _, x in CHAINED["base"]]  # a further dev set's metric (mnli-mm) is the mnli stage's
    assert st.at["base", "mnli-mm/best_accuracy.median"] == pytest.approx(statistics.median(mm))
    # downstream/avg per seed: that seed's mean of sst2 and mnli (0.70, 0.73, 0.73)
    avg = [(s + m) / 2 for s, m, _ in CHAINED["base"]]
    assert st.at["base", "downstream/avg.n"] == 3
    assert st.at["base", "downstream/avg.mean"] == pytest.approx(statistics.fmean(avg))
    assert st.at["base", "downstream/avg.std"] == pytest.approx(statistics.stdev(avg))
    # glue/score per seed: the mean of that seed's task scores, MNLI's the mean of its two dev sets
    glue = [(s + (m + x) / 2) / 2 for s, m, x in CHAINED["base"]]
    assert st.at["base", "glue/score.n"] == 3 and st.at["base", "glue/score.std"] == pytest.approx(
        statistics.stdev(glue)
    )
    assert st.at["wide", "glue/score.n"] == 1 and st.at["wide", "glue/score.mean"] == 0.5  # no formula gives it
    bert = [(s + m + x) / 3 for s, m, x in CHAINED["base"]]  # per seed, BERT's Table 1 average
    assert st.at["base", "glue/bert_avg.n"] == 3
    assert st.at["base", "glue/bert_avg.std"] == pytest.approx(statistics.stdev(bert))
    # a trial metric no stage carries stays one per trial (the stages' own params.backbone is not it)
    assert st.at["base", "params.backbone.n"] == 1 and st.at["base", "params.backbone.mean"] == 4.0e6
    wide = [s for s, _, _ in CHAINED["wide"]]
    assert st.at["wide", "sst2/best_accuracy.welch_p"] == pytest.approx(_welch_by_hand(wide, sst2), rel=1e-9)


def test_one_seed_says_so(uri, tmp_path):
    spec = _spec()
    table = _table(uri, "single", spec)
    assert footnotes(table) == ["one seed: no intervals"]
    assert "±" not in to_markdown(table) and "| near | – | 61.00 | 1 |" in to_markdown(table)
    assert r"One seed: no intervals.}" in to_latex(table)
    result = build_report(spec, "single", uri, tmp_path / "out", log_to_parent=False)
    assert "\none seed: no intervals\n" in result.markdown.read_text()


def test_csv_and_plot_carry_the_intervals(uri, tmp_path):
    spec = _spec(plots=[{"x": "params.backbone", "y": "val/mlm_acc"}])
    result = build_report(spec, "seeded", uri, tmp_path / "out", log_to_parent=False)
    back = pd.read_csv(io.StringIO(result.csv.read_text()))
    stats_ = ["mean", "std", "n", "median", "half_width", "ci_low", "ci_high", "welch_p", "within_noise"]
    assert list(back.columns) == ["variant", "n"] + [
        f"{m}.{s}" for m in ("params.backbone", "val/mlm_acc") for s in stats_
    ]
    base = back.set_index("variant").loc["base"]
    assert base["val/mlm_acc.half_width"] == pytest.approx(0.049683, abs=1e-6) and base["val/mlm_acc.n"] == 3
    assert back.set_index("variant").loc["near", "val/mlm_acc.within_noise"]
    assert to_csv(result.table) == result.csv.read_text()
    # the plot's error bars are the intervals: base's y error is its half-width, the params' none
    _, yerr = axis_values(result.table, "val/mlm_acc")
    _, xerr = axis_values(result.table, "params.backbone")
    assert list(yerr) == pytest.approx(list(result.table.stats["val/mlm_acc.half_width"])) and not xerr.any()
    (png,) = result.plots
    assert png.name == "val_mlm_acc-vs-params_backbone.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_reference_is_a_config_error(uri):
    with pytest.raises(ConfigError, match=r"^report\.reference\.model\.sharing: not one of rows \['variant'\]"):
        ReportSpec.from_mapping(
            {"title": "t", "rows": ["variant"], "metrics": [{"name": "val/m"}], "reference": {"model.sharing": "all"}}
        )
    with pytest.raises(ConfigError, match=r"^report\.reference: 'last': give first, none or a mapping of row params"):
        ReportSpec.from_mapping(
            {"title": "t", "rows": ["variant"], "metrics": [{"name": "val/m"}], "reference": "last"}
        )
    spec = ReportSpec.from_mapping(
        {
            "title": "t",
            "rows": ["variant", "seed"],
            "metrics": [{"name": "val/mlm_acc"}],
            "reference": {"variant": "base"},
        }
    )
    with pytest.raises(ConfigError, match=r"^report\.reference: variant=base matches 3 rows \(variant=base seed=0; "):
        _table(uri, "seeded", spec)
