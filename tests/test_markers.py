"""The tables of ``slow`` and ``e2e`` tests (:mod:`tests.markers`) name files and tests that exist, and
``-m "not slow and not e2e"`` leaves them out."""

from __future__ import annotations

import ast
import re

import pytest

from tests.markers import MARKERS, TESTS, marked


def _test_names(path: str) -> set[str]:
    tree = ast.parse((TESTS / path).read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("marker", list(MARKERS))
def test_every_marked_test_exists(marker: str) -> None:
    """A renamed or moved test would silently leave its marker behind: every entry names a file and a
    test function in it (a case by its id: the function's name before the brackets)."""
    missing = []
    for path, names in MARKERS[marker].items():
        if not (TESTS / path).is_file():
            missing.append(path)
            continue
        defined = _test_names(path)
        missing += [f"{path}::{n}" for n in names or () if re.sub(r"\[.*\]$", "", n) not in defined]
    assert missing == []


def test_a_test_is_e2e_or_slow_not_both() -> None:
    e2e, slow = MARKERS["e2e"], MARKERS["slow"]
    assert set(e2e) & {p for p, names in slow.items() if names is None} == set()
    assert [p for p in set(e2e) & set(slow) if e2e[p] is None] == []


def test_the_session_s_tests_carry_the_markers_the_tables_give(request: pytest.FixtureRequest) -> None:
    """The hook in tests/conftest.py marked this session's tests as the tables say, and pyproject registers
    both markers (an unregistered one would only warn)."""
    registered = "\n".join(request.config.getini("markers"))
    assert "slow:" in registered and "e2e:" in registered
    for item in request.session.items:
        path = item.path.relative_to(TESTS).as_posix()
        original = getattr(item, "originalname", item.name)
        for marker, table in MARKERS.items():
            assert (item.get_closest_marker(marker) is not None) == marked(table, path, item.name, original), (
                item.nodeid
            )
