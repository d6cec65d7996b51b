"""The fenced blocks of the README and docs/, each of the kind its ``<!-- example: KIND -->`` marker says
(docs/development.md, "Examples in the docs"): read, checked as an excerpt of its kind, or run as a reader
would, at a smoke size given through the documented overrides only."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))


class Kind(Enum):
    """What a fenced block is, and so what the tests do with it."""

    RUNS = "runs"  # run as written (a YAML file written as NAME, or commands) by a test of test_doc_examples.py
    OUTPUT = "output of"  # what the runs block NAME of the page prints; its deterministic lines checked
    CONFIG = "excerpt of a config"  # loads through the config loader (placeholders filled)
    STUDY = "excerpt of a study"  # loads as a study (beside a minimal one, where it is a part)
    REPORT = "excerpt of a report"  # validates as a report spec
    CATALOG = "excerpt of a catalog"  # loads as a data catalog
    COMMANDS = "excerpt of commands"  # each ablate line parses with ablate's own parsers
    PYTHON = "excerpt of python"  # compiles, and its imports import
    SHOWN = "shown"  # not input to ablate: install steps, other tools, a tree, messages shown for reading


_MARKER = re.compile(r"^\s*<!-- example: (?P<value>.+?) -->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```|~~~)(?P<lang>\S*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its language, its text (dedented), and its marker."""

    page: str  # relative to the repository root
    line: int  # the fence's line, from 1
    lang: str
    text: str
    marker: str | None  # the marker's value as written; None: no marker on the line before the fence
    kind: Kind | None = field(default=None)
    name: str = ""  # a runs block's name; an output block's runs block

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _kind(value: str) -> tuple[Kind | None, str]:
    """A marker's kind and name (``runs NAME``, ``output of NAME``, ``excerpt of a study``)."""
    for kind in Kind:
        if kind in (Kind.RUNS, Kind.OUTPUT) and value.startswith(kind.value + " "):
            return kind, value[len(kind.value) + 1 :].strip()
        if value == kind.value and kind not in (Kind.RUNS, Kind.OUTPUT):
            return kind, ""
    return None, ""


def page_blocks(page: Path) -> Iterator[Block]:
    """The fenced blocks of one page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    n = 0
    while n < len(lines):
        opening = _FENCE.match(lines[n])
        if opening is None:
            n += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        end = next(i for i in range(n + 1, len(lines)) if lines[i].strip() == fence)
        body = "\n".join(line[len(indent) :] for line in lines[n + 1 : end])
        found = _MARKER.match(lines[n - 1]) if n else None
        marker = found.group("value") if found else None
        kind, name = _kind(marker) if marker else (None, "")
        yield Block(str(page.relative_to(ROOT)), n + 1, opening.group("lang"), body + "\n", marker, kind, name)
        n = end + 1


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def block(page: str, name: str, kind: Kind = Kind.RUNS) -> Block:
    """The runs block ``name`` of ``page`` (or the output block of it)."""
    found = [b for b in page_blocks(ROOT / page) if b.kind is kind and b.name == name]
    assert len(found) == 1, f"{page}: {len(found)} blocks marked '{kind.value} {name}'"
    return found[0]


# -- placeholders: what a reader puts in place of RUN_ID, /data, ... ----------------------------------------

PLACEHOLDER = re.compile(r"^(\.\.\.|runs:/[A-Z_]+|[A-Z][A-Z_]*(\.yaml)?)$")
"""A value the docs leave to the reader: ``...``, ``runs:/RUN_ID``, ``CONFIG.yaml``, ``OUT_DIR``."""


def expected(line: str) -> re.Pattern[str]:
    """A line of promised output as a pattern: ``...`` and ``/path/to/ablate`` stand for anything, ``<8
    hex digits>`` for eight of them, a figure in e-notation (``1.2e-06``) for any."""
    pattern = re.escape(line.strip())
    for shown, meant in (
        (re.escape("<8 hex digits>"), "[0-9a-f]{8}"),
        (re.escape("/path/to/ablate"), ".*?"),
        (re.escape("..."), ".*?"),
    ):
        pattern = pattern.replace(shown, meant)
    measured = re.sub(r"\d\\\.\d+e\\-\d+", lambda _: r"\d\.\d+e-\d+", pattern)  # 1.2e-06: any figure
    return re.compile(measured)


def unmet(lines: str, said: str) -> list[str]:
    """The lines of promised output (comments and blank lines aside) that no line of ``said`` matches."""
    heard = said.splitlines()
    missing = []
    for line in lines.splitlines():
        if line.strip() and not any(expected(line).fullmatch(h.strip()) for h in heard):
            missing.append(line.strip())
    return missing


# -- commands: a shell block read line by line, its ablate lines run in-process ------------------------------


@dataclass(frozen=True)
class Command:
    """One command of a shell block: its words, the environment it sets, and the output shown after it."""

    text: str
    env: Mapping[str, str]
    argv: tuple[str, ...]
    shown: str = ""  # a console block's lines after ``$ ...``: what it prints


_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
SERVERS = (".venv/bin/mlflow ui", ".venv/bin/optuna-dashboard")
"""Commands that start a server the reader opens in a browser: not run; the store they serve is checked."""


def commands(text: str) -> list[Command]:
    """A shell or console block's commands (``\\`` continuations joined, comments cut; in a console block,
    the lines after a ``$ `` line are its output)."""
    console = any(line.startswith("$ ") for line in text.splitlines())
    found: list[Command] = []
    for line in text.replace("\\\n", " ").splitlines():
        if console and not line.startswith("$ "):
            if found and line.strip():
                found[-1] = Command(found[-1].text, found[-1].env, found[-1].argv, found[-1].shown + line + "\n")
            continue
        words = shlex.split(line.removeprefix("$ "), comments=True)
        if not words:
            continue
        env = {}
        if words[0] == "export":
            words = words[1:]
        while words and _ENV.match(words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        found.append(Command(line.removeprefix("$ ").split(" #")[0].strip(), env, tuple(words)))
    return found


def is_ablate(command: Command) -> bool:
    return bool(command.argv) and command.argv[0] in ("ablate", ".venv/bin/ablate")


def smoked(argv: tuple[str, ...], smoke: Mapping[str, str]) -> list[str]:
    """An ablate command line at a smoke size: each ``key=value`` of ``smoke`` replaces the line's own value
    of that key, or is added; an option (``--smoke``: ``""``, ``--n-trials``: ``"1"``) is added."""
    out = [word for word in argv[1:] if word.split("=", 1)[0] not in smoke]
    for key, value in smoke.items():
        out += ([key] + shlex.split(value)) if key.startswith("--") else [f"{key}={value}"]
    return out


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set for the block (``export``) or one command (``VAR=value ablate ...``), then restored."""
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ablate(argv: list[str]) -> tuple[int, str]:
    """``ablate ARGV`` run by the command's own entry point in this process: its status and what it said."""
    from ablate.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


