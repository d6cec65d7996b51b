"""Distillation in pre-training (``distill_module``: the one training step with a teacher link): transfer
losses, the frozen teacher, progressive freezing, layer and head maps, DistilBERT's initialisation and cosine."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch

from ablate.datamodules.pretrain import PretrainDataModule
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.losses import feature_map_loss
from ablate.lightning_modules.methods.pretrain import distill_module
from ablate.lightning_modules.model.encoder import Trace
from ablate.lightning_modules.model.heads import build_pretraining_model

V = 300
STUDENT = {"preset": "mobilebert-mini", "vocab_size": V, "max_position": 64}
TEACHER = {"preset": "ibbert-mini", "vocab_size": V, "max_position": 64, "intra_dim": 64, "ffn_dim": 128}


def _cfg(model: dict | None = None, **distill):
    overrides = {
        "distill.teacher": "runs:/teacher",
        "trainer.max_steps": 40,
        **{f"distill.{k}": v for k, v in distill.items()},
    }
    raw = {"model": model or STUDENT, "objective": {"sentence": "sop"}, "data": {"max_length": 64}}
    return build_config(raw, overrides)


def _teacher(model: dict | None = None):
    cfg = build_config({"model": model or TEACHER, "objective": {"sentence": "sop"}})
    torch.manual_seed(1)
    return build_pretraining_model(cfg.model, cfg.objective), cfg.model


def _batch(B: int = 4, T: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 11:] = False
    labels = torch.full((B, T), -100)
    labels[:, [2, 5, 7]] = ids[:, [2, 5, 7]]
    return {
        "input_ids": ids,
        "token_type_ids": (torch.arange(T) >= T // 2).long().expand(B, T).clone(),
        "attention_mask": mask,
        "mlm_labels": labels,
        "sentence_label": torch.tensor([0, 1, 0, 1]),
    }


TRANSFER = {"fmt_weight": 1.0, "at_weight": 1.0, "embed_weight": 1.0}


def test_every_loss_is_zero_when_the_student_is_the_teacher():
    cfg = _cfg(**TRANSFER)
    student = build_pretraining_model(cfg.model, cfg.objective)
    module = distill_module(cfg, copy.deepcopy(student), cfg.model, student).eval()
    losses = module.losses(_batch(), module.stages[0])
    assert set(losses) == {"fmt", "at", "embed", "mlm", "kd", "sentence"}
    for name in ("fmt", "at", "embed", "kd"):
        assert losses[name].item() == 0.0, name
    assert losses["mlm"].item() > 0  # the data losses are not transfer losses


def test_every_loss_is_positive_when_the_student_differs():
    cfg = _cfg(**TRANSFER)
    teacher, teacher_cfg = _teacher()
    module = distill_module(cfg, teacher, teacher_cfg).eval()
    losses = module.losses(_batch(), module.stages[0])
    for name in ("fmt", "at", "embed", "kd"):
        assert losses[name].item() > 0, name
        assert torch.isfinite(losses[name])


def test_no_gradient_reaches_the_teacher_and_its_weights_do_not_move():
    cfg = _cfg(**TRANSFER)
    teacher, teacher_cfg = _teacher()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    module = distill_module(cfg, teacher, teacher_cfg)
    module.train()
    assert not module.link.teacher.training  # train() keeps the teacher in eval mode (no dropout)
    optimizer = torch.optim.AdamW(module.trainable_modules().parameters(), lr=1e-2)
    for _ in range(3):
        loss = module.weighted(module.losses(_batch(), module.stages[0]))
        loss.backward()
        assert all(p.grad is None for p in teacher.parameters())
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.model.parameters())
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_layer_and_head_maps_when_depths_and_head_counts_differ():
    cfg = _cfg({**STUDENT, "num_layers": 2, "num_heads": 2})  # student: 2 layers x 2 heads
    teacher, teacher_cfg = _teacher({**TEACHER, "num_layers": 4, "num_heads": 4})  # teacher: 4 x 4
    module = distill_module(cfg, teacher, teacher_cfg).eval()
    assert module.link.layer_map == [1, 3]
    assert module.link.head_maps == [[[0, 1], [2, 3]]] * 2
    batch = _batch()
    losses = module.losses(batch, module.stages[0])
    # FMT pairs student layer i with teacher layer layer_map[i], nothing else
    args = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    s, t = Trace(attention=frozenset()), Trace(attention=frozenset())
    with torch.no_grad():
        module.model.encoder(*args, trace=s)
        teacher.encoder(*args, trace=t)
    expected = (
        feature_map_loss(s.hidden[0], t.hidden[1], args[2]) + feature_map_loss(s.hidden[1], t.hidden[3], args[2])
    ) / 2
    assert losses["fmt"].item() == pytest.approx(expected.item(), rel=1e-6)
    wrong = (
        feature_map_loss(s.hidden[0], t.hidden[0], args[2]) + feature_map_loss(s.hidden[1], t.hidden[1], args[2])
    ) / 2
    assert abs(losses["fmt"].item() - wrong.item()) > 1e-4  # the identity pairing gives another value


def test_an_explicit_layer_map_and_its_errors():
    teacher, teacher_cfg = _teacher({**TEACHER, "num_layers": 4})
    module = distill_module(_cfg({**STUDENT, "num_layers": 2}, layer_map=[0, 2]), teacher, teacher_cfg)
    assert module.link.layer_map == [0, 2]
    with pytest.raises(ConfigError, match="distill.layer_map: teacher layer 7 does not exist"):
        distill_module(_cfg({**STUDENT, "num_layers": 2}, layer_map=[0, 7]), teacher, teacher_cfg)
    with pytest.raises(ConfigError, match="distill.at_weight: .*3 heads, the teacher 4"):
        distill_module(_cfg({**STUDENT, "num_layers": 2, "intra_dim": 48, "num_heads": 3}), teacher, teacher_cfg)


def test_widths_that_differ_get_learned_projections():
    teacher, teacher_cfg = _teacher({**TEACHER, "hidden_dim": 96})
    module = distill_module(_cfg(**TRANSFER), teacher, teacher_cfg)
    assert module.link.project is not None and len(module.link.project) == 5  # 4 layers + the embedding
    assert module.link.project[0].in_features == 128 and module.link.project[0].out_features == 96
    params = {id(p) for p in module.trainable_modules().parameters()}
    assert all(id(p) in params for p in module.link.project.parameters())  # the optimizer trains them


def test_shared_projection_is_one_linear_and_equals_per_layer_ones_set_equal():
    teacher, teacher_cfg = _teacher({**TEACHER, "hidden_dim": 96})
    terms = {**TRANSFER, "cos_weight": 1.0}
    per_layer = distill_module(_cfg(**terms), teacher, teacher_cfg).eval()
    shared = distill_module(_cfg(**terms, projection="shared"), teacher, teacher_cfg, per_layer.model).eval()
    assert shared.link.project is not None and len(shared.link.project) == 1
    params = {id(p) for p in shared.trainable_modules().parameters()}
    assert all(id(p) in params for p in shared.link.project.parameters())
    assert per_layer.link.project is not None
    for linear in per_layer.link.project:  # every layer's and the embedding's: the shared one's weights
        linear.load_state_dict(shared.link.project[0].state_dict())
    batch = _batch()
    a, b = per_layer.losses(batch, per_layer.stages[0]), shared.losses(batch, shared.stages[0])
    for name in ("fmt", "embed", "cos"):
        assert a[name].item() == pytest.approx(b[name].item(), rel=1e-6), name
    per_layer.link.project[1].weight.data.add_(0.1)  # another layer's projection: per_layer differs
    assert per_layer.losses(batch, per_layer.stages[0])["fmt"].item() != pytest.approx(b["fmt"].item(), rel=1e-6)


def test_a_shared_projection_needs_widths_to_project_and_a_term_that_uses_it():
    teacher, teacher_cfg = _teacher()  # H 128, the student's
    with pytest.raises(ConfigError, match="distill.projection: 'shared' .* both are H=128 .*nothing to project"):
        distill_module(_cfg(projection="shared"), teacher, teacher_cfg)
    with pytest.raises(ConfigError, match="distill.projection: 'shared' .* all three are 0"):
        _cfg(projection="shared", fmt_weight=0.0)


def test_a_larger_student_vocabulary_and_a_smaller_one_without_its_map_are_refused():
    teacher, teacher_cfg = _teacher({**TEACHER, "vocab_size": V - 1})
    with pytest.raises(ConfigError, match=r"model.vocab_size: the student's vocabulary \(300\) is larger"):
        distill_module(_cfg(), teacher, teacher_cfg)
    teacher, teacher_cfg = _teacher({**TEACHER, "vocab_size": V + 1})
    with pytest.raises(ConfigError, match="distill.teacher: the student has its own vocabulary .* its tokenizer"):
        distill_module(_cfg(), teacher, teacher_cfg)
    with pytest.raises(ConfigError, match="distill.init_embeddings: 'word' copies .* not the teacher's"):
        distill_module(_cfg(init_embeddings="word"), teacher, teacher_cfg)
    same, same_cfg = _teacher()
    for field in ("mix_prob", "dual_weight"):
        with pytest.raises(ConfigError, match=f"distill.{field}: only for a student with its own"):
            distill_module(_cfg(**{field: 0.5}), same, same_cfg)


def test_a_teacher_must_read_sequences_as_long_as_the_students():
    teacher, teacher_cfg = _teacher({**TEACHER, "max_position": 32})
    with pytest.raises(ConfigError, match="distill.teacher: the teacher has 32 positions .* data.max_length 64"):
        distill_module(_cfg(), teacher, teacher_cfg)


def test_init_embeddings_copies_what_the_student_keeps():
    teacher, teacher_cfg = _teacher()
    cfg = _cfg({**STUDENT, "embed_norm": False, "position": "none"}, init_embeddings="all")
    module = distill_module(cfg, teacher, teacher_cfg)
    mine, theirs = module.model.encoder.embeddings, teacher.encoder.embeddings
    assert torch.equal(mine.word.weight, theirs.word.weight)
    assert torch.equal(mine.trigram.linear.weight, theirs.trigram.linear.weight)
    assert mine.position is None and "position.weight" not in module.copied
    word_only = distill_module(_cfg(init_embeddings="word"), teacher, teacher_cfg)
    assert word_only.copied == ["word.weight"]
    assert not torch.equal(word_only.model.encoder.embeddings.trigram.linear.weight, theirs.trigram.linear.weight)
    with pytest.raises(ConfigError, match="distill.init_embeddings: .*set model.embed_dim"):
        distill_module(_cfg({**STUDENT, "embed_dim": 16}, init_embeddings="word"), teacher, teacher_cfg)


class _Snapshots(pl.Callback):
    """The student's weights at given global steps (before that step trains)."""

    def __init__(self, steps: set[int]) -> None:
        self.steps, self.at = steps, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step in self.steps:
            self.at[trainer.global_step] = {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def test_progressive_freezes_finished_layers_bit_for_bit(tmp_path, wiki_validation):
    s = 3
    cfg = build_config(
        {
            "model": {**STUDENT, "num_layers": 2},
            "objective": {"sentence": "sop"},
            "data": {
                "corpus": str(wiki_validation),
                "max_length": 32,
                "batch_size": 4,
                "tokenizer_docs": 200,
                "num_workers": 0,
                "shuffle_buffer": 20,
                "cache_dir": str(tmp_path / "cache"),
            },
            "optim": {"lr": 1e-2, "warmup_steps": 0, "weight_decay": 0.1},
        },
        {
            "distill.teacher": "runs:/teacher",
            "distill.strategy": "progressive",
            "distill.stage_steps": s,
            "trainer.max_steps": 3 * s,
        },
    )
    teacher, teacher_cfg = _teacher({**TEACHER, "num_layers": 2})
    module = distill_module(cfg, teacher, teacher_cfg)
    assert [st.name for st in module.stages] == ["layer 0", "layer 1", "pd"]
    data = PretrainDataModule(cfg.data, cfg.objective, V, 0)
    snaps = _Snapshots({0, s, 2 * s})
    trainer = pl.Trainer(
        max_steps=3 * s,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[snaps],
    )
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    trainer.fit(module, datamodule=data)
    end_of_0, end_of_1, final = snaps.at[s], snaps.at[2 * s], module.model.state_dict()

    def part(state, prefix):
        return {k: v for k, v in state.items() if k.startswith(prefix)}

    layer0 = ("encoder.attentions.0.", "encoder.ffn_stacks.0.", "encoder.bottlenecks.0.", "encoder.embeddings.")
    layer1 = ("encoder.attentions.1.", "encoder.ffn_stacks.1.", "encoder.bottlenecks.1.")
    for prefix in layer0:  # frozen during stage "layer 1": bit-identical
        assert all(torch.equal(v, end_of_1[k]) for k, v in part(end_of_0, prefix).items()), prefix
    assert any(not torch.equal(v, end_of_1[k]) for k, v in part(end_of_0, layer1[0]).items())  # layer 1 trained
    for prefix in layer1:  # not trained before its stage
        assert all(torch.equal(v, end_of_0[k]) for k, v in part(snaps.at[0], prefix).items()), prefix
    assert any(not torch.equal(v, final[k]) for k, v in part(end_of_1, layer0[0]).items())  # PD trains everything
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in teacher_before.items())


