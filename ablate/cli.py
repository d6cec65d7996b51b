"""The ``ablate`` command line: its parsers (:mod:`ablate.parsers`: a subcommand per command and mode), the
old spellings of the modes (:data:`OLD`), and one line ``error: ...`` with exit status 2 for an error a user
can cause; SIGINT and SIGTERM end with the signal's status (130, 143) and what resumes the work.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from ablate.lightning_modules.config.errors import AblateError
from ablate.parsers import Parser, UsageError, leaves, parser, subcommands
from ablate.sweeps.engine.interrupt import Interrupted

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass(frozen=True)
class Modes:
    """A command whose modes are subcommands: the mode its plain spelling runs (``ablate sweep STUDY``; with
    ``words`` false only when options follow, as ``ablate bench --steps 3``), and the flags that chose a mode
    before (``--check``: ``check``), with those whose value the mode takes first (``--experiment NAME``)."""

    plain: str
    flags: Mapping[str, str] = field(default_factory=dict)
    valued: frozenset[str] = frozenset()
    words: bool = True


OLD: Mapping[str, Modes] = {
    "train": Modes("run", {"--print-config": "print-config", "--print-plan": "print-plan"}),
    "sweep": Modes("run", {"--check": "check", "--smoke": "smoke", "--print-config": "print-config"}),
    "report": Modes("study", {"--experiment": "experiment"}, frozenset({"--experiment"})),
    "bench": Modes("train", words=False),
}
"""Each command of modes, by name: ``ablate sweep S --check`` reads as ``ablate sweep check S``, ``ablate
sweep S`` as ``ablate sweep run S``, ``ablate bench`` as ``ablate bench train``."""


def spelled(argv: list[str], root: argparse.ArgumentParser) -> list[str]:
    """``argv`` in the spelling the parsers read: a plain command its plain mode, an old mode flag its mode."""
    if not argv or argv[0] not in OLD:
        return argv
    command, rest, modes = argv[0], [*argv[1:]], OLD[argv[0]]
    first = rest[0] if rest else "-"
    if first in {*subcommands(subcommands(root)[command]), "-h", "--help"} or not (modes.words or first[0] == "-"):
        return argv  # a mode named, help asked, or a word the plain mode does not take (argparse names it)
    given = [(i, a.partition("=")[0]) for i, a in enumerate(rest) if a.partition("=")[0] in modes.flags]
    if len(given) > 1:
        raise UsageError(f"{given[1][1]}: not with {given[0][1]} (each is a mode of ablate {command})")
    if not given:
        return [command, modes.plain, *rest]
    i, flag = given[0]
    mode, token = modes.flags[flag], rest.pop(i)
    if flag not in modes.valued:
        if token != flag:
            raise UsageError(f"{flag}: takes no value (now ablate {command} {mode})")
        return [command, mode, *rest]
    if token != flag:  # --experiment=NAME
        return [command, mode, token.partition("=")[2], *rest]
    if i == len(rest) or rest[i].startswith("-"):
        raise UsageError(f"{flag}: expected one argument")
    return [command, mode, rest.pop(i), *rest]


def misplaced(root: argparse.ArgumentParser, token: str, where: str) -> str:
    """The line for an argument that command ``where`` lacks: the commands that have that option (or the mode
    an old flag became), else where to look."""
    name = token.partition("=")[0]
    if not name.startswith("-"):
        return f"{token}: not an argument of {where} (see {where} --help)"
    command = where.split()[1]
    if command in OLD and name in OLD[command].flags:
        return f"{name}: not with {where} (a mode of its own: ablate {command} {OLD[command].flags[name]})"
    owners = [f"`{leaf.prog}`" for leaf in leaves(root) if name in leaf._option_string_actions]
    if 0 < len(owners) <= 3:
        listed = (f"{', '.join(owners[:-1])} and " if owners[:-1] else "") + owners[-1]
        return f"{name}: only for {listed} (not {where})"
    return f"{name}: not an option of {where} (see {where} --help)"


def foreign(command: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first option in ``argv`` that ``command`` lacks (nor abbreviates), if any: named before any other
    usage error, a missing argument included."""
    for token in argv:
        name = token.partition("=")[0]
        if (
            name.startswith("--")
            and name != "--"
            and not any(o.startswith(name) for o in command._option_string_actions)
        ):
            return name
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line read: a usage error raises :class:`~ablate.parsers.UsageError`, one line naming the
    option (``--n-trials: must be a positive integer, got 0``); ``--help`` still exits (status 0)."""
    root: Parser = parser()
    words = spelled(sys.argv[1:] if argv is None else argv, root)
    command: argparse.ArgumentParser = root
    depth = 0
    while depth < len(words) and words[depth] in subcommands(command):
        command, depth = subcommands(command)[words[depth]], depth + 1
    if not subcommands(command) and (name := foreign(command, words[depth:])) is not None:
        raise UsageError(misplaced(root, name, command.prog))
    args, extra = root.parse_known_args(words)
    if extra:
        raise UsageError(misplaced(root, extra[0], args.leaf))
    return args


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (a message is one line by rule; a multi-line one is joined)."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ablate.process import prepare

    prepare(verbose=args.verbose)  # all that ablate changes in its process, once, here (library notes hidden too)
    try:
        code = args.func(args)  # None, or a benchmark's 1 when a target was missed
    except AblateError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Interrupted as stop:  # SIGINT or SIGTERM: the runs it stopped are KILLED, with the signal as reason
        print(f"\ninterrupted by {stop.name}: {stop.advice or 'no run was left RUNNING'}", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:  # before the handlers were installed
        print("\ninterrupted by SIGINT", file=sys.stderr)
        return 130
    except Exception as exc:  # what no check foresaw: still one line (its run is FAILED, the reason tagged)
        if os.environ.get("ABLATE_TRACEBACK"):
            raise
        first = _one_line(exc)
        print(f"error: {type(exc).__name__}: {first} (ABLATE_TRACEBACK=1 shows where)", file=sys.stderr)
        return 2
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
