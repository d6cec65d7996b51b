"""``ablate export RUN OUT_DIR``: a run's logged weights become a transformers checkpoint or an ablate export;
a trained run's export is a Hugging Face model (tokenizer, card) that ablate also starts from."""

from __future__ import annotations

import pytest
import torch
import yaml

pytest.importorskip("transformers")

from ablate.cli import main  # noqa: E402
from ablate.lightning_modules.config.experiment import ExperimentConfig  # noqa: E402
from ablate.lightning_modules.config.model import ModelConfig  # noqa: E402
from ablate.lightning_modules.interop.pretrained import load_pretrained  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402
from ablate.sweeps.engine import tracking  # noqa: E402
from ablate.sweeps.engine.weights import load_run_weights, log_weights  # noqa: E402
from tests.conftest import SHARED_DATA  # noqa: E402
from tests.sweeps.conftest import trained_run  # noqa: E402

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=500, embed_dim=16, hidden_dim=32, num_layers=2, num_heads=2, ffn_dim=64, max_position=32, dropout=0.0
)


def test_export_from_a_run(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.connect(uri)
    exp = tracking.experiment_id(client, "ablate", uri)
    runs = {}
    for name, sharing in [("albert", "all"), ("attn", "attn")]:
        model_cfg = ModelConfig(**SMALL, sharing=sharing)
        cfg = ExperimentConfig(model=model_cfg)
        model = build_pretraining_model(cfg.model, cfg.objective)
        run_id = tracking.start_run(client, exp, name, {})
        log_weights(client, run_id, model, cfg)
        runs[name] = (run_id, model)
    bare = tracking.start_run(client, exp, "no weights", {})

    loaded_cfg, loaded = load_run_weights(uri, runs["attn"][0])
    assert loaded_cfg.model.sharing == "attn"
    assert all(
        torch.equal(a, b)
        for a, b in zip(runs["attn"][1].state_dict().values(), loaded.state_dict().values(), strict=False)
    )

    for name, fmt, marker in [("albert", "transformers", "config.json"), ("attn", "ablate", "model.safetensors")]:
        out = tmp_path / f"out-{name}"
        assert main(["export", runs[name][0], str(out), "--tracking-uri", uri]) == 0
        assert f"({fmt} format; no tokenizer: the run logged none)" in capsys.readouterr().out
        assert (out / marker).is_file() and (out / "ablate.yaml").is_file()
        cfg, _ = load_pretrained(out)
        assert cfg.sharing == ("all" if name == "albert" else "attn")

    for args, needle in [
        ([bare, str(tmp_path / "x")], f"error: run {bare}: saved no weights"),
        (["0" * 32, str(tmp_path / "x")], "error: run 00000000000000000000000000000000: no such run"),
        ([runs["attn"][0], str(tmp_path / "out-attn")], "already exists"),
        ([bare, str(tmp_path / "x"), "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"], "no MLflow store there"),
    ]:
        if "--tracking-uri" not in args:
            args = [*args, "--tracking-uri", uri]
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists() and not (tmp_path / "none.db").exists()


# --- a trained run, exported: a Hugging Face model with the run's tokenizer, and an ablate source ---------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory, wiki_validation):
    """A tiny ALBERT trained on real text, exported with ``ablate export runs:/RUN_ID``."""
    tmp = tmp_path_factory.mktemp("export")
    base, result = trained_run(tmp, wiki_validation)
    out = tmp / "hf"
    assert main(["export", f"runs:/{result.run_id}", str(out), "--tracking-uri", result.tracking_uri]) == 0
    return tmp, base, result, out


def test_a_runs_model_artifacts_carry_its_tokenizer(exported, tmp_path):
    _, _, result, _ = exported
    client = tracking.connect(result.tracking_uri)
    names = {a.path.split("/")[-1] for a in client.list_artifacts(result.run_id, "model")}
    assert {"model.safetensors", "config.yaml", "tokenizer.json", "tokenizer_config.json"} <= names
    folder = client.download_artifacts(result.run_id, "model", str(tmp_path))
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tok) == 1000 and tok.unk_token not in tok.tokenize("the city of london")


