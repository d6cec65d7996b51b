"""The WordPiece tokenizer: BERT's, trained on the corpus and cached by a fingerprint of everything
that determines it, its ids put in one order after training so that the same documents give the
same tokenizer in any process; or a given one (``data.tokenizer``: :func:`given_tokenizer`,
:func:`checkpoint_tokenizer`), copied into the same cache (docs/data.md, "The tokenizer")."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tqdm.auto import tqdm

from ablate.datamodules.catalog import resolve_model
from ablate.datamodules.corpus import iter_documents
from ablate.datamodules.sources import CorpusSpec, resolve_corpus
from ablate.datamodules.tokenizer_files import casing, check_tokenizer_files
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import DataConfig, ExperimentConfig

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""Special tokens, at ids 0..4 in this order."""
NUM_SPECIAL = len(SPECIAL_TOKENS)
RECIPE_VERSION = 4
"""Bumped whenever the training recipe changes, so stale cached tokenizers miss."""
_TRAIN_BATCH = 256  # documents per batch handed to the Rust trainer
_PROGRESS_DELAY_S = 3.0  # the progress bar appears only if reading takes longer


class SpecialIds(NamedTuple):
    """Ids of the special tokens."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


def special_ids(tokenizer: Tokenizer) -> SpecialIds:
    """The ids of ``[PAD] [UNK] [CLS] [SEP] [MASK]`` in ``tokenizer``.

    Raises:
        ValueError: the tokenizer lacks one of them.
    """
    ids = [tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS]
    if any(i is None for i in ids):
        raise ValueError(f"tokenizer lacks special tokens {SPECIAL_TOKENS}")
    return SpecialIds(*ids)  # type: ignore[arg-type]


def cache_root(data: DataConfig) -> Path:
    """The cache folder: ``data.cache_dir``, else ``$ABLATE_CACHE``, else ``~/.cache/ablate``."""
    return Path(data.cache_dir).expanduser() if data.cache_dir is not None else default_cache_root()


def default_cache_root() -> Path:
    """ablate's cache folder where a config names none: ``$ABLATE_CACHE``, else ``~/.cache/ablate``."""
    env = os.environ.get("ABLATE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ablate"


def fingerprint(data: DataConfig, vocab_size: int, spec: CorpusSpec | None = None) -> str:
    """A hex digest of everything the trained tokenizer depends on.

    That is the corpus identity (resolved files with sizes and mtimes, or the hub
    name), the text field, the validation fraction (training documents only), the
    text-document grouping, the
    vocabulary size, lowercasing, ``tokenizer_docs`` and the recipe version.
    """
    spec = spec or resolve_corpus(data.corpus, data.text_field)
    key = {
        "corpus": spec.identity(),
        "val_fraction": data.val_fraction,
        "text_doc_chars": data.text_doc_chars,
        "vocab_size": vocab_size,
        "lowercase": data.lowercase,
        "tokenizer_docs": data.tokenizer_docs,
        "recipe": RECIPE_VERSION,
    }
    return hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=10).hexdigest()


def tokenizer_path(data: DataConfig, vocab_size: int, spec: CorpusSpec | None = None) -> Path:
    """Where the tokenizer for this corpus and settings is (or will be) cached."""
    return cache_root(data) / "tokenizers" / f"wordpiece-v{vocab_size}-{fingerprint(data, vocab_size, spec)}.json"