@dataclass
class Session:
    """A reader's terminal in ``folder`` (the repository's ``sweeps/`` linked in, so that the docs' relative
    study paths resolve; the stores under ``ablate-runs/`` there): the blocks of one walk through the docs
    written and run in turn. ``replace`` maps what the docs write (``/data/``) to what is here, in the
    commands and in the output they promise alike."""

    folder: Path
    replace: Mapping[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # what the blocks' export lines set

    def __post_init__(self) -> None:
        if not (self.folder / "sweeps").exists():
            (self.folder / "sweeps").symlink_to(ROOT / "sweeps")

    def text(self, block: Block) -> str:
        text = block.text
        for written, here in self.replace.items():
            text = text.replace(written, here)
        return text

    def write(self, block: Block) -> Path:
        """A YAML runs block, written where the docs tell the reader to (its name, in the folder)."""
        assert block.kind is Kind.RUNS and block.lang == "yaml", f"{block.where}: not a YAML file to write"
        path = self.folder / block.name
        path.write_text(self.text(block), encoding="utf-8")
        return path

    def run(self, block: Block, smoke: Mapping[str, Mapping[str, str]] | None = None) -> str:
        """Run a shell runs block: each ablate line in turn (``smoke[line]``, the line without its program,
        sets its smoke size); each must exit as its shown output says (2 where it shows ``error:``, else 0)
        and print the lines it shows. Returns all it printed."""
        assert block.kind is Kind.RUNS and block.lang != "yaml", f"{block.where}: not commands to run"
        smoke = dict(smoke or {})
        said = []
        cwd = Path.cwd()
        os.chdir(self.folder)
        try:
            for command in commands(self.text(block)):
                said.append(self._one(block, command, smoke.pop(" ".join(command.argv[1:]), {})))
        finally:
            os.chdir(cwd)
        assert not smoke, f"{block.where}: no line {sorted(smoke)} (smoke sizes for lines it lacks)"
        return "".join(said)

    def _one(self, block: Block, command: Command, smoke: Mapping[str, str]) -> str:
        where = f"{block.where}: {command.text}"
        if not command.argv:  # export VAR=value
            self.env.update(command.env)
            return ""
        if command.text.startswith(SERVERS):  # the store it serves exists
            store = re.search(r"sqlite:///(\S+)", command.text)
            assert store and (self.folder / store.group(1)).is_file(), f"{where}: serves no store made here"
            return ""
        assert is_ablate(command), f"{where}: not an ablate command (mark the block shown)"
        with environment({**self.env, **command.env}):
            code, said = ablate(smoked(command.argv, smoke))
        errs = "error:" in command.shown
        assert code == (2 if errs else 0), f"{where}: exit status {code}:\n{said[-3000:]}"
        assert unmet(command.shown, said) == [], f"{where}: not printed:\n{said[-3000:]}"
        return said
