"""A student with its own, smaller vocabulary (Zhao et al.'s dual training): the id map built from two
real WordPiece tokenizers, the mixed teacher input, the teacher's prediction over the student
vocabulary, and where the ``dual`` term's gradient goes (the student's word table and the bridge,
through the frozen teacher)."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest
import torch

from ablate.datamodules.tokenizer import continuation_mask, train_tokenizer, vocabulary_map
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.pretrain import distill_module
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.lightning_modules.model.vocab_bridge import VocabBridge, VocabMap
from ablate.sweeps.engine.sources import Source, student_vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")

VS, VT = 300, 600  # the student's and the teacher's vocabulary sizes
TEACHER = {"preset": "bert-tiny", "vocab_size": VT, "embed_dim": 32, "hidden_dim": 32, "num_layers": 2}
TEACHER = {**TEACHER, "num_heads": 2, "ffn_dim": 64, "max_position": 64, "dropout": 0.0}
STUDENT = {**TEACHER, "vocab_size": VS, "embed_dim": 16, "hidden_dim": 16, "ffn_dim": 32}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, wiki_validation):
    """Two real WordPiece tokenizers of different sizes, trained on different wiki documents (so that
    some student tokens have no teacher counterpart), their files and text to encode."""
    with gzip.open(wiki_validation, "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in itertools.islice(f, 320)]
    teacher, student = train_tokenizer(docs[:150], VT, True), train_tokenizer(docs[150:300], VS, True)
    folder = tmp_path_factory.mktemp("tokenizers")
    teacher.save(str(folder / "teacher.json"))
    student.save(str(folder / "student.json"))
    return student, teacher, folder, docs[300:]


def _vocab(tokenizers) -> VocabMap:
    student, teacher, _, _ = tokenizers
    return VocabMap.of(vocabulary_map(student, teacher), continuation_mask(student), VS)


def _teacher(model: dict | None = None):
    cfg = build_config({"model": model or TEACHER})
    torch.manual_seed(1)
    return build_pretraining_model(cfg.model, cfg.objective).eval(), cfg.model


def _batch(tokenizers, B: int = 4, T: int = 32) -> dict[str, torch.Tensor]:
    student, _, _, docs = tokenizers
    ids = torch.tensor([student.encode(doc).ids[:T] for doc in docs[:B]])  # real text, [CLS] first
    labels = torch.full_like(ids, -100)
    labels[:, [3, 8, 13, 21]] = ids[:, [3, 8, 13, 21]]
    masked = ids.clone()
    masked[:, [3, 13]] = student.token_to_id("[MASK]")
    return {
        "input_ids": masked,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "mlm_labels": labels,
        "sentence_label": torch.tensor([0, 1] * (B // 2)),
    }


def test_the_id_map_pairs_tokens_of_the_same_text(tokenizers):
    student, teacher, _, _ = tokenizers
    ids = vocabulary_map(student, teacher)
    assert len(ids) == student.get_vocab_size() == VS
    for name in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):  # the specials, by name
        assert ids[student.token_to_id(name)] == teacher.token_to_id(name)
    for token, i in student.get_vocab().items():
        if ids[i] >= 0:
            assert teacher.id_to_token(ids[i]) == token
        else:
            assert teacher.token_to_id(token) is None
    unmapped = sum(i < 0 for i in ids)
    assert 0 < unmapped < VS // 4  # other documents: most tokens, not all, are the teacher's too
    vocab = VocabMap.of(ids, continuation_mask(student), VS + 20)  # rows beyond the tokenizer's tokens
    assert vocab.teacher_ids.shape == (VS + 20,) and (vocab.teacher_ids[VS:] == -1).all()
    assert vocab.coverage == pytest.approx(1 - unmapped / VS)
    assert vocab.continues[student.token_to_id("##s")] and not vocab.continues[student.token_to_id("the")]


def test_mixing_gives_every_mappable_position_in_the_teachers_vocabulary_at_0_and_none_at_1(tokenizers):
    student, _, _, _ = tokenizers
    teacher, _ = _teacher()
    vocab = _vocab(tokenizers)
    ids = _batch(tokenizers, B=8, T=64)["input_ids"]
    bridge = VocabBridge(vocab, teacher, 16, mix_prob=0.0)
    mappable = bridge.mappable(ids)
    tokens = [[student.id_to_token(int(i)) for i in row] for row in ids]
    for b, row in enumerate(tokens):
        for t, token in enumerate(row):
            whole = not token.startswith("##") and not (t + 1 < len(row) and row[t + 1].startswith("##"))
            assert bool(mappable[b, t]) == (whole and int(vocab.teacher_ids[ids[b, t]]) >= 0), (token, t)
    assert 0.1 < mappable.float().mean() < 1  # real text: whole words, and words of several pieces
    table = torch.randn(VS, 32)
    teacher_word = teacher.encoder.embeddings.word.weight
    theirs = teacher_word[vocab.teacher_ids[ids].clamp_min(0)]
    assert torch.equal(bridge.teacher_side(ids), mappable)
    assert torch.equal(bridge.teacher_side(ids, mix=False), mappable)
    words = bridge.words(ids, table, teacher_word)  # (B, T, E_t)
    assert torch.equal(words[mappable], theirs[mappable]) and torch.equal(words[~mappable], table[ids][~mappable])
    bridge.mix_prob = 1.0
    assert not bridge.teacher_side(ids).any()
    assert torch.equal(bridge.teacher_side(ids, mix=False), mappable)  # no dual term: no mixing
    assert torch.equal(bridge.words(ids, table, teacher_word), table[ids])
    bridge.mix_prob = 0.5
    share = torch.stack([bridge.teacher_side(ids)[mappable].float().mean() for _ in range(20)]).mean()
    assert 0.4 < share < 0.6


@pytest.mark.parametrize("head", ["factorized", "mobilebert"])
def test_the_teachers_prediction_over_the_student_vocabulary(tokenizers, head):
    """With the bridge the identity and the student's table the teacher's rows of the counterparts,
    the mixed sequence is the teacher's own input, and its prediction over the student vocabulary
    is its own prediction at the counterparts, whatever ``mix_prob``."""
    model = {**TEACHER, "embed_dim": 16, "mlm_head": head}
    teacher, _ = _teacher(model)
    torch.nn.init.normal_(teacher.mlm_head.bias)  # the bridge's output bias starts from the counterparts'
    vocab = _vocab(tokenizers)
    known, index = vocab.teacher_ids >= 0, vocab.teacher_ids.clamp_min(0)
    batch = _batch(tokenizers)
    batch["input_ids"] = torch.where(known[batch["input_ids"]], batch["input_ids"], 1)  # [UNK] for the rest
    batch["mlm_labels"] = torch.where(batch["mlm_labels"] >= 0, batch["input_ids"], -100)
    labels = batch["mlm_labels"]
    teacher_labels = torch.where(labels >= 0, index[labels.clamp_min(0)], -100)
    own = teacher({**batch, "input_ids": index[batch["input_ids"]], "mlm_labels": teacher_labels})
    for mix in (0.0, 0.5, 1.0):
        bridge = VocabBridge(vocab, teacher, 16, mix_prob=mix)
        with torch.no_grad():
            bridge.linear.weight.copy_(torch.eye(16))
            student_word = teacher.encoder.embeddings.word.weight[index]  # (V_s, E)
            out = bridge.teach(teacher, student_word, batch, None, predict=True, dual=True)
        assert out is not None and out.logits.shape == (own.mlm_logits.shape[0], VS)
        cols = known.nonzero().squeeze(1)
        torch.testing.assert_close(out.logits[:, cols], own.mlm_logits[:, index[cols]], rtol=1e-5, atol=1e-5)
        assert out.loss.item() > 0 and torch.equal(out.valid, own.mlm_valid)


def test_the_dual_term_trains_the_students_word_table_through_the_frozen_teacher(tokenizers):
    teacher, teacher_cfg = _teacher()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    raw = {"model": STUDENT, "objective": {"sentence": "sop"}, "data": {"max_length": 64}}
    cfg = build_config(raw, {"distill.teacher": "runs:/t", "distill.projection": "shared", "trainer.max_steps": 5})
    module = distill_module(cfg, teacher, teacher_cfg, vocab=_vocab(tokenizers)).train()
    assert (module.cfg.distill.mix_prob, module.cfg.distill.dual_weight) == (0.5, 1.0)  # resolved, as logged
    assert module.weights["dual"] == 1.0 and module.link.vocab is not None
    learned = {id(p) for p in module.trainable_modules().parameters()}
    assert all(id(p) in learned for p in module.link.vocab.parameters())  # the optimizer trains the bridge
    batch = _batch(tokenizers)
    losses = module.losses(batch, module.stages[0])
    assert {"mlm", "sentence", "kd", "dual", "fmt", "at"} <= set(losses)
    word, bridge = module.model.encoder.embeddings.word.weight, module.link.vocab
    losses["dual"].backward(retain_graph=True)
    assert word.grad is not None and word.grad.abs().sum() > 0  # through the frozen teacher
    assert bridge.linear.weight.grad is not None and bridge.bias.grad is not None
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is None for p in module.model.encoder.attentions.parameters())  # the teacher's term only
    module.zero_grad()
    losses["kd"].backward()  # the teacher's logits are detached: KD trains the student, not the bridge
    assert bridge.linear.weight.grad is None or bridge.linear.weight.grad.abs().sum() == 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.model.encoder.attentions.parameters())
    optimizer = torch.optim.AdamW(module.trainable_modules().parameters(), lr=1e-2)
    module.weighted(module.losses(batch, module.stages[0])).backward()
    optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_a_teacher_tokenizer_that_reads_text_otherwise_is_refused(tokenizers, tmp_path):
    student, _, folder, _ = tokenizers
    teacher, teacher_cfg = _teacher()
    cased = train_tokenizer(["The Cat sat on the Mat. " * 50] * 20, VT, lowercase=False)
    cased.save(str(tmp_path / "cased.json"))
    student_cfg = build_config({"model": STUDENT}).model
    ok = student_vocabulary(
        Source("t", teacher_cfg, teacher, folder / "teacher.json"), folder / "student.json", student_cfg
    )
    assert ok is not None and torch.equal(ok.teacher_ids, _vocab(tokenizers).teacher_ids)
    with pytest.raises(ConfigError, match="distill.teacher: t's tokenizer normalizes or splits text otherwise"):
        student_vocabulary(
            Source("t", teacher_cfg, teacher, tmp_path / "cased.json"), folder / "student.json", student_cfg
        )
