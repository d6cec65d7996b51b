"""Commands with their own options: every command and mode (``ablate sweep check``, ``ablate report
experiment``, ``ablate bench loop``) is a subcommand whose ``--help`` lists only the options it reads; an
option given to a command without it is one ``error:`` line naming the commands that have it, exit 2,
nothing created; the old spellings (``ablate sweep STUDY --check``, ``ablate report --experiment NAME``,
``ablate bench``) read as the new ones."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ablate.cli import main, parse_args
from ablate.parsers import leaves, parser, subcommands
from tests.sweeps.conftest import write_study


def _options(text: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]*", text)) - {"--help"}


def _paths(p: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The words that name each command and mode: ("sweep", "check"), ("bench", "loop"), ..."""
    below = subcommands(p)
    if not below:
        yield words
    for name, child in below.items():
        yield from _paths(child, (*words, name))


def test_every_command_is_found():
    assert len(list(_paths(parser()))) == len(list(leaves(parser()))) >= 19


@pytest.mark.parametrize("words", [" ".join(words) for words in _paths(parser())])
def test_each_command_shows_only_its_own_options(words, capsys):
    """A command's ``--help`` usage names exactly its options: none of another command's."""
    with pytest.raises(SystemExit) as exc:
        main([*words.split(), "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    leaf = max((leaf for leaf in leaves(parser()) if out.startswith(f"usage: {leaf.prog} ")), key=lambda c: len(c.prog))
    own = {o for a in leaf._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    assert _options(out.split("\n\n")[0]) == own  # the usage block


@pytest.mark.parametrize(
    ("command", "lacks"),
    [
        ("sweep check", {"--storage", "--n-trials", "--tracking-uri"}),
        ("sweep smoke", {"--storage", "--n-trials", "--tracking-uri"}),
        ("sweep print-config", {"--storage", "--n-trials", "--tracking-uri"}),
        ("train print-config", {"--checkpoints", "--resume", "--tracking-uri"}),
        ("report experiment", {"--study", "--remeasure"}),
        ("bench deploy", {"--case", "--compile", "--corpus", "--steps", "--device"}),
        ("bench study", {"--case", "--compile", "--corpus", "--steps", "--regime"}),
        ("bench train", {"--smoke", "--regime", "--task", "--batch", "--sst2"}),
    ],
)
def test_a_mode_lacks_what_it_does_not_read(command, lacks, capsys):
    with pytest.raises(SystemExit):
        main([*command.split(), "--help"])
    assert not _options(capsys.readouterr().out) & lacks


def test_every_command_has_a_description_in_the_top_level_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name, command in subcommands(parser()).items():
        assert re.search(rf"^ +{name}\s+[a-z]", out, re.M), name  # its name, then its one line
        assert command.description, name
        assert all(mode.description for mode in subcommands(command).values()), name
    assert "bench" in out.split("\n\n")[1]  # the one-line description names every command


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [
                "bench",
                "deploy",
                "--smoke",
                "--case",
                "bert-base",
                "--compile",
                "--corpus",
                "/nonexistent",
                "--steps",
                "3",
            ],
            "error: --case: only for `ablate bench train`, `ablate bench precision` and `ablate bench loop` "
            "(not ablate bench deploy)",
        ),
        (
            ["sweep", "S.yaml", "--print-config", "--n-trials", "1", "--tracking-uri", "sqlite:///x.db"],
            "error: --n-trials: only for `ablate sweep` (not ablate sweep print-config)",
        ),
        (
            ["sweep", "--check", "S.yaml", "--n-trials", "2", "--storage", "sqlite:///x.db"],
            "error: --n-trials: only for `ablate sweep` (not ablate sweep check)",
        ),
        (
            ["sweep", "check", "S.yaml", "--tracking-uri", "sqlite:///x.db"],
            "error: --tracking-uri: not an option of ablate sweep check (see ablate sweep check --help)",
        ),
        (
            ["sweep", "S.yaml", "--check", "--smoke"],
            "error: --smoke: not with --check (each is a mode of ablate sweep)",
        ),
        (["sweep", "check", "S.yaml", "--smoke"], "error: --smoke: not with ablate sweep check (a mode of its own: "),
        (
            ["train", "albert-tiny", "--print-plan", "--checkpoints", "x"],
            "error: --checkpoints: only for `ablate train`",
        ),
        (["report", "--experiment", "E", "--remeasure"], "error: --remeasure: only for `ablate report` (not ablate"),
        (["report", "--experiment"], "error: --experiment: expected one argument"),
        (["report", "quickstart", "--tag", "a=b"], "error: --tag: only for `ablate report experiment`"),
        (["report", "experiment", "E", "quickstart"], "error: quickstart: not an argument of ablate report experiment"),
        (["bench", "study", "S.yaml", "--steps", "3"], "error: --steps: not an option of ablate bench study"),
        (["bench", "--smoke"], "error: --smoke: only for `ablate bench study` and `ablate bench deploy`"),
        (["bench", "nope"], "error: BENCH: invalid choice: 'nope'"),
        (["sweep", "run"], "error: ablate sweep: the following arguments are required: STUDY"),
    ],
)
def test_an_option_a_command_lacks_is_one_line_and_exit_2(argv, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err
    assert list(tmp_path.iterdir()) == []


def test_the_issue_s_bench_deploy_line_exits_2_without_a_traceback(tmp_path):
    argv = ["bench", "deploy", "--smoke", "--case", "bert-base", "--compile", "--corpus", "/nonexistent"]
    done = subprocess.run([sys.executable, "-m", "ablate", *argv], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: --case: ") and len(done.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["sweep", "S.yaml", "--check"], ["sweep", "check", "S.yaml"]),
        (["sweep", "--check", "S.yaml", "a=1"], ["sweep", "check", "S.yaml", "a=1"]),
        (["sweep", "S.yaml", "--smoke"], ["sweep", "smoke", "S.yaml"]),
        (["sweep", "S.yaml", "x=2", "--print-config"], ["sweep", "print-config", "S.yaml", "x=2"]),
        (["sweep", "S.yaml", "--n-trials", "2"], ["sweep", "run", "S.yaml", "--n-trials", "2"]),
        (["train", "albert-tiny", "--print-config"], ["train", "print-config", "albert-tiny"]),
        (["train", "c.yaml", "k=v", "--print-plan"], ["train", "print-plan", "c.yaml", "k=v"]),
        (["train", "--resume", "abc"], ["train", "run", "--resume", "abc"]),
        (["report", "--experiment", "E", "--tag", "a=b"], ["report", "experiment", "E", "--tag", "a=b"]),
        (["report", "--tag", "a=b", "--experiment=E"], ["report", "experiment", "E", "--tag", "a=b"]),
        (["report", "quickstart", "--no-remeasure"], ["report", "study", "quickstart", "--no-remeasure"]),
        (["bench"], ["bench", "train"]),
        (["bench", "--steps", "3", "--case", "micro"], ["bench", "train", "--steps", "3", "--case", "micro"]),
        (["bench", "study", "S.yaml", "--smoke"], ["bench", "study", "S.yaml", "--smoke"]),
    ],
)
def test_old_spellings_read_as_the_new_ones(old, new):
    assert vars(parse_args(old)) == vars(parse_args(new))


