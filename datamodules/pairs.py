"""Sentence splitting and BERT/ALBERT segment pairs (pure functions, all randomness from the
``random.Random`` passed in): sentences accumulated up to a target length as in BERT's
``create_instances_from_document``, split into segments A and B for ``sop``, ``nsp`` or ``none``
(docs/data.md, "The pre-training pipeline")."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Literal, NamedTuple

SentenceTask = Literal["sop", "nsp", "none"]
IGNORE_INDEX = -100

_SENTENCE_END = re.compile(  # starts with a character class: the regex engine scans fast
    r"([.!?])(?<!\b[A-Z]\.)(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bJr\.)(?<!\bvs\.)(?<!\bNo\.)"
    r"([.!?]*[\"'\u201d\u2019)\]]*)[^\S\n]+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])"
)


class Instance(NamedTuple):
    """One training example before special tokens: ``[CLS] a [SEP] b [SEP]``.

    Attributes:
        a: token ids of segment A.
        b: token ids of segment B (empty when the sentence task is ``none``).
        label: 0 = in order / actual next, 1 = swapped (SOP) / random next (NSP),
            -100 = no sentence task.
    """

    a: list[int]
    b: list[int]
    label: int


def split_sentences(text: str) -> list[str]:
    """Split text into sentences with a fast regex (no model, no download).

    A sentence ends at ``.``, ``!`` or ``?`` (closing quotes and brackets kept) that is
    followed by whitespace and a capital letter, digit or opening quote, except after
    an initial or a common abbreviation; every newline also ends a sentence (in json
    corpora it separates paragraphs).

    Args:
        text: one document.

    Returns:
        Non-empty, stripped sentences in order.
    """
    marked = _SENTENCE_END.sub("\\1\\2\n", text)
    return [s for s in (line.strip() for line in marked.split("\n")) if s]


def target_length(max_tokens: int, short_seq_prob: float, rng: random.Random) -> int:
    """``max_tokens``, or with probability ``short_seq_prob`` a uniform length in [2, max_tokens]."""
    if rng.random() < short_seq_prob:
        return rng.randint(2, max_tokens)
    return max_tokens


def _trim(tokens: list[int], remove: int, rng: random.Random) -> list[int]:
    """Drop ``remove`` tokens, each from the front or the back with probability 1/2."""
    if remove <= 0:
        return tokens
    front = bin(rng.getrandbits(remove)).count("1")
    return tokens[front : len(tokens) - (remove - front)]


def truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """Truncate a pair to ``max_tokens`` in total, always shortening the longer segment.

    Equivalent to BERT's ``truncate_seq_pair`` (one token at a time from the longer
    segment, front or back at random), computed in closed form.
    """
    la, lb = len(a), len(b)
    excess = la + lb - max_tokens
    if excess <= 0:
        return a, b
    longer, shorter = max(la, lb), min(la, lb)
    first = min(excess, longer - shorter)  # removed from the longer until they are equal
    rest = excess - first
    cut_longer, cut_shorter = first + (rest + 1) // 2, rest // 2
    cut_a, cut_b = (cut_longer, cut_shorter) if la >= lb else (cut_shorter, cut_longer)
    return _trim(a, cut_a, rng), _trim(b, cut_b, rng)


def _concat(segments: Sequence[list[int]]) -> list[int]:
    out: list[int] = []
    for seg in segments:
        out.extend(seg)
    return out


def _random_segment(docs: Sequence[Sequence[list[int]]], target: int, rng: random.Random) -> list[int]:
    doc = docs[rng.randrange(len(docs))]
    out: list[int] = []
    for sent in doc[rng.randrange(len(doc)) :]:
        out.extend(sent)
        if len(out) >= target:
            break
    return out


def _pair(
    chunk: list[list[int]],
    target: int,
    max_tokens: int,
    task: SentenceTask,
    other_docs: Sequence[Sequence[list[int]]],
    rng: random.Random,
) -> tuple[Instance | None, int]:
    """Make one A/B pair from a chunk; returns it and the number of sentences unused."""
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        a, rest = _concat(chunk[:a_end]), chunk[a_end:]
    else:
        tokens = chunk[0]
        if len(tokens) < 2:
            return None, 0
        cut = rng.randint(1, len(tokens) - 1)
        a, rest = tokens[:cut], [tokens[cut:]]
    unused = 0
    if task == "nsp" and other_docs and rng.random() < 0.5:
        b, label = _random_segment(other_docs, max(1, target - len(a)), rng), 1
        unused = len(rest) if len(chunk) >= 2 else 0
    else:
        b, label = _concat(rest), 0
        if task == "sop" and rng.random() < 0.5:
            a, b, label = b, a, 1
    a, b = truncate_pair(a, b, max_tokens, rng)
    if not a or not b:
        return None, unused
    return Instance(a, b, label), unused


def _single_segments(
    doc: Sequence[list[int]], max_tokens: int, short_seq_prob: float, rng: random.Random
) -> list[Instance]:
    """Segments for the ``none`` task, each of whole sentences up to ``max_tokens``.

    A sentence overflowing ``max_tokens`` continues at the start of the next segment,
    so no text is lost.
    """
    out: list[Instance] = []
    current: list[int] = []
    target = target_length(max_tokens, short_seq_prob, rng)
    for i, sent in enumerate(doc):
        current.extend(sent)
        while len(current) >= target or (i == len(doc) - 1 and current):
            cut = min(len(current), max_tokens)
            out.append(Instance(current[:cut], [], IGNORE_INDEX))
            current = current[cut:]
            target = target_length(max_tokens, short_seq_prob, rng)
            if len(current) < target and i < len(doc) - 1:
                break
    return out


def create_instances(
    doc: Sequence[list[int]],
    rng: random.Random,
    max_length: int,
    short_seq_prob: float,
    task: SentenceTask,
    other_docs: Sequence[Sequence[list[int]]] = (),
) -> list[Instance]:
    """All training instances of one document, BERT's ``create_instances_from_document``.

    Args:
        doc: the document as tokenized sentences (empty sentences are ignored).
        rng: the source of all randomness (seeded by the caller).
        max_length: sequence length including ``[CLS]`` and ``[SEP]`` tokens.
        short_seq_prob: probability of a shorter random target length.
        task: ``sop``, ``nsp`` or ``none``.
        other_docs: recent other documents (tokenized sentences), where NSP draws its
            random next segments; with none, NSP keeps the actual next segment.

    Returns:
        Instances whose ``len(a) + len(b)`` fits ``max_length`` with the specials.
    """
    sentences = [s for s in doc if s]
    if not sentences:
        return []
    if task == "none":
        return _single_segments(sentences, max_length - 2, short_seq_prob, rng)
    max_tokens = max_length - 3
    others = [d for d in other_docs if any(d)]
    out: list[Instance] = []
    chunk: list[list[int]] = []
    length, target, i = 0, target_length(max_tokens, short_seq_prob, rng), 0
    while i < len(sentences):
        chunk.append(sentences[i])
        length += len(sentences[i])
        if i == len(sentences) - 1 or length >= target:
            instance, unused = _pair(chunk, target, max_tokens, task, others, rng)
            if instance is not None:
                out.append(instance)
            i -= unused
            chunk, length, target = [], 0, target_length(max_tokens, short_seq_prob, rng)
        i += 1
    return out
