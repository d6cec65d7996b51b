"""TinyBERT's data augmentation for fine-tuning (Jiao et al. 2020, Algorithm 1; docs/guides/finetuning.md):
each word of one WordPiece token is replaced with probability ``prob`` by one of the masked LM's
``top_k`` predictions at its masked position; words of several pieces stay. Every copy's draws come
first, then the masked LM runs once per (sentence, word) some copy replaces, sentences by length:
the result depends only on the inputs and the seed. :func:`cached_augmentation` keeps it on disk."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tqdm.auto import tqdm

from ablate.datamodules.tokenizer import SpecialIds, special_ids

ALGORITHM_VERSION = 1
"""Bumped whenever the output for the same inputs changes, so stale cached augmentations miss."""
_MAX_TOKENS = 512  # context per masked sequence when the model has no position embedding
_ENCODE_BATCH = 4096  # sentences per encode_batch call


class MaskedLM(Protocol):
    """What augmentation asks of a masked language model; the caller hands one in (a pre-training
    model with an MLM head, :class:`ablate.lightning_modules.model.heads.PretrainingModel`, is one).
    It is put in eval mode while it proposes words, then its mode is restored."""

    training: bool

    def train(self, mode: bool = True) -> object:
        """Training mode on (``mode``) or off."""
        ...

    @property
    def vocab_size(self) -> int:
        """V: the ids it predicts."""
        ...

    @property
    def max_tokens(self) -> int | None:
        """The longest input it reads ([CLS] and [SEP] included); None: no limit of its own."""
        ...

    def masked_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Logits (N, V) at ``rows`` (N,) of the flattened (B*T) positions of ``input_ids`` (B, T)
        (token types 0, ``attention_mask`` (B, T) bool True on real tokens), on its own device."""
        ...


@dataclass
class _Sentence:
    """One text field of one example, split into words.

    Attributes:
        text: the normalized text (the words' spans index it).
        spans: (start, end) characters of each word.
        pieces: the sentence's WordPiece ids, without specials.
        piece_of: per word, the index in ``pieces`` of its only piece; -1 for a word of several
            pieces (or [UNK]), which is never replaced.
    """

    text: str
    spans: list[tuple[int, int]]
    pieces: list[int]
    piece_of: np.ndarray


def _split(texts: list[str], tokenizer: Tokenizer, lowercase: bool) -> list[_Sentence]:
    """Normalize (BERT's normalizer), split into words and tokenize each sentence of ``texts``."""
    norm = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    pre = pre_tokenizers.BertPreTokenizer()
    unk = special_ids(tokenizer).unk
    out: list[_Sentence] = []
    for start in range(0, len(texts), _ENCODE_BATCH):
        chunk = [norm.normalize_str(t) for t in texts[start : start + _ENCODE_BATCH]]
        words = [pre.pre_tokenize_str(t) for t in chunk]
        encs = tokenizer.encode_batch(
            [[w for w, _ in ws] or [""] for ws in words], is_pretokenized=True, add_special_tokens=False
        )
        for text, ws, enc in zip(chunk, words, encs, strict=True):
            counts = np.zeros(len(ws), dtype=np.int64)
            piece_of = np.full(len(ws), -1, dtype=np.int64)
            for j, (w, token) in enumerate(zip(enc.word_ids, enc.ids, strict=True)):
                if w is not None and w < len(ws):
                    counts[w] += 1
                    piece_of[w] = j if token != unk else -1
            piece_of[counts != 1] = -1
            out.append(_Sentence(text, [span for _, span in ws], list(enc.ids) if ws else [], piece_of))
    return out


