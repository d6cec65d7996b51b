"""The documentation: the site builds with ``mkdocs build --strict`` (every page in the nav,
every internal link and anchor resolves, the API page finds every module it names), the
README stays a front door (at most 200 lines), and every relative link in the README and
the pages points to a file that exists."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# [text](target) and ![alt](target), with an optional "title"; code is stripped first
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")


def _relative_links(page: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))
    links = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
            continue  # http:, mailto:, in-page anchors, absolute paths
        links.append(target)
    return links


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_relative_links_point_to_files():
    broken = []
    for page in _pages():
        for target in _relative_links(page):
            path = target.split("#", 1)[0].split("?", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_relative_links_are_found():
    """The link check above does look at links (a regression guard for its pattern)."""
    assert "docs/getting-started.md" in _relative_links(README)
    assert "mlflow-compare.png" in _relative_links(DOCS / "reports.md")


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (pip install -e '.[test]')"
)
def test_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the API page has content: every module it names rendered, with its members
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    modules = re.findall(r"^::: *(\S+)", (DOCS / "api.md").read_text(encoding="utf-8"), re.M)
    assert modules
    for module in modules:
        assert f'id="{module}"' in api, f"{module}: not rendered on the API page"
        assert f'id="{module}.' in api, f"{module}: rendered without members"


def _command_lists() -> dict[Path, str]:
    """The command block of the README and of docs/index.md (the fenced block whose lines start ``ablate``)."""
    found = {}
    for page in (README, DOCS / "index.md"):
        for block in re.findall(r"```\n(ablate --version\n.*?)```", page.read_text(encoding="utf-8"), re.S):
            found[page] = block
    return found


def _command(argv: list[str]) -> argparse.ArgumentParser | None:
    """The command or mode ``ablate ARGV`` runs, read as the command line reads it (an old spelling
    included); None for ``ablate --version``."""
    from ablate.cli import spelled
    from ablate.parsers import parser, subcommands

    root = command = parser()
    for word in spelled(argv, root):
        if word not in subcommands(command):
            break
        command = subcommands(command)[word]
    return None if command is root else command


def _named(line: str) -> list[tuple[argparse.ArgumentParser, set[str]]]:
    """The commands an ``ablate ...`` line names, each with the options the line gives it: ``ablate sweep
    check|smoke STUDY`` names two modes; an old spelling's mode flag is the mode, not an option."""
    from ablate.cli import spelled
    from ablate.parsers import parser, subcommands

    root = parser()
    words = line.split()[1:]
    modes = subcommands(subcommands(root).get(words[0], root)) if words else {}
    alternatives = words[1].split("|") if len(words) > 1 and set(words[1].split("|")) <= set(modes) else []
    found = []
    for mode in alternatives or [None]:
        argv = [words[0], mode, *words[2:]] if mode else words
        command = _command(argv)
        if command is not None:
            found.append((command, set(re.findall(r"--[a-z][a-z0-9-]*", " ".join(spelled(argv, root))))))
    return found