BERT_TEACHER = {"preset": "bert-tiny", "vocab_size": V, "max_position": 64, "num_layers": 4}
BERT_STUDENT = {**BERT_TEACHER, "num_layers": 2}


def test_init_layers_every_other_copies_teacher_layers_0_and_2():
    teacher, teacher_cfg = _teacher(BERT_TEACHER)
    module = distill_module(_cfg(BERT_STUDENT, init_layers="every_other", init_embeddings="all"), teacher, teacher_cfg)
    assert module.copied[-2:] == ["layer 0 <- 0", "layer 1 <- 2"]
    s, t = module.model.encoder, teacher.encoder
    for i, j in ((0, 0), (1, 2)):
        for mine, theirs in zip(s.layer_modules(i), t.layer_modules(j), strict=True):
            for (name, a), b in zip(mine.state_dict().items(), theirs.state_dict().values(), strict=True):
                assert torch.equal(a, b), (i, name)
    mapped = distill_module(_cfg(BERT_STUDENT, init_layers="layer_map"), teacher, teacher_cfg)
    assert mapped.copied == ["layer 0 <- 1", "layer 1 <- 3"]  # the transfer's map: last on last


def test_init_layers_names_the_first_tensor_whose_shape_differs_and_a_missing_teacher_layer():
    teacher, teacher_cfg = _teacher(BERT_TEACHER)
    narrow = {**BERT_STUDENT, "ffn_dim": 256}
    wrong = r"student layer 0 cannot start from teacher layer 0: encoder.ffn_stacks.0.0.inner.up.weight is \(256"
    with pytest.raises(ConfigError, match=f"distill.init_layers: {wrong}"):
        distill_module(_cfg(narrow, init_layers="every_other"), teacher, teacher_cfg)
    with pytest.raises(
        ConfigError, match="distill.init_layers: every_other needs teacher layer 4, but the teacher has 4"
    ):
        distill_module(_cfg({**BERT_STUDENT, "num_layers": 3}, init_layers="every_other"), teacher, teacher_cfg)


def test_the_cosine_term_is_zero_for_the_teacher_itself_and_counts_in_the_last_stage():
    teacher, teacher_cfg = _teacher(BERT_TEACHER)
    same = distill_module(
        _cfg(BERT_TEACHER, cos_weight=1.0, at_loss="mse"), copy.deepcopy(teacher), teacher_cfg, teacher
    )
    losses = same.eval().losses(_batch(), same.stages[0])
    assert {"cos", "at", "fmt", "kd", "mlm", "sentence"} <= set(losses)
    assert losses["cos"].abs().item() < 1e-6 and losses["at"].item() < 1e-9 and losses["kd"].abs().item() < 1e-6
    cfg = _cfg(BERT_STUDENT, cos_weight=1.0, fmt_weight=1.0, at_weight=0.0, strategy="progressive", stage_steps=5)
    stages = distill_module(cfg, teacher, teacher_cfg).stages
    assert [s.losses for s in stages] == [("fmt",), ("fmt", "cos"), ("pd",)]
    student = distill_module(_cfg(BERT_STUDENT, cos_weight=1.0), teacher, teacher_cfg).eval()
    assert student.losses(_batch(), student.stages[0])["cos"].item() > 0