def new_tokenizer(lowercase: bool) -> Tokenizer:
    """An untrained BERT WordPiece tokenizer (normalizer, pre-tokenizer, post-processor)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def train_tokenizer(documents: Iterable[str], vocab_size: int, lowercase: bool) -> Tokenizer:
    """Train a WordPiece tokenizer on ``documents`` (consumed once, in batches).

    Args:
        documents: training texts.
        vocab_size: target vocabulary size, special tokens included.
        lowercase: lowercase and strip accents.

    Returns:
        The trained tokenizer, specials at ids 0..4 and a ``[CLS] A [SEP] B [SEP]``
        post-processor (used by ``encode(a, b)``; pre-training adds specials itself).

    Raises:
        ConfigError: ``vocab_size`` cannot hold the specials and the alphabet.
    """
    tok = new_tokenizer(lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=max(1, min(1000, (vocab_size - NUM_SPECIAL) // 4)),  # chars and their ## twins fit
        continuing_subword_prefix="##",
        show_progress=False,
    )
    docs = iter(documents)
    batches: Iterator[list[str]] = iter(lambda: list(itertools.islice(docs, _TRAIN_BATCH)), [])
    tok.train_from_iterator(batches, trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise ConfigError(f"model.vocab_size: {vocab_size} is too small for this corpus's alphabet")
    learned = sorted(token for token in tok.get_vocab() if token not in SPECIAL_TOKENS)
    ids = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *learned])}  # one order, whatever the process
    tok.model = models.WordPiece(ids, unk_token="[UNK]", continuing_subword_prefix="##")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def _save_atomic(tok: Tokenizer, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        tok.save(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_vocab_size(cfg: ExperimentConfig) -> int | None:
    """The vocabulary size a run's tokenizer must have: ``model.vocab_size`` where the run trains that
    model (pre-training, distillation) or trains its tokenizer; None for a given ``data.tokenizer`` in
    a run whose model is its source's (its source's tokenizer is what it is checked against)."""
    own_model = cfg.regime in ("pretrain", "distill")
    return cfg.model.vocab_size if own_model or cfg.data.tokenizer is None else None


def load_or_train_tokenizer(data: DataConfig, vocab_size: int | None) -> tuple[Tokenizer, Path]:
    """Load the cached tokenizer for this corpus and settings, or train and cache it; with
    ``data.tokenizer``, that tokenizer (:func:`given_tokenizer`).

    Training reads the first ``data.tokenizer_docs`` training documents, with a
    progress bar when that takes more than a few seconds, and writes the cache file
    atomically (temporary file, then rename): a crash leaves no partial file.

    Args:
        data: corpus, ``lowercase``, ``tokenizer_docs``, ``cache_dir``.
        vocab_size: ``model.vocab_size``; None: a given tokenizer's own size (a run whose model is
            its source's), never None when one is trained.

    Returns:
        The tokenizer and the path of its JSON file (log it as a run artifact).

    Raises:
        DataError: the corpus is missing, unreadable or has no training document.
    """
    if data.tokenizer is not None:
        return given_tokenizer(data, vocab_size)
    if vocab_size is None:
        raise ValueError("a trained tokenizer needs its vocab_size")
    spec = resolve_corpus(data.corpus, data.text_field)
    path = tokenizer_path(data, vocab_size, spec)
    try:  # an unusable cache folder fails now, not after training the tokenizer
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = "" if data.cache_dir is not None else " (set data.cache_dir or $ABLATE_CACHE)"
        raise DataError(
            f"data.cache_dir: cannot create the tokenizer cache folder {path.parent}: {exc.strerror or exc}{where}"
        ) from None
    if path.is_file():
        try:
            tok = Tokenizer.from_file(str(path))
            special_ids(tok)
            return tok, path
        except Exception:  # noqa: BLE001 - a corrupt cache entry is retrained
            path.unlink(missing_ok=True)
    docs = itertools.islice(iter_documents(data, "train", spec=spec), data.tokenizer_docs)
    bar = tqdm(
        docs,
        total=data.tokenizer_docs,
        desc=f"training tokenizer (V={vocab_size})",
        unit="doc",
        delay=_PROGRESS_DELAY_S,
        leave=False,
        disable=None,  # no bar when stderr is not a terminal (CI logs)
    )
    counted = _Counter(bar)
    try:
        tok = train_tokenizer(counted, vocab_size, data.lowercase)
    finally:
        bar.close()
    if counted.n == 0:
        raise DataError(f"data.corpus: {spec.source}: corpus is empty (no training document)")
    try:
        _save_atomic(tok, path)
    except OSError as exc:
        raise DataError(f"data.cache_dir: cannot write the tokenizer {path}: {exc.strerror or exc}") from None
    return tok, path


class _Counter:
    """Iterates over documents, counting them."""

    def __init__(self, docs: Iterable[str]) -> None:
        self._docs = iter(docs)
        self.n = 0

    def __iter__(self) -> Iterator[str]:
        for doc in self._docs:
            self.n += 1
            yield doc


def continuation_mask(tokenizer: Tokenizer) -> list[bool]:
    """``mask[id]`` is True when token ``id`` continues a word (a ``##`` piece)."""
    vocab = tokenizer.get_vocab()
    mask = [False] * tokenizer.get_vocab_size()
    for token, idx in vocab.items():
        if token.startswith("##") and idx < len(mask):
            mask[idx] = True
    return mask


def vocabulary_map(student: Tokenizer, teacher: Tokenizer) -> list[int]:
    """For each id of ``student``, the id of the ``teacher`` token with the same string, or -1.

    Both are this module's WordPiece tokenizers (``##`` continuation pieces, the same normalizer):
    a piece with the same string stands for the same text, and the special tokens map by name.
    Used by a distillation whose student has its own, smaller vocabulary (Zhao et al.)."""
    theirs = teacher.get_vocab()
    out = [-1] * student.get_vocab_size()
    for token, idx in student.get_vocab().items():
        out[idx] = theirs.get(token, -1)
    return out


VOCAB_FILE = "vocab.txt"


def wordpiece_from_vocab(vocab_file: Path, lowercase: bool, strip_accents: bool | None = None) -> Tokenizer:
    """BERT's WordPiece tokenizer over a ``vocab.txt`` (one token a line, its id the line's index), as
    transformers' ``BertTokenizerFast`` builds it: BERT's normalizer (``lowercase``; accents stripped
    with it unless ``strip_accents`` says), pre-tokenizer, ``##`` pieces, ``[CLS] A [SEP] B [SEP]``."""
    tok = new_tokenizer(lowercase)
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=lowercase if strip_accents is None else strip_accents,
        lowercase=lowercase,
    )
    vocab = models.WordPiece.read_file(str(vocab_file))
    tok.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100)
    special_ids(tok)  # ValueError without BERT's special tokens
    tok.add_special_tokens(list(SPECIAL_TOKENS))  # matched whole in text, as transformers' added tokens are
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return tok