def _options(command: argparse.ArgumentParser) -> set[str]:
    """The long options of a command or mode, as its ``--help`` lists them (``--help`` aside)."""
    return {o for a in command._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def test_the_command_lists_name_every_command_and_option():
    """Every command and mode (``ablate sweep check``, ``ablate bench loop``) has a line in the README's and
    the overview's command list, and its lines name every option its ``--help`` lists and no other; an option
    every command has (``--verbose``) is said once, beside the list, instead of on every line."""
    from ablate.parsers import leaves, parser

    lists = _command_lists()
    assert set(lists) == {README, DOCS / "index.md"}, "a command list (starting 'ablate --version') is gone"
    shared = set.intersection(*(_options(command) for command in leaves(parser())))
    for page, block in lists.items():
        given: dict[str, set[str]] = {}
        for line in block.replace("\n ", " ").splitlines():  # a line that starts with spaces goes on the last
            for command, options in _named(line):
                given.setdefault(command.prog, set()).update(options)
        for command in leaves(parser()):
            assert command.prog in given, f"{page.name}: no line for {command.prog}"
            listed = _options(command) - shared
            assert given[command.prog] == listed, f"{page.name}: {command.prog} lists other options"
        after = page.read_text(encoding="utf-8").split(block, 1)[1].split("\n\n", 2)[1]
        assert all(f"`{option}`" in after for option in shared), f"{page.name}: the list is not followed by {shared}"


_SHELL = re.compile(r"^(?:\$ )?(?:[A-Z_0-9]+=\S* )*(?:\.venv/bin/)?(ablate .*?)\s*(?:#.*)?$")


def _command_lines() -> list[tuple[str, str]]:
    """Every ``ablate ...`` line in a code block of the README or a page (a usage line, an example, after a
    ``$`` prompt, ``.venv/bin/`` or ``VAR=value``; a comment cut): (page, line)."""
    found = []
    for page in _pages():
        for block in _FENCE.finditer(page.read_text(encoding="utf-8")):
            for line in block.group(0).replace("\\\n", " ").splitlines():
                command = _SHELL.match(line.strip())
                if command is not None and not command.group(1).startswith("ablate --version"):
                    found.append((str(page.relative_to(ROOT)), command.group(1)))
    return found


def test_every_command_line_in_the_docs_names_options_its_command_has():
    """A command line the docs show runs a command that exists and gives it only options it has (an old
    spelling read as its new one)."""
    from ablate.parsers import UsageError

    lines = _command_lines()
    assert len(lines) > 50  # the check reads what it should
    wrong = []
    for where, line in lines:
        try:
            named = _named(line)
        except UsageError as exc:
            named, wrong = [], [*wrong, f"{where}: {line}: {exc}"]
        wrong += [f"{where}: {line}: no such command"] if not named else []
        for command, options in named:
            if not options <= _options(command):
                wrong.append(f"{where}: {line}: {command.prog} has no {sorted(options - _options(command))}")
    assert wrong == []


# `ablate.x.y`, :mod:`~ablate.x`, ``ablate.x.y`` and the same without ``ablate.`` (a package folder
# named as if it were the top level): a dotted path in backticks that starts with one of ablate's packages
_PACKAGES = {
    "ablate": ROOT / "ablate",
    "lightning_modules": ROOT / "lightning_modules",
    "datamodules": ROOT / "datamodules",
    "sweeps": ROOT / "sweeps",
    "reports": ROOT / "reports",
    "benchmarks": ROOT / "benchmarks",
}
_REFERENCE = re.compile(r"`~?((?:ablate|lightning_modules|datamodules|sweeps|reports|benchmarks)(?:\.[A-Za-z_]\w*)+)")
_SOURCES = ("ablate", "lightning_modules", "datamodules", "sweeps", "reports", "benchmarks", "tools", "docs/hooks")


def _module_file(parts: list[str]) -> Path | None:
    """The file of module ``ablate.<parts>`` (``parts`` after ``ablate``), None when there is none."""
    if not parts:
        return ROOT / "ablate" / "__init__.py"
    base = _PACKAGES.get(parts[0], ROOT / "ablate" / parts[0]) if parts[0] in _PACKAGES else ROOT / "ablate" / parts[0]
    for part in parts[1:]:
        base = base / part
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """What a module or class body defines, by name (defs, classes, assignments, imports)."""
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out |= {t.id: node for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0]: node for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, optional imports
            out |= _names([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])])
    return out


def _resolves(reference: str) -> bool:
    """Whether ``ablate.<path>`` names a module, or an attribute a module or a class of it defines.
    ``ablate.<name>`` where no module ``ablate.<name>`` exists is not code (an MLflow tag such as
    ``ablate.phase``, the file ``ablate.yaml``); a package named without ``ablate.`` never resolves
    (the API page and readers know it as ``ablate.<package>``)."""
    parts = reference.split(".")
    if parts[0] != "ablate":
        return False
    parts = parts[1:]
    if _module_file(parts[:1]) is None:
        return True  # not a reference to code
    for cut in range(len(parts), -1, -1):
        path = _module_file(parts[:cut])
        if path is None:
            continue
        rest, body = parts[cut:], ast.parse(path.read_text(encoding="utf-8")).body
        for name in rest:
            node = _names(body).get(name)
            if node is None:
                return False
            body = node.body if isinstance(node, ast.ClassDef) else []
        return True
    return False


def _references() -> list[tuple[str, str]]:
    """Every dotted reference to ablate code in the docs pages, the README, and the source's docstrings
    and comments: (where, reference)."""
    files = [*_pages(), *(p for d in _SOURCES for p in sorted((ROOT / d).rglob("*.py")))]
    found = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [(f"{path.relative_to(ROOT)}:{n}", ref) for ref in _REFERENCE.findall(line)]
    return found


def test_every_reference_to_ablate_code_names_something_that_exists():
    """A docstring, comment or page that names ``ablate.<module>`` or ``ablate.<module>.<name>`` (in
    backticks, or as :mod:/:func:/:class:) names a module that exists and a name it defines: a module
    that moved leaves no reference behind."""
    references = _references()
    assert len(references) > 100  # the check reads what it should
    assert [f"{where}: {ref}" for where, ref in references if not _resolves(ref)] == []