def test_export_of_a_trained_run_is_a_transformers_model(exported):
    _, base, result, out = exported
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"} <= {
        p.name for p in out.iterdir()
    }
    tok = transformers.AutoTokenizer.from_pretrained(out)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out)
    assert type(mlm).__name__ == "AlbertForMaskedLM" and len(tok) == mlm.config.vocab_size == 1000
    assert tok.do_lower_case and tok.model_max_length == base["model"]["max_position"]
    for word in ("the", "of", "was", "in"):
        assert tok.convert_ids_to_tokens(tok(word)["input_ids"]) == ["[CLS]", word, "[SEP]"]
    filled = transformers.pipeline("fill-mask", model=str(out))("The capital of France is [MASK].")
    assert len(filled) == 5 and all(r["sequence"].startswith("the capital of france is") for r in filled)
    card = (out / "README.md").read_text()
    assert f"`runs:/{result.run_id}`" in card and "| backbone parameters |" in card
    assert f"| `val/loss` | {result.metrics['val/loss']:.4g} |" in card  # the run's final metrics
    assert yaml.safe_load(card.split("```yaml\n")[1].split("```")[0])["model"]["vocab_size"] == 1000


def test_the_export_folder_is_a_finetune_source_with_its_tokenizer(exported):
    sst2 = SHARED_DATA / "sst2"
    if not (sst2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {sst2}")
    tmp, base, _, out = exported
    lines = (sst2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp / "train.tsv").write_text("\n".join(lines[:201]) + "\n", encoding="utf-8")
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["finetune"] = {
        "source": str(out),
        "train": str(tmp / "train.tsv"),
        "validation": str(tmp / "train.tsv"),
        "max_length": 32,
        "max_steps": 3,
        "val_every": 3,
    }
    from ablate.lightning_modules.config.load import build_config
    from ablate.sweeps.engine.runner import train

    result = train(build_config(tree))
    client = tracking.connect(result.tracking_uri)
    assert client.get_run(result.run_id).info.status == "FINISHED" and "sst2/accuracy" in result.metrics
    assert [a.path for a in client.list_artifacts(result.run_id, "tokenizer")] == ["tokenizer/tokenizer.json"]


def test_the_export_folder_is_an_init_from(exported):
    """Pre-training continues from the folder (the same data settings: the same tokenizer)."""
    _, base, _, out = exported
    from ablate.lightning_modules.config.load import build_config
    from ablate.sweeps.engine.runner import train

    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["init_from"] = str(out)
    tree["trainer"].update(max_steps=2, val_every=2)
    result = train(build_config(tree))
    assert tracking.connect(result.tracking_uri).get_run(result.run_id).info.status == "FINISHED"


class _FakeHub:
    """Records what ``huggingface_hub.HfApi`` was asked to do (no network)."""

    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("token", token))

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))


def test_push_to_hub_uploads_the_export_folder(exported, tmp_path, monkeypatch, capsys):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    _, _, result, _ = exported
    monkeypatch.setattr(huggingface_hub, "HfApi", _FakeHub)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")
    _FakeHub.calls = []
    out = tmp_path / "pushed"
    args = ["export", result.run_id, str(out), "--tracking-uri", result.tracking_uri]
    assert main([*args, "--push-to-hub", "me/tiny-albert", "--private"]) == 0
    assert "pushed to https://huggingface.co/me/tiny-albert" in capsys.readouterr().out
    assert _FakeHub.calls[0] == ("token", "hf_fake")
    assert _FakeHub.calls[1] == (
        "create_repo",
        {"repo_id": "me/tiny-albert", "repo_type": "model", "private": True, "exist_ok": True},
    )
    assert _FakeHub.calls[2][0] == "upload_folder" and _FakeHub.calls[2][1]["folder_path"] == str(out)
    assert 'AutoTokenizer.from_pretrained("me/tiny-albert")' in (out / "README.md").read_text()

    def refuse(self, **kwargs):
        raise OSError("401 Client Error: Unauthorized\nmore detail")

    monkeypatch.setattr(_FakeHub, "upload_folder", refuse)
    assert main([*args[:2], str(tmp_path / "refused"), *args[3:], "--push-to-hub", "me/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    refused = f"upload failed (401 Client Error: Unauthorized); the export is in {tmp_path / 'refused'}"
    assert err == [f"error: --push-to-hub me/x: {refused}"]

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    for repo, needle in [
        ("me/x", "no Hugging Face token"),
        ("not a repo!", "is not a Hub repository id"),
        ("x", "needs its namespace"),
    ]:
        assert main([*args[:2], str(tmp_path / "never"), *args[3:], "--push-to-hub", repo]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --push-to-hub") and needle in err[0], err
    assert main([*args[:2], str(tmp_path / "never"), *args[3:], "--private"]) == 2
    assert capsys.readouterr().err.strip() == "error: --private: only with --push-to-hub REPO"
    assert not (tmp_path / "never").exists()  # checked before exporting