def checkpoint_tokenizer(folder: str | Path, out_dir: Path, lowercase: bool = True) -> Path | None:
    """The tokenizer of a checkpoint or tokenizer folder as a ``tokenizers`` JSON file: its
    ``tokenizer.json``, else its ``vocab.txt`` read as BERT's WordPiece (:func:`wordpiece_from_vocab`,
    casing from ``tokenizer_config.json``, else ``lowercase``) and written into ``out_dir``, named by
    its content; None when it has neither.

    Raises:
        ConfigError: ``vocab.txt`` lacks BERT's special tokens; ``tokenizer.json`` or ``tokenizer_config.json``
            does not parse, or they contradict each other (:func:`check_tokenizer_files`).
    """
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        check_tokenizer_files(folder)
        return folder / "tokenizer.json"
    vocab = folder / VOCAB_FILE
    if not vocab.is_file():
        return None
    lower, accents = casing(folder, lowercase)
    try:
        tok = wordpiece_from_vocab(vocab, lower, accents)
    except Exception as exc:  # noqa: BLE001 - unreadable, no specials
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"{vocab}: not BERT's vocabulary ({first})") from None
    key = hashlib.blake2b(tok.to_str().encode(), digest_size=10).hexdigest()
    path = out_dir / f"vocab-{key}.json"
    if not path.is_file():
        _save_atomic(tok, path)
    return path


def given_tokenizer(data: DataConfig, vocab_size: int | None) -> tuple[Tokenizer, Path]:
    """``data.tokenizer`` (a hub name or folder: :func:`~ablate.datamodules.catalog.resolve_model`)
    as the run's tokenizer, copied into the cache (``given-<digest>.json``, no truncation or padding).

    Raises:
        ConfigError: the folder has no vocabulary (``data.tokenizer``), its tokenizer is unreadable or
            lacks ``[PAD] [UNK] [CLS] [SEP] [MASK]``, or its size is not ``vocab_size``
            (``model.vocab_size``).
        DataError: the cache folder cannot be written.
    """
    assert data.tokenizer is not None
    cache = cache_root(data) / "tokenizers"
    folder = resolve_model(data.tokenizer, "data.tokenizer", weights=False)
    try:  # its files parse and agree before anything is written
        check_tokenizer_files(folder) if (folder / "tokenizer.json").is_file() else casing(folder, data.lowercase)
    except ConfigError as exc:
        raise ConfigError(f"data.tokenizer: {exc}") from None
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"data.cache_dir: cannot create the tokenizer cache folder {cache}: {exc.strerror}") from None
    try:
        source = checkpoint_tokenizer(folder, cache, data.lowercase)
    except ConfigError as exc:
        raise ConfigError(f"data.tokenizer: {exc}") from None
    if source is None:
        raise ConfigError(
            f"data.tokenizer: {data.tokenizer}: no vocabulary in {folder} (neither tokenizer.json nor {VOCAB_FILE})"
        )
    try:
        tok = Tokenizer.from_file(str(source))
        special_ids(tok)
    except Exception as exc:  # noqa: BLE001 - truncated, not a tokenizer, another model's specials
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(
            f"data.tokenizer: {source}: not a BERT WordPiece tokenizer ablate can use ({first})"
        ) from None
    tok.no_truncation()
    tok.no_padding()
    size = tok.get_vocab_size()
    if vocab_size is not None and size != vocab_size:
        raise ConfigError(
            f"model.vocab_size: {vocab_size}, but data.tokenizer {data.tokenizer} has {size} tokens (set "
            f"model.vocab_size={size})"
        )
    text = tok.to_str()
    path = cache / f"given-{hashlib.blake2b(text.encode(), digest_size=10).hexdigest()}.json"
    if not path.is_file():
        try:
            _save_atomic(tok, path)
        except OSError as exc:
            raise DataError(f"data.cache_dir: cannot write the tokenizer {path}: {exc.strerror or exc}") from None
    return tok, path
