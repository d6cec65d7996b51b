"""The package's shape: one namespace, imports that point one way (between the packages and between the
layers inside ``lightning_modules``), a CLI that answers without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES: dict[str, str] = {
    "lightning_modules": "ablate.lightning_modules",
    "datamodules": "ablate.datamodules",
    "sweeps": "ablate.sweeps",
    "reports": "ablate.reports",
    "benchmarks": "ablate.benchmarks",
    "ablate": "ablate",
}
"""Folder -> the package it installs as."""
ORDER = [
    "ablate.lightning_modules",
    "ablate.lightning_modules.config",
    "ablate.lightning_modules.model",
    "ablate.lightning_modules.measure",
    "ablate.datamodules",
    "ablate.lightning_modules.methods",
    "ablate.lightning_modules.interop",
    "ablate.sweeps.engine",
    "ablate.sweeps",
    "ablate.reports",
    "ablate.benchmarks",
    "ablate",
]
"""The layers, lowest first: a module may import only from its own layer or the ones below it: config
(validated dataclasses, YAML) -> model (blocks, encoder, heads) -> measure (accounting, latency,
memory) -> data (which reads configs only) -> methods (training modules, losses, pruning,
quantization) -> interop (transformers) -> the single-run engine -> studies -> reports -> benchmarks
-> the CLI. docs/development.md states the same order (:func:`test_the_docs_state_this_order`)."""


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every ablate module ``path`` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
            found |= {node.module} & known
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & known
    return found


def _layer(module: str) -> int:
    """The layer of the longest package that holds ``module``."""
    holders = [p for p in ORDER if module == p or module.startswith(p + ".")]
    return ORDER.index(max(holders, key=len))


GRAPH = {m: _imports(p, set(_modules())) for m, p in _modules().items()}


def test_every_module_imports_through_the_ablate_namespace() -> None:
    old = ("lightning_modules", "datamodules", "sweeps", "reports", "benchmarks")
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            assert not any(n.split(".")[0] in old for n in names), f"{module} imports {names} outside ablate.*"


def _documented_order() -> list[str]:
    """The layer order docs/development.md states: the code block after "Imports point one way"."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    block = text.split("Imports point one way", 1)[1].split("```", 2)[1]
    return [name.strip() for name in block.split("->")]


def test_the_docs_state_this_order() -> None:
    """Every layer docs/development.md names is one of :data:`ORDER`, in the same order, and every layer
    of :data:`ORDER` is named there (``ablate.lightning_modules`` itself is only the namespace)."""
    assert _documented_order() == [p for p in ORDER if p != "ablate.lightning_modules"]


def test_imports_point_one_way() -> None:
    """No module imports a later layer of :data:`ORDER`."""
    upward = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() for b in bs if _layer(b) > _layer(a))
    assert upward == []


CONFIG = {m for m in _modules() if m.startswith("ablate.lightning_modules.config")}


def test_the_config_layer_imports_no_model_code() -> None:
    """Reading and validating a config needs nothing above it (and so no torch): the config layer
    imports only itself."""
    assert {m: sorted(GRAPH[m] - CONFIG) for m in CONFIG if GRAPH[m] - CONFIG} == {}


def test_the_data_layer_imports_only_the_config_of_lightning_modules() -> None:
    """Data modules read configs, never models: a model they use (augmentation's masked LM) is handed in
    by the caller, typed by a Protocol (``ablate.datamodules.augment.MaskedLM``)."""
    data = {m for m in _modules() if m.startswith("ablate.datamodules")}
    lightning = {m for m in _modules() if m.startswith("ablate.lightning_modules.")}
    assert {m: sorted(GRAPH[m] & lightning - CONFIG) for m in data if GRAPH[m] & lightning - CONFIG} == {}


def _imported_here(path: Path) -> set[str]:
    """The names a module's top level imports from other ablate modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        a.asname or a.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ablate")
        for a in node.names
    }


def test_names_are_imported_from_their_home() -> None:
    """No re-export shims: nothing (the package nor its tests) imports a name through a module that only
    imported it, so each name has one home and moving it moves its importers."""
    modules = _modules()
    through = {m: _imported_here(p) for m, p in modules.items()}
    found = []
    for path in [*modules.values(), *sorted((ROOT / "tests").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in through:
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {a.name} through {node.module}"
                    for a in node.names
                    if a.name in through[node.module] and f"{node.module}.{a.name}" not in modules
                ]
    assert found == []


def test_no_import_cycles() -> None:
    seen: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(module: str, stack: list[str]) -> None:
        seen[module] = 1
        for target in sorted(GRAPH[module]):
            assert seen.get(target) != 1, " -> ".join([*stack[stack.index(target) :], target])
            if target not in seen:
                visit(target, [*stack, target])
        seen[module] = 2

    for module in sorted(GRAPH):
        if module not in seen:
            visit(module, [module])


@pytest.mark.parametrize("package", ORDER)
def test_each_package_imports_alone(package: str) -> None:
    code = f"import {package}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr


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
    "args",
    [
        ["--help"],
        ["train", "--help"],
        ["params", "nope.yaml"],
        ["train", "bad.yaml"],
        ["sweep", "bad.yaml"],
        ["train", "bad.yaml", "--print-config"],
        ["train", "albert-tiny", "trainer.max_steps=5", "--print-config"],
    ],
)
def test_help_and_config_errors_answer_without_torch(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "bad.yaml").write_text("model:\n  embed_dim: -3\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.strip().splitlines()[-1] in ("no torch 0", "no torch 2"), done.stdout + done.stderr
    if args[0] != "--help" and args[-1] != "--help" and args[1] != "albert-tiny":
        assert done.stderr.strip().startswith("error: "), done.stderr


def test_params_counts_without_lightning(tmp_path: Path) -> None:
    """``ablate params`` builds the model and counts it: torch, but not Lightning (seconds of imports)."""
    script = _NO_TORCH.replace('"torch imported" if "torch"', '"lightning imported" if "lightning"')
    script = script.replace('"no torch"', '"no lightning"')
    done = subprocess.run([sys.executable, "-c", script, "params", "albert-tiny"], capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "no lightning 0", done.stdout + done.stderr
    assert "backbone" in done.stdout


def _reading_path() -> list[tuple[str, str]]:
    """docs/development.md's "Reading one fine-tuning run" table: (file, the first name it says to read)."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    section = text.split("### Reading one fine-tuning run", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    return [(cells[2].strip().strip("`"), cells[3].split("`")[1]) for cells in rows]


def _defines(path: Path, dotted: str) -> bool:
    """Whether ``path`` defines ``dotted`` (a top-level function or class, or ``Class.method``)."""
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for part in dotted.split("."):
        found = [n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part]
        if not found:
            return False
        scope = found[0].body if isinstance(found[0], ast.ClassDef) else []
    return True


def test_a_fine_tuning_run_reads_in_eight_files_each_reached_from_the_ones_before() -> None:
    path = _reading_path()
    assert 6 <= len(path) <= 8, path
    for i, (name, symbol) in enumerate(path):
        assert (ROOT / name).is_file(), f"docs/development.md's reading path names {name}, which is not there"
        assert _defines(ROOT / name, symbol), f"{name} does not define {symbol}"
        if i:  # the path is connected: something read before names what this file is read for
            before = "".join((ROOT / earlier).read_text(encoding="utf-8") for earlier, _ in path[:i])
            assert symbol.split(".")[0] in before, f"{symbol} ({name}) is not reached from the files before it"


def test_module_docstrings_say_their_purpose_in_five_lines_at_most() -> None:
    """Narratives belong in docs/, where they are read and kept true; a module says what it is for."""
    long = {
        module: n
        for module, path in _modules().items()
        if (doc := ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False))
        and (n := len(doc.splitlines())) > 5
    }
    assert not long, f"module docstrings over five lines: {long}"
