"""A tokenizer folder's JSON files read strictly and checked against each other: ``tokenizer_config.json``'s
casing (:func:`casing`), and its ``tokenizer_class`` and ``do_lower_case`` against ``tokenizer.json``
(:func:`check_tokenizer_files`); a file that does not parse is an error naming it, never skipped."""

from __future__ import annotations

from pathlib import Path

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.jsonio import read_json

CONFIG_FILE = "tokenizer_config.json"


def casing(folder: Path, lowercase: bool) -> tuple[bool, bool | None]:
    """``do_lower_case`` and ``strip_accents`` of a folder's ``tokenizer_config.json``; ``lowercase``
    (``data.lowercase``) where it has none. ConfigError naming the file (and field) when it does not
    parse or says neither true nor false: read beside the vocabulary, it is never skipped."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return lowercase, None
    config = read_json(path)
    assert isinstance(config, dict)  # read_json(expect=dict)
    for key in ("do_lower_case", "strip_accents"):
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise ConfigError(f"{path}: {key}: {config[key]!r} is neither true nor false")
    lower, accents = config.get("do_lower_case", lowercase), config.get("strip_accents")
    return bool(lower), None if accents is None else bool(accents)


_MODEL_OF_CLASS = {"Bert": "WordPiece", "MobileBert": "WordPiece", "DistilBert": "WordPiece", "Electra": "WordPiece"}
_MODEL_OF_CLASS |= {"Albert": "Unigram", "XLNet": "Unigram", "T5": "Unigram", "GPT2": "BPE", "Roberta": "BPE"}
"""The ``tokenizers`` model (``tokenizer.json``'s ``model.type``) of a transformers ``tokenizer_class``."""


def check_tokenizer_files(folder: Path) -> None:
    """A folder's ``tokenizer.json`` (parsed strictly) and its ``tokenizer_config.json`` say the same:
    the model its ``tokenizer_class`` is made of, and the lowercasing (``do_lower_case`` against BERT's
    normalizer's ``lowercase``). ConfigError naming both files and fields."""
    path, config_path = folder / "tokenizer.json", folder / CONFIG_FILE
    tree = read_json(path)
    assert isinstance(tree, dict)  # read_json(expect=dict)
    if not config_path.is_file():
        return
    config = read_json(config_path)
    assert isinstance(config, dict)  # read_json(expect=dict)
    casing(folder, True)  # its casing fields, checked
    model, norm = tree.get("model"), tree.get("normalizer")
    kind = model.get("type") if isinstance(model, dict) else None
    cls = str(config.get("tokenizer_class") or "").removesuffix("Fast").removesuffix("Tokenizer")
    if cls in _MODEL_OF_CLASS and kind is not None and _MODEL_OF_CLASS[cls] != kind:
        raise ConfigError(
            f"{config_path}: tokenizer_class {config['tokenizer_class']!r} (a {_MODEL_OF_CLASS[cls]} tokenizer), but "
            f"{path.name} beside it has model.type {kind!r}"
        )
    lower = config.get("do_lower_case")
    if isinstance(norm, dict) and norm.get("type") == "BertNormalizer" and isinstance(lower, bool):
        if norm.get("lowercase") is not lower:
            raise ConfigError(
                f"{config_path}: do_lower_case {str(lower).lower()}, but {path.name} beside it has "
                f"normalizer.lowercase {str(norm.get('lowercase')).lower()}"
            )
