"""Every model family's pre-training forward and backward traces as one graph (no graph breaks, no
recompiles across batches or padding), and its layer block, what ``trainer.compile`` compiles, as one
graph per layer shape that every layer and every later model of that shape reuses (dynamo's own
explain and counters)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.model import LayerSpec
from ablate.lightning_modules.measure.measuring import placed, random_batch
from ablate.lightning_modules.model.encoder import LAYER_RECOMPILE_LIMIT, Trace, recompile_limit
from ablate.lightning_modules.model.heads import build_pretraining_model

T, B = 32, 4
FAMILIES = {
    "albert-all-shared": {"preset": "albert-tiny"},
    "albert-attn-shared": {"preset": "albert-tiny", "sharing": "attn"},
    "albert-ffn-shared": {"preset": "albert-tiny", "sharing": "ffn"},
    "bert": {"preset": "bert-tiny", "dropout": 0.1},
    "mobilebert": {"preset": "mobilebert-mini"},
    "ibbert": {"preset": "ibbert-mini"},
    "schubert": {
        "preset": "bert-tiny",
        "layers": [
            {"num_heads": h, "qk_dim": k, "v_dim": v, "ffn_dim": f}
            for h, k, v, f in [(4, 32, 32, 512), (2, 16, 48, 256), (3, 24, 32, 384), (1, 32, 16, 128)]
        ],
    },
}


def _batches(vocab: int, padded: bool) -> list[dict[str, torch.Tensor]]:
    """Three batches of one shape; with ``padded``, rows of different lengths (as the stream pads them)."""
    out = []
    for seed in range(3):
        batch = random_batch(vocab, B, T, torch.device("cpu"), seed=seed)
        if padded:
            lengths = torch.tensor([T, T - 5 - seed, T // 2, 9])
            real = torch.arange(T)[None, :] < lengths[:, None]
            batch["attention_mask"] = real
            batch["input_ids"] = batch["input_ids"].masked_fill(~real, 0)
            batch["mlm_labels"] = batch["mlm_labels"].masked_fill(~real, -100)
        out.append(batch)
    return out


#: Every family with padded rows; BERT's also packed (no padding). Nothing in the model reads the mask's
#: values, so the two trace alike: the packed case once, as a guard against a branch on them.
LAYOUTS = [pytest.param(family, True, id=f"{family}-padded") for family in FAMILIES]
LAYOUTS.append(pytest.param("bert", False, id="bert-packed"))


@pytest.mark.parametrize(("family", "padded"), LAYOUTS)
def test_pretraining_step_is_one_graph(family: str, padded: bool) -> None:
    """Two layers (its presets have four; schuBERT's four shapes stay): the whole model is one graph, so a
    break or a recompile between layers shows between the first and the second, at half the trace."""
    fields = FAMILIES[family] if "layers" in FAMILIES[family] else {**FAMILIES[family], "num_layers": 2}
    if "layers" in fields:
        fields = {**fields, "layers": [LayerSpec(**spec) for spec in fields["layers"]]}
    cfg = build_config({"model": fields, "objective": {"sentence": "sop", "mask_prob": 0.15}})
    torch.manual_seed(0)
    model = build_pretraining_model(cfg.model, cfg.objective).train()
    batches = _batches(cfg.model.vocab_size, padded)

    explained = torch._dynamo.explain(model)(batches[0])
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # fullgraph: a break would raise
    for batch in batches:
        out = compiled(batch)
        out.loss.backward()
        assert torch.isfinite(out.loss)
    assert counters["stats"]["unique_graphs"] == 1  # one graph for every layer and every batch
    assert not counters["recompiles"], dict(counters["recompiles"])
    assert sum(counters["graph_break"].values()) == 0
    model.eval()  # the same numbers as eager (dropout draws differ once compiled)
    torch.testing.assert_close(compiled(batches[-1]).loss, model(batches[-1]).loss, rtol=1e-5, atol=1e-5)


def _model(family: str, sentence: str = "sop") -> tuple[object, torch.nn.Module]:
    fields = FAMILIES[family]
    if "layers" in fields:
        fields = {**fields, "layers": [LayerSpec(**spec) for spec in fields["layers"]]}
    cfg = build_config({"model": fields, "objective": {"sentence": sentence, "mask_prob": 0.15}})
    torch.manual_seed(0)
    return cfg, build_pretraining_model(cfg.model, cfg.objective).train()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_layer_block_is_one_graph_per_layer_shape(family: str) -> None:
    """The block, compiled alone (fullgraph: a break would raise), builds one graph per distinct layer
    shape and one for the last layer at the prediction rows, whatever the sharing: no recompile from
    one layer to the next, none from batch to batch; the losses and a trace's attention scores are eager's."""
    cfg, model = _model(family)
    specs = cfg.model.layer_specs()
    torch._dynamo.reset()
    counters.clear()
    layer = model.encoder.layer
    layer.compile(backend="aot_eager", fullgraph=True, dynamic=False, recompile_limit=LAYER_RECOMPILE_LIMIT)
    for batch in _batches(cfg.model.vocab_size, padded=True):
        out = model(batch)
        out.loss.backward()
        assert torch.isfinite(out.loss)
    assert counters["stats"]["unique_graphs"] == len(set(specs[:-1])) + 1
    assert sum(counters["graph_break"].values()) == 0
    model.eval()
    with torch.compiler.set_stance("force_eager"):
        eager = model(batch)
        eager_trace = Trace()
        model.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], eager_trace)
    torch.testing.assert_close(model(batch).loss, eager.loss, rtol=1e-5, atol=1e-5)
    trace = Trace()  # a distillation's trace: every layer's attention kept (a list the block appends to)
    model.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], trace)
    assert sorted(trace.scores) == list(range(len(specs)))
    for i, scores in trace.scores.items():
        torch.testing.assert_close(scores, eager_trace.scores[i], rtol=1e-5, atol=1e-5)


def test_compiled_pretraining_reuses_its_layers_across_heads_objectives_and_rates() -> None:
    """``trainer.compile`` with inductor, as a study's worker runs it: the first module compiles its
    layer block (two graphs: every layer but the last, and the last at the prediction rows) and gives
    eager's losses; a second module differing in its sentence objective (no sentence head) and its
    learning rate compiles nothing; validation runs eager (nothing compiled); a copy of the model
    and a measurement run uncompiled."""
    from ablate.lightning_modules.methods.pretrain import PretrainModule

    model = {"preset": "bert-tiny", "num_layers": 2, "hidden_dim": 32, "embed_dim": 32, "num_heads": 2}
    model |= {"ffn_dim": 64, "vocab_size": 512, "max_position": 64}
    torch._dynamo.reset()
    counters.clear()
    batch = random_batch(512, 2, 16, torch.device("cpu"), seed=0)
    graphs = []
    for sentence, lr in (("sop", 1e-4), ("none", 3e-4)):
        cfg = build_config(
            {
                "model": model,
                "objective": {"sentence": sentence, "mask_prob": 0.15},
                "optim": {"lr": lr},
                "trainer": {"max_steps": 10, "compile": True},
            }
        )
        torch.manual_seed(0)
        module = PretrainModule(cfg).eval()  # no dropout: the same numbers as eager
        losses = module.losses(batch, module.stages[0])
        sum(losses.values()).backward()
        graphs.append(counters["stats"]["unique_graphs"])
        with torch.compiler.set_stance("force_eager"):
            eager = module.losses(batch, module.stages[0])
        for name, value in losses.items():
            torch.testing.assert_close(value, eager[name], rtol=1e-5, atol=1e-5)
    assert graphs == [2, 2], graphs  # the second module compiled no layer again
    assert sum(counters["graph_break"].values()) == 0
    module.validation_step(batch, 0)
    assert counters["stats"]["unique_graphs"] == 2  # validation: eager
    layer = module.model.encoder.layer
    assert layer._compiled_call_impl is not None
    assert copy.deepcopy(module.model).encoder.layer._compiled_call_impl is None
    with placed(module.model, None, train=True):
        assert layer._compiled_call_impl is None  # measured uncompiled
    assert layer._compiled_call_impl is not None


def _step_graphs(module, batch: dict[str, torch.Tensor]) -> None:
    """Every stage of ``module``'s schedule: its loss terms (student, frozen teacher, projections, KD,
    exits) compile as one graph, with no breaks, and the same graph serves the next batch."""
    for stage in module.stages:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(module.losses)(batch, stage)
        assert explained.graph_break_count == 0, (stage.name, explained.break_reasons)
        assert explained.graph_count == 1, stage.name


@pytest.mark.parametrize("vocabulary", ["the teacher's", "its own"])
def test_every_distillation_stage_is_one_graph(vocabulary: str):
    """With its own vocabulary (Zhao et al.), the student's stages add the teacher's mixed input
    (a draw, a gather, a where) and its prediction over the student vocabulary, still one graph."""
    from ablate.lightning_modules.methods.pretrain import distill_module
    from ablate.lightning_modules.model.vocab_bridge import VocabMap

    own = vocabulary == "its own"
    model = {"preset": "bert-tiny", "num_layers": 2, "hidden_dim": 64, "embed_dim": 64, "num_heads": 2}
    distill = {"teacher": "runs:/t", "strategy": "joint", "stage_steps": 5, "at_loss": "mse", "cos_weight": 1.0}
    if own:
        model, distill = {**model, "vocab_size": 4096}, {**distill, "projection": "shared"}
    cfg = build_config({"model": model, "distill": distill, "trainer": {"max_steps": 10}})
    teacher_cfg = build_config({"model": {"preset": "bert-tiny"}})
    torch.manual_seed(0)
    teacher = build_pretraining_model(teacher_cfg.model, cfg.objective)
    ids = [i if i % 7 else -1 for i in range(4096)]  # every seventh student token without a counterpart
    vocab = VocabMap.of(ids, [i % 5 == 0 for i in range(4096)], 4096) if own else None
    module = distill_module(cfg, teacher, teacher_cfg.model, vocab=vocab).train()
    assert (module.link.vocab is not None) == own
    _step_graphs(module, random_batch(cfg.model.vocab_size, B, T, torch.device("cpu"), seed=0))


def test_every_fine_tuning_stage_is_one_graph():
    from ablate.lightning_modules.methods.finetune import FinetuneModule, task_distill_module
    from ablate.lightning_modules.model.classifier import build_classifier

    ft = {"source": "runs:/s", "task": "t", "train": "a.tsv", "validation": "b.tsv", "max_steps": 10}
    plain = build_config({"model": {"preset": "bert-tiny"}, "finetune": {**ft, "exits": True, "exit_steps": 4}})
    torch.manual_seed(0)
    pretrained = build_pretraining_model(plain.model, plain.objective)
    batch = random_batch(plain.model.vocab_size, B, T, torch.device("cpu"), seed=0)
    batch["labels"] = torch.tensor([0, 1, 1, 0])
    fastbert = FinetuneModule(plain, pretrained).train()
    _step_graphs(fastbert, batch)
    fastbert.self_distillation()  # FastBERT's second phase: only the exits train
    _step_graphs(fastbert, batch)
    distill = {"teacher": "runs:/t", "strategy": "joint", "stage_steps": 5, "at_loss": "mse", "fmt_weight": 1.0}
    cfg = build_config({"model": {"preset": "bert-tiny"}, "finetune": ft, "distill": distill})
    teacher = build_classifier(pretrained, 2, 0.0, 0.02)
    _step_graphs(task_distill_module(cfg, pretrained, teacher, cfg.model).train(), batch)


def test_recompile_limit_on_a_torch_without_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's torch.compile has no recompile_limit (a GPU image's torch): the limit goes to dynamo's
    config instead, raised and never lowered."""
    import torch._dynamo

    assert recompile_limit(LAYER_RECOMPILE_LIMIT) == {"recompile_limit": LAYER_RECOMPILE_LIMIT}

    def older_compile(model: object = None, *, mode: str | None = None, dynamic: bool | None = None) -> object:
        return model

    monkeypatch.setattr(torch, "compile", older_compile)
    config = torch._dynamo.config  # its own patch(): monkeypatch's undo would delete a config entry
    with config.patch(recompile_limit=8):
        assert recompile_limit(LAYER_RECOMPILE_LIMIT) == {}
        assert config.recompile_limit == LAYER_RECOMPILE_LIMIT
    with config.patch(recompile_limit=100):
        recompile_limit(LAYER_RECOMPILE_LIMIT)
        assert config.recompile_limit == 100


