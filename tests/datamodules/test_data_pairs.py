"""SOP/NSP/none pairs on real Wikipedia articles; sentence splitting; truncation."""

from __future__ import annotations

import random

import pytest

from ablate.datamodules.pairs import Instance, create_instances, split_sentences, truncate_pair
from ablate.datamodules.stream import iter_instances

MAX_LENGTH = 64


def _find(haystack: list[int], needle: list[int]) -> int:
    """Index of the first occurrence of ``needle`` in ``haystack``, or -1."""
    n = len(needle)
    first = needle[0]
    for i in range(len(haystack) - n + 1):
        if haystack[i] == first and haystack[i : i + n] == needle:
            return i
    return -1


def _in_order(tokens: list[int], first: list[int], second: list[int]) -> bool:
    """Whether ``first`` occurs in ``tokens`` with ``second`` somewhere after it."""
    start = _find(tokens, first)
    while start >= 0:
        if _find(tokens[start + len(first) :], second) >= 0:
            return True
        nxt = _find(tokens[start + 1 :], first)
        start = start + 1 + nxt if nxt >= 0 else -1
    return False


def _flat(doc: list[list[int]]) -> list[int]:
    return [t for sent in doc for t in sent]


def _instances(docs: list[list[list[int]]], task: str, seed: int = 0, **kw) -> list[tuple[int, Instance]]:  # type: ignore[no-untyped-def]
    """(document index, instance) over the docs, NSP drawing from the previous ones."""
    rng = random.Random(seed)
    out = []
    for i, doc in enumerate(docs):
        others = docs[max(0, i - 32) : i]
        out += [(i, inst) for inst in create_instances(doc, rng, MAX_LENGTH, 0.1, task, others, **kw)]  # type: ignore[arg-type]
    return out


def test_split_sentences() -> None:
    text = 'Mr. Smith met A. K. Sengupta in 1995. He said "Hi!" Then he left?\nHistory.\nIt rained. 3 men ran.'
    assert split_sentences(text) == [
        "Mr. Smith met A. K. Sengupta in 1995.",
        'He said "Hi!"',
        "Then he left?",
        "History.",
        "It rained.",
        "3 men ran.",
    ]
    assert split_sentences("  \n\n ") == []


def test_sop_order_and_balance(wiki_docs: list[list[list[int]]]) -> None:
    pairs = _instances(wiki_docs, "sop")
    assert len(pairs) > 500
    labels = [inst.label for _, inst in pairs]
    assert set(labels) == {0, 1}
    assert 0.45 < sum(labels) / len(labels) < 0.55
    for i, (a, b, label) in pairs:
        assert a and b and len(a) + len(b) + 3 <= MAX_LENGTH
        tokens = _flat(wiki_docs[i])
        if label == 0:
            assert _in_order(tokens, a, b), "label 0: A precedes B in the document"
        else:
            assert _in_order(tokens, b, a), "label 1: B precedes A in the document (swapped)"


def test_nsp_random_next_from_other_document(wiki_docs: list[list[list[int]]]) -> None:
    pairs = _instances(wiki_docs, "nsp")
    labels = [inst.label for _, inst in pairs]
    assert 0.45 < sum(labels) / len(labels) < 0.55
    random_next = 0
    for i, (a, b, label) in pairs:
        assert a and b and len(a) + len(b) + 3 <= MAX_LENGTH
        own = _flat(wiki_docs[i])
        assert _find(own, a) >= 0
        if label == 0:
            assert _in_order(own, a, b)
        elif len(b) >= 8:  # short segments may recur by chance
            random_next += 1
            assert _find(own, b) == -1, "label 1: B is not from A's document"
            assert any(_find(_flat(d), b) >= 0 for d in wiki_docs[max(0, i - 32) : i])
    assert random_next > 100


def test_none_single_segments_keep_all_text(wiki_docs: list[list[list[int]]]) -> None:
    rng = random.Random(0)
    for doc in wiki_docs[:50]:
        insts = create_instances(doc, rng, MAX_LENGTH, 0.1, "none")
        assert all(inst.b == [] and inst.label == -100 for inst in insts)
        assert all(0 < len(inst.a) <= MAX_LENGTH - 2 for inst in insts)
        assert [t for inst in insts for t in inst.a] == _flat(doc)


def test_pairs_fill_max_length(wiki_docs: list[list[list[int]]]) -> None:
    lengths = [len(inst.a) + len(inst.b) + 3 for _, inst in _instances(wiki_docs, "sop")]
    assert sum(lengths) / len(lengths) > 0.8 * MAX_LENGTH


def test_same_seed_same_pairs(wiki_docs: list[list[list[int]]]) -> None:
    assert _instances(wiki_docs[:40], "nsp", seed=3) == _instances(wiki_docs[:40], "nsp", seed=3)
    assert _instances(wiki_docs[:40], "nsp", seed=3) != _instances(wiki_docs[:40], "nsp", seed=4)


def test_iter_instances_streams_nsp(wiki_docs: list[list[list[int]]]) -> None:
    insts = list(iter_instances(wiki_docs[:60], random.Random(0), MAX_LENGTH, 0.1, "nsp"))
    assert {inst.label for inst in insts} == {0, 1}


@pytest.mark.parametrize(("la", "lb", "limit"), [(10, 3, 8), (3, 10, 8), (50, 50, 61), (5, 5, 20), (1, 30, 2)])
def test_truncate_pair(la: int, lb: int, limit: int) -> None:
    a, b = list(range(la)), list(range(100, 100 + lb))
    ta, tb = truncate_pair(a, b, limit, random.Random(0))
    assert len(ta) + len(tb) == min(limit, la + lb)
    assert _find(a, ta) >= 0 and _find(b, tb) >= 0  # contiguous pieces of the originals
    # the longer one is shortened first: lengths end up as equal as the limit allows
    if la + lb > limit:
        assert abs(len(ta) - len(tb)) <= 1 or min(len(ta), len(tb)) == min(la, lb)
