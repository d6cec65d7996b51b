from __future__ import annotations

import pytest
from matplotlib.image import imread
from rich.console import Console

import ablate.reports.build as build_mod
from ablate.lightning_modules.config.errors import ConfigError, StorageError
from ablate.reports import build_report, render_console
from tests.reports.report_fixtures import STUDY


def test_build_writes_everything_and_logs_on_parent(store, spec, tmp_path):
    out = tmp_path / "out"
    res = build_report(spec, STUDY, store.uri, out)
    assert {p.name for p in out.iterdir()} == {p.name for p in res.files}
    md = res.markdown.read_text()
    assert md.startswith("# Embedding size & sharing\n\n| sharing | E | F |")
    assert "Runs used (6): " in md and all(r in md for r in res.run_ids)
    assert "Missing:\n\n- sharing=attn E=64 F=2: no COMPLETE runs (1 FAIL)" in md
    assert res.latex.read_text().startswith(r"\begin{table}")
    assert len(res.runs_csv.read_text().splitlines()) == 1 + len(store.trial_ids)
    assert [p.name for p in res.plots] == ["val_mlm_acc-vs-params_backbone.png", "val_loss-vs-model_embed_dim.png"]
    for png in res.plots:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
        img = imread(png)
        assert img.shape[0] >= 600 and img.shape[1] >= 800 and img.std() > 0.05  # not blank
    # artifacts on the parent run, status unchanged, nothing left RUNNING
    client = store.client()
    logged = {a.path for a in client.list_artifacts(store.parent_id, "report")}
    assert logged == {f"report/{p.name}" for p in res.files}
    assert res.logged and client.get_run(store.parent_id).info.status == "FINISHED"
    assert not client.search_runs([store.experiment_id], "attributes.status = 'RUNNING'")
    # render_console prints the table
    console = Console(record=True, width=120)
    render_console(res, console)
    text = console.export_text()
    assert "66.0 ± 12.7 (med 66.0," in text and "no COMPLETE runs" in text
    assert "Welch's t-test over seeds" in text


def test_rebuild_into_existing_dir_without_logging(store, spec, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    res = build_report(spec, STUDY, store.uri, out, log_to_parent=False)
    assert not res.logged and (out / "notes.txt").read_text() == "keep me"
    assert res.csv.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left


def test_failure_leaves_nothing_half_written(store, spec, tmp_path, monkeypatch):
    def boom(table):
        raise RuntimeError("render failed")

    monkeypatch.setattr(build_mod, "to_latex", boom)
    with pytest.raises(RuntimeError):
        build_report(spec, STUDY, store.uri, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_unknown_study_is_an_error_and_writes_nothing(store, spec, tmp_path):
    with pytest.raises(
        ConfigError, match="^no runs for study no-such-study in .*; run the study with ablate sweep STUDY.yaml first"
    ):
        build_report(spec, "no-such-study", store.uri, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_store(spec, tmp_path):
    with pytest.raises(StorageError, match=r"^http://127\.0\.0\.1:9"):
        build_report(spec, STUDY, "http://127.0.0.1:9", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_piped_console_output_keeps_every_header_whole(store, spec, tmp_path, monkeypatch, capsys):
    """Logged or piped (not a terminal), the table is not squeezed to the default width."""
    res = build_report(spec, STUDY, store.uri, tmp_path / "out", log_to_parent=False)
    monkeypatch.setenv("COLUMNS", "40")  # a console narrower than the table
    render_console(res)
    out = capsys.readouterr().out
    headers, _, _ = build_mod.cells(res.table)
    assert "…" not in out
    assert all(h in out for h in headers), headers