def test_check_runs_in_the_new_spelling_and_the_old(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here. Another one there.\n\nA second document. With two sentences.\n")
    path = write_study(tmp_path, corpus)
    assert main(["sweep", "check", str(path)]) == 0
    new = capsys.readouterr().out
    assert main(["sweep", str(path), "--check"]) == 0
    assert capsys.readouterr().out == new
    assert "study tiny: valid; 2 trials" in new
    assert not (tmp_path / "runs").exists()


def test_print_config_writes_the_yaml_alone_in_both_spellings(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    printed = []
    for argv in (
        ["train", "print-config", "albert-tiny", "seed=3"],
        ["train", "albert-tiny", "seed=3", "--print-config"],
    ):
        assert main(argv) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and "seed: 3" in printed[0]
    assert list(tmp_path.iterdir()) == []


_NO_TORCH = """
import sys
from ablate.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("torch imported" if "torch" in sys.modules else "no torch", code)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "check", "bad.yaml"],
        ["train", "print-config", "albert-tiny", "seed=1"],
        ["bench", "loop", "--help"],
        ["bench", "deploy", "--steps", "3"],
    ],
)
def test_the_new_spellings_answer_without_torch(tmp_path, argv):
    (tmp_path / "bad.yaml").write_text("model:\n  embed_dim: -3\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, *argv], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.strip().splitlines()[-1] in ("no torch 0", "no torch 2"), done.stdout + done.stderr