@pytest.mark.parametrize("family", ["bert", "mobilebert"])
def test_a_fine_tuning_encoder_compiles_one_graph_for_every_bucketed_width(family: str) -> None:
    """``compile_layers(any_length=True)`` (a fine-tuning run: batches in a few bucketed widths): the
    sequence length is a dimension of the block's graph, so the widths 16, 32 and 64 build the graphs
    one width builds, not one each (compiled with ``dynamic=False``, as fine-tuning was before); the
    outputs are eager's."""
    from ablate.lightning_modules.model.classifier import build_classifier

    cfg, model = _model(family)

    def graphs(any_length: bool) -> int:
        torch.manual_seed(0)
        classifier = build_classifier(model, 2, 0.0, 0.5).eval()  # no dropout: eager's outputs to compare
        encoder = classifier.model.encoder if hasattr(classifier, "model") else classifier.encoder
        encoder.compile_layers(any_length=any_length)
        assert encoder.any_length is any_length
        dynamic = None if any_length else False
        encoder.layer.compile(
            backend="aot_eager", fullgraph=True, dynamic=dynamic, recompile_limit=LAYER_RECOMPILE_LIMIT
        )
        torch._dynamo.reset()
        counters.clear()
        for width in (16, 32, 64):
            batch = random_batch(cfg.model.vocab_size, B, width, torch.device("cpu"), seed=width)
            logits = classifier(batch)
            logits.sum().backward()
            with torch.compiler.set_stance("force_eager"):
                torch.testing.assert_close(logits, classifier(batch), rtol=1e-5, atol=1e-5)
        return int(counters["stats"]["unique_graphs"])

    per_width, any_width = graphs(False), graphs(True)
    assert any_width >= 1 and per_width == 3 * any_width


