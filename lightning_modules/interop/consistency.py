"""A checkpoint folder's files checked against each other before any weight is loaded: ``config.json``'s
shape fields against themselves, against ``model.safetensors``'s embedding and against ``ablate.yaml``
(an export writes both), and a ``tokenizer.json`` against the vocabulary the model has rows for."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.yamlio import Json

WEIGHTS = "model.safetensors"
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
"""``config.json`` fields that give a shape: positive whole numbers."""
SAME_AS_ABLATE = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_dim",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "max_position_embeddings": "max_position",
}
"""``config.json`` field -> the ``model.*`` field of ``ablate.yaml`` that says the same."""


def check_hf_config(path: Path, config: Mapping[str, Json]) -> None:
    """``config.json`` (at ``path``): its shape fields whole and positive, ``hidden_size`` a multiple of
    ``num_attention_heads`` (BERT, ALBERT), and the folder's embedding rows ``vocab_size``. ConfigError
    naming the file and both fields."""
    for key in SHAPE_FIELDS:
        value = config.get(key)
        if key in config and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{path}: {key}: {value!r} is not a positive whole number")
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if config.get("model_type") in ("bert", "albert") and isinstance(hidden, int) and isinstance(heads, int):
        if hidden % heads:
            raise ConfigError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    rows = embedding_rows(path.parent / WEIGHTS)
    vocab = config.get("vocab_size")
    if rows is not None and isinstance(vocab, int) and rows[1] != vocab:
        raise ConfigError(f"{path}: vocab_size {vocab}, but {WEIGHTS}'s {rows[0]} has {rows[1]} rows (one per token)")


_WORD = ("embeddings.word_embeddings.weight", "embeddings.word.weight")  # transformers', ablate's


def embedding_rows(weights: Path) -> tuple[str, int] | None:
    """The word embedding's name and rows in a ``model.safetensors`` (its header only), or None when it
    has none or is unreadable (the loading names that)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            names = [n for n in f.keys() if n.endswith(_WORD)]
            return (names[0], int(f.get_slice(names[0]).get_shape()[0])) if len(names) == 1 else None
    except (SafetensorError, OSError, ValueError):
        return None


def check_against_ablate(path: Path, config: Mapping[str, Json], yaml_path: Path, model: ModelConfig) -> None:
    """``config.json`` and ``ablate.yaml`` of one folder (an export writes both) describe one model."""
    for theirs, ours in SAME_AS_ABLATE.items():
        mine = getattr(model, ours)
        if theirs in config and config[theirs] != mine:
            raise ConfigError(
                f"{path}: {theirs} {config[theirs]!r}, but {yaml_path.name} beside it says model.{ours} {mine!r} "
                "(the two files describe different models)"
            )


def check_tokenizer_fits(folder: Path, vocab_size: int, said_by: str) -> None:
    """A folder's ``tokenizer.json`` has no more tokens than the model's ``vocab_size`` (``said_by``: the
    file and field that give it): a token without an embedding row. ConfigError naming both."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return
    from tokenizers import Tokenizer

    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size()
    except Exception as exc:  # noqa: BLE001 - any parse failure of the Rust reader
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"{path}: not a tokenizer ({first})") from None
    if size > vocab_size:
        raise ConfigError(
            f"{path}: {size} tokens, but {said_by} {vocab_size} (a token without an embedding row: not this "
            "model's tokenizer)"
        )