def _allowed(tokenizer: Tokenizer, vocab_size: int) -> torch.Tensor:
    """(V,) bool: the model's output ids that may replace a word (whole-word, non-special tokens)."""
    specials = set(special_ids(tokenizer)) | {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    for token, i in tokenizer.get_vocab().items():
        if i < vocab_size and i not in specials and not token.startswith("##"):
            allowed[i] = True
    return allowed


@torch.no_grad()
def _candidates(
    mlm: MaskedLM,
    queries: list[tuple[list[int], int]],
    window: int,
    allowed: torch.Tensor,
    top_k: int,
    sp: SpecialIds,
) -> np.ndarray:
    """For each (sentence pieces, masked piece j): the top-k allowed predictions at j, never the
    word itself, with at most ``window`` pieces of context around j -> (N, k) ids."""
    rows, slots, words = [], [], []
    for pieces, j in queries:
        start = min(max(j - window // 2, 0), max(len(pieces) - window, 0))
        rows.append([sp.cls, *pieces[start : start + window], sp.sep])
        rows[-1][1 + j - start] = sp.mask
        slots.append(1 + j - start)
        words.append(pieces[j])
    lengths = torch.tensor([len(r) for r in rows])
    input_ids = torch.full((len(rows), int(lengths.max())), sp.pad, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r)
    mask = torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]  # (B, T), True on real tokens
    flat = torch.arange(len(rows)) * input_ids.shape[1] + torch.tensor(slots)  # (B,) into the B*T positions
    logits = mlm.masked_logits(input_ids, mask, flat)  # (B, V) at the masked positions
    device = logits.device
    logits = logits.masked_fill(~allowed.to(device), float("-inf"))
    logits[torch.arange(len(rows), device=device), torch.tensor(words, device=device)] = float("-inf")
    top: np.ndarray = logits.topk(top_k, dim=-1).indices.cpu().numpy()
    return top


def augment_rows(
    texts: list[list[str]],
    tokenizer: Tokenizer,
    mlm: MaskedLM,
    copies: int,
    prob: float,
    top_k: int,
    seed: int,
    lowercase: bool = True,
    batch_size: int = 64,
    progress: bool = True,
) -> list[list[str]]:
    """``copies`` augmented versions of each example, example 0's copies first.

    Args:
        texts: per example, its text fields (one sentence, or two for a pair); fields are
            augmented independently, each with its own masked-LM context.
        tokenizer: the masked LM's WordPiece tokenizer (with ``[PAD] [UNK] [CLS] [SEP] [MASK]``).
        mlm: the masked LM (:class:`MaskedLM`); run in eval mode on its own device, then restored.
        copies: augmented versions per example (TinyBERT's N).
        prob: probability that a word of a copy is replaced (TinyBERT's p_t).
        top_k: candidates per word (TinyBERT's K).
        seed: seeds every random draw (same inputs and seed: same output).
        lowercase: lowercase and strip accents before splitting, as BERT's uncased
            BasicTokenizer: the copies are then lowercase too. Spacing is kept as written.
        batch_size: masked sequences per forward.
        progress: show a progress bar over sentences.

    Returns:
        ``len(texts) * copies`` rows, each with as many fields as its example.
    """
    sp = special_ids(tokenizer)
    allowed = _allowed(tokenizer, mlm.vocab_size)
    k = min(top_k, int(allowed.sum()) - 1)  # the word itself is never a candidate
    sents = _split([t for row in texts for t in row], tokenizer, lowercase)
    draws = _draw(sents, copies, prob, k, seed)
    plan = _plan_queries(sents, draws)
    window = (mlm.max_tokens or _MAX_TOKENS) - 2
    candidates = _answer_queries(mlm, sents, plan, window, allowed, k, sp, batch_size, progress)
    return _render_rows(texts, copies, sents, draws, plan.query_of, candidates, tokenizer)


@dataclass
class _Draws:
    """One sentence's random draws for all its copies, (copies, words) each.

    Attributes:
        replace: True where a copy replaces the word.
        pick: which of the word's k candidates it is replaced by.
    """

    replace: np.ndarray
    pick: np.ndarray


def _draw(sents: list[_Sentence], copies: int, prob: float, k: int, seed: int) -> list[_Draws]:
    """Every copy's draws first, sentence by sentence: replace this word?, and which of its ``k`` candidates."""
    rng = np.random.default_rng(seed)
    return [
        _Draws(rng.random((copies, len(s.spans))) < prob, rng.integers(0, k, (copies, len(s.spans)), dtype=np.int16))
        for s in sents
    ]


@dataclass
class _Queries:
    """The masked sequences to run: one per (sentence, single-piece word) that some copy replaces.

    Attributes:
        queries: (sentence, piece) of each, sentences by length.
        query_of: per sentence, per word, its index in ``queries``; -1 for a word no copy replaces.
        done_at: per query, how many sentences (in length order) are finished once it is answered.
    """

    queries: list[tuple[int, int]]
    query_of: list[np.ndarray]
    done_at: list[int]


def _plan_queries(sents: list[_Sentence], draws: list[_Draws]) -> _Queries:
    """One masked sequence per (sentence, single-piece word) that some copy replaces, by sentence length."""
    order = sorted(range(len(sents)), key=lambda s: len(sents[s].pieces))  # little padding per batch
    plan = _Queries([], [np.full(len(s.spans), -1, dtype=np.int64) for s in sents], [])
    for rank, s in enumerate(order):
        for w in np.flatnonzero((sents[s].piece_of >= 0) & draws[s].replace.any(axis=0)):
            plan.query_of[s][w] = len(plan.queries)
            plan.queries.append((s, int(sents[s].piece_of[w])))
            plan.done_at.append(rank)
    return plan


def _answer_queries(
    mlm: MaskedLM,
    sents: list[_Sentence],
    plan: _Queries,
    window: int,
    allowed: torch.Tensor,
    k: int,
    sp: SpecialIds,
    batch_size: int,
    progress: bool,
) -> np.ndarray:
    """(queries, k) candidate ids, ``batch_size`` queries per forward of ``mlm`` (in eval mode meanwhile,
    then restored); the progress bar counts the sentences whose queries are all answered."""
    queries = plan.queries
    candidates = np.zeros((len(queries), k), dtype=np.int32)
    was_training = mlm.training
    mlm.train(False)
    bar = tqdm(total=len(sents), desc="augmenting", unit="sentence", disable=not progress, delay=1.0)
    try:
        for b in range(0, len(queries), batch_size):
            end = min(b + batch_size, len(queries))
            batch = [(sents[s].pieces, j) for s, j in queries[b:end]]
            candidates[b:end] = _candidates(mlm, batch, window, allowed, k, sp)
            bar.update((plan.done_at[end] if end < len(queries) else len(sents)) - bar.n)
        bar.update(len(sents) - bar.n)
    finally:
        bar.close()
        mlm.train(was_training)
    return candidates


def _render_rows(
    texts: list[list[str]],
    copies: int,
    sents: list[_Sentence],
    draws: list[_Draws],
    query_of: list[np.ndarray],
    candidates: np.ndarray,
    tokenizer: Tokenizer,
) -> list[list[str]]:
    """The ``copies`` augmented rows of each example of ``texts`` (whose fields are ``sents``, in order)."""
    tokens = {i: t for t, i in tokenizer.get_vocab().items()}
    out: list[list[str]] = []
    first = np.cumsum([0, *(len(row) for row in texts)])
    for i in range(len(texts)):
        for c in range(copies):
            fields = range(first[i], first[i + 1])
            out.append(
                [
                    _render(sents[s], draws[s].replace[c], draws[s].pick[c], query_of[s], candidates, tokens)
                    for s in fields
                ]
            )
    return out


def _render(
    sent: _Sentence,
    replace: np.ndarray,
    pick: np.ndarray,
    query_of: np.ndarray,
    candidates: np.ndarray,
    tokens: dict[int, str],
) -> str:
    """One copy of a sentence: its replaced words swapped for their drawn candidates.

    A replacement that touches a neighbour (``revenge-of``: ``-`` replaced) is set apart by
    spaces, so that the copy splits into the same words."""
    text, out, last = sent.text, "", 0
    for w in np.flatnonzero(replace & (query_of >= 0)):
        start, end = sent.spans[w]
        out += text[last:start]
        out += (" " if out and not out[-1].isspace() else "") + tokens[int(candidates[query_of[w], pick[w]])]
        out += " " if end < len(text) and not text[end].isspace() else ""
        last = end
    return out + text[last:]


def vocab_digest(tokenizer: Tokenizer) -> str:
    """A sha256 hex digest of the tokenizer's vocabulary (token -> id)."""
    return hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()


def cached_augmentation(
    cache_dir: Path, key: dict[str, object], compute: Callable[[], list[list[str]]]
) -> list[list[str]]:
    """The augmented rows for ``key``, from ``<cache_dir>/augment/<sha256 of key>.jsonl`` when there.

    Otherwise ``compute()`` them and write the file: a header line (the key and the row count),
    then one JSON list of fields per row, written to a temporary name and renamed (a file that
    is there is whole). A file whose row count does not match is recomputed.
    """
    blob = json.dumps({"version": ALGORITHM_VERSION, **key}, sort_keys=True, default=str)
    path = Path(cache_dir).expanduser() / "augment" / f"{hashlib.sha256(blob.encode()).hexdigest()}.jsonl"
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            header = json.loads(fh.readline())
            rows = [json.loads(line) for line in fh]
        if len(rows) == header.get("rows"):
            return rows
    rows = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".augment-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": json.loads(blob), "rows": len(rows)}) + "\n")
            fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return rows


def sample_table(originals: list[list[str]], augmented: list[list[str]], copies: int, n: int = 20) -> str:
    """A TSV (``example  copy  text``) of the first ``n`` examples, each original then its copies.

    ``copy`` is ``original`` or 1..copies; a pair's fields are joined by `` ||| ``; tabs and line
    breaks inside texts become spaces.
    """

    def cell(fields: list[str]) -> str:
        return " ||| ".join(fields).replace("\t", " ").replace("\r", " ").replace("\n", " ")

    lines = ["example\tcopy\ttext"]
    for i, row in enumerate(originals[:n]):
        lines.append(f"{i}\toriginal\t{cell(row)}")
        lines += [f"{i}\t{c + 1}\t{cell(augmented[i * copies + c])}" for c in range(copies)]
    return "\n".join(lines) + "\n"