@pytest.mark.parametrize("kind", ["classification", "span"])
def test_a_compiled_fine_tuning_run_compiles_its_encoder_and_validates_eager(kind: str) -> None:
    """``trainer.compile`` compiles the layer block of every fine-tuning module, a span task's (SQuAD) as a
    classifier's; its training step builds the block's graph, and a dev batch builds none (eager)."""
    from ablate.lightning_modules.methods.finetune import FinetuneModule
    from ablate.lightning_modules.methods.span import SpanModule

    span = kind == "span"
    ft = {"source": "runs:/s", "task": "squad" if span else "t", "kind": kind, "train": "a", "validation": "b"}
    ft |= {"metric": "f1" if span else "accuracy", "max_steps": 4}
    cfg = build_config({"model": {"preset": "bert-tiny"}, "finetune": ft, "trainer": {"compile": True}})
    torch.manual_seed(0)
    module = (SpanModule if span else FinetuneModule)(cfg, build_pretraining_model(cfg.model, cfg.objective))
    encoder = module.model.encoder
    assert encoder.layer._compiled_call_impl is not None and encoder.any_length
    encoder.layer.compile(backend="aot_eager", fullgraph=True, recompile_limit=LAYER_RECOMPILE_LIMIT)

    def batch_of(rows: int, width: int) -> dict[str, torch.Tensor]:
        batch = random_batch(cfg.model.vocab_size, rows, width, torch.device("cpu"), seed=width)
        spans = {"start_positions": torch.arange(rows), "end_positions": torch.arange(rows) + 1}
        return batch | spans | {"labels": torch.arange(rows) % 2, "feature": torch.arange(rows)}

    batch = batch_of(B, T)
    torch._dynamo.reset()
    counters.clear()
    module.train()
    module.task_output(module.model, batch, None).loss.backward()
    trained = int(counters["stats"]["unique_graphs"])
    module.eval()
    with torch.no_grad():
        module.validation_step(batch_of(3, 20), 0)  # a dev batch: its own rows and width
    scored = len(module.window_logits) if span else module.dev_metrics()["loss"].update_count
    assert scored == 3 if span else scored == 1
    assert trained >= 1 and int(counters["stats"]["unique_graphs"]) == trained
