"""Public-style checkpoints written locally with transformers: a tiny BERT (real architecture, config
and tokenizer files, random weights), as the Hub ships them, so that nothing is downloaded in tests."""

from __future__ import annotations

import json
import string
from pathlib import Path

SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # BERT's order: not ids 0..4
WORDS = (
    "the of and in to a is was for on as by with he that at from his it an were are which be this has had "
    "also first not their or but after its one new two who they been her she have all other city time "
    "when there more year years during school world can into would most about over between state film "
    "team up some only later war people american where made under known many three part these than"
).split()


def vocabulary(extra: int = 0) -> list[str]:
    """A small uncased WordPiece vocabulary covering English text: BERT's special tokens (in BERT's
    own order, with ``[unused]`` rows), characters, ``##`` characters and common words; ``extra``
    more ``[unusedN]`` rows make another vocabulary of another size."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = [f"##{c}" for c in string.ascii_lowercase + string.digits]
    tokens = [*SPECIALS, *(f"[unused{i + 2}]" for i in range(extra)), *chars, *pieces, *WORDS]
    return list(dict.fromkeys(tokens))  # one line a token, as a real vocab.txt


def write_vocab(folder: Path, tokens: list[str], lowercase: bool | None = True) -> Path:
    """``vocab.txt`` (and ``tokenizer_config.json`` with ``do_lower_case``, unless None) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    if lowercase is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase}), encoding="utf-8")
    return folder


def write_checkpoint(
    folder: Path,
    tokens: list[str] | None = None,
    layers: int = 2,
    hidden: int = 32,
    classifier: bool = False,
    vocab_only: bool = False,
    seed: int = 0,
) -> Path:
    """A tiny BERT checkpoint in ``folder`` as a public one is laid out: ``config.json`` and
    ``model.safetensors`` (``BertForPreTraining``, or ``BertForSequenceClassification`` with two labels
    for a fine-tuned one) with random weights, and its tokenizer: ``BertTokenizerFast.save_pretrained``
    (``tokenizer.json`` ...), or with ``vocab_only`` just ``vocab.txt`` and ``tokenizer_config.json``."""
    import torch
    import transformers

    tokens = vocabulary() if tokens is None else tokens
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(tokens),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    cls = transformers.BertForSequenceClassification if classifier else transformers.BertForPreTraining
    cls(config).save_pretrained(folder)
    if vocab_only:
        write_vocab(folder, tokens)
        return folder
    staging = write_vocab(folder.parent / f".{folder.name}-vocab", tokens)
    transformers.BertTokenizerFast.from_pretrained(str(staging)).save_pretrained(str(folder))
    return folder
