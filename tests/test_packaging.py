"""Packaging: pyproject.toml declares every third-party package ablate imports, and the optional
parts stay optional.

- Every import in the product modules (the folders of ``[tool.setuptools.package-dir]``) is a
  dependency, or an extra when it is imported lazily (inside a function): a module-level import
  of an extra would break ``import ablate...`` without it.
- Every ``require("module", "extra")`` names an extra that installs that module.
- transformers, huggingface_hub, psycopg and optuna-dashboard are extras, not dependencies, and
  the ``test`` extra pulls them all in (``make test`` installs ``.[test]``).
- The tests' own imports are declared too (dependencies or any extra).
- A missing optional package is one ``error:`` line naming the extra, exit status 2.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

from ablate.lightning_modules.config.errors import AblateError, require, require_driver

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
FIRST_PARTY = {"ablate", "tests"}
# import names whose distribution is spelled otherwise (checked before the installed metadata)
DISTRIBUTIONS = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow", "pydantic_core": "pydantic-core"}
# documentation helpers that are not part of ablate or its suite (each says what it needs)
NOT_SHIPPED = {ROOT / "docs" / "screenshot_mlflow.py"}
OPTIONAL = {"transformers": "hf", "huggingface-hub": "hf", "psycopg": "postgres", "optuna-dashboard": "dashboard"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_norm(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", r).group(1)) for r in requirements}


def _extra(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The distributions extra ``name`` installs, following ``ablate[...]`` self-references."""
    out: set[str] = set()
    for req in PROJECT["optional-dependencies"][name]:
        if m := re.fullmatch(r"\s*ablate\[([^\]]+)\]\s*", req):
            for inner in (x.strip() for x in m.group(1).split(",")):
                if inner not in seen:
                    out |= _extra(inner, seen | {name})
        else:
            out |= _names([req])
    return out


DEPENDENCIES = _names(PROJECT["dependencies"])
EXTRAS = {name: _extra(name) for name in PROJECT["optional-dependencies"]}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()  # import name -> distributions (slow: once)


def _distributions(module: str) -> set[str]:
    """Every distribution name an import name may come from."""
    installed = _installed().get(module, [])
    return {_norm(d) for d in [module, *installed, *([DISTRIBUTIONS[module]] if module in DISTRIBUTIONS else [])]}


def _third_party(name: str) -> bool:
    return name not in sys.stdlib_module_names and name not in FIRST_PARTY


class _Imports(ast.NodeVisitor):
    """Top-level package names imported, each with whether it is imported lazily (in a function
    or under ``if TYPE_CHECKING``), and the ``require("module", "extra")`` calls."""

    def __init__(self) -> None:
        self.imports: list[tuple[str, bool]] = []
        self.requires: list[tuple[str, str]] = []
        self.lazy = 0

    def _nested(self, node: ast.AST) -> None:
        self.lazy += 1
        self.generic_visit(node)
        self.lazy -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            self._nested(node)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.imports += [(a.name.split(".")[0], self.lazy > 0) for a in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.imports.append((node.module.split(".")[0], self.lazy > 0))

    def visit_Call(self, node: ast.Call) -> None:
        args = node.args
        if isinstance(node.func, ast.Name) and node.func.id == "require" and len(args) == 2:
            if all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
                self.requires.append((args[0].value, args[1].value))
        self.generic_visit(node)


def _scan(folders: list[Path]) -> dict[Path, _Imports]:
    found = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if path not in NOT_SHIPPED:
                found[path] = _Imports()
                found[path].visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


PRODUCT = _scan([ROOT / d for d in PYPROJECT["tool"]["setuptools"]["package-dir"].values()])


def test_the_scan_sees_the_product():
    """A guard for the scan itself: it finds the modules and the imports the checks rely on."""
    assert len(PRODUCT) > 50
    eager = {name for scan in PRODUCT.values() for name, lazy in scan.imports if not lazy}
    assert {"torch", "optuna", "mlflow", "yaml", "pandas"} <= eager
    lazy = {name for scan in PRODUCT.values() for name, lazy in scan.imports if lazy}
    assert "sqlalchemy" in lazy  # sweeps/engine/tracking.py imports it in check_database
    requires = {r for scan in PRODUCT.values() for r in scan.requires}
    assert {("transformers", "hf"), ("psycopg", "postgres")} <= requires
    assert _distributions("yaml") >= {"pyyaml"}


def test_product_imports_are_declared():
    """Module-level imports are dependencies; lazy ones are dependencies or in an extra."""
    anywhere = DEPENDENCIES.union(*(v for k, v in EXTRAS.items() if k != "test"))
    problems = []
    for path, scan in PRODUCT.items():
        for name, lazy in scan.imports:
            if not _third_party(name):
                continue
            where = path.relative_to(ROOT)
            if not _distributions(name) & (anywhere if lazy else DEPENDENCIES):
                problems.append(
                    f"{where}: imports {name}, "
                    + ("declared nowhere" if lazy or not _distributions(name) & anywhere else "only in an extra")
                )
    assert not problems, "undeclared imports (pyproject.toml):\n" + "\n".join(sorted(set(problems)))


def test_require_names_an_extra_that_installs_it():
    problems = []
    for path, scan in PRODUCT.items():
        for module, extra in scan.requires:
            top = module.split(".")[0]
            if extra not in EXTRAS or not _distributions(top) & EXTRAS[extra]:
                problems.append(f"{path.relative_to(ROOT)}: require({module!r}, {extra!r})")
    assert not problems, "require() names an extra that does not install the module:\n" + "\n".join(problems)


def test_optional_packages_stay_optional():
    for dist, extra in OPTIONAL.items():
        assert dist not in DEPENDENCIES, f"{dist} is a hard dependency; it belongs to the extra {extra}"
        assert dist in EXTRAS[extra], f"{dist} is not in the extra {extra}"
        assert dist in EXTRAS["test"], f"the test extra does not install {dist} (make test needs it)"


def test_test_imports_are_declared():
    declared = DEPENDENCIES.union(*EXTRAS.values())
    scans = _scan([ROOT / "tests", ROOT / "docs", ROOT / "tools"])
    problems = {
        f"{path.relative_to(ROOT)}: imports {name}"
        for path, scan in scans.items()
        for name, _ in scan.imports
        if _third_party(name) and not _distributions(name) & declared
    }
    assert not problems, "undeclared imports in tests/docs/tools (add them to the test extra):\n" + "\n".join(
        sorted(problems)
    )


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Finds the named packages (and their submodules) nowhere, as when they are not installed."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.fixture()
def hide(monkeypatch):
    """Make packages importable no more, as if not installed (loaded ones forgotten for the test)."""

    def hide(*names: str) -> None:
        for loaded in [m for m in sys.modules if m.split(".")[0] in names]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setattr(sys, "meta_path", [_NotInstalled(names), *sys.meta_path])

    return hide


def test_require_is_one_line_naming_the_extra(hide, tmp_path):
    assert require("json", "hf").dumps([1]) == "[1]"  # present: the module itself
    hide("transformers")
    line = "transformers is not installed: run pip install -e '.[hf]' in the ablate checkout"
    with pytest.raises(AblateError) as exc:
        require("transformers.utils.logging", "hf")
    assert str(exc.value) == line
    # through the sites: the transformers model map, and loading a transformers checkpoint folder
    from ablate.lightning_modules.config.presets import get_preset
    from ablate.lightning_modules.interop.maps import hf_config
    from ablate.lightning_modules.interop.pretrained import load_pretrained

    with pytest.raises(AblateError) as exc:
        hf_config(get_preset("bert-tiny"), "bert")
    assert str(exc.value) == line
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(AblateError) as exc:
        load_pretrained(tmp_path)
    assert str(exc.value) == line


def test_require_an_unimportable_package(tmp_path, monkeypatch):
    (tmp_path / "ablate_broken_pkg.py").write_text("raise ImportError('no pq wrapper available')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AblateError) as exc:
        require("ablate_broken_pkg", "postgres")
    assert str(exc.value) == (
        "ablate_broken_pkg cannot be imported (no pq wrapper available): run pip install -e '.[postgres]' "
        "in the ablate checkout"
    )


def test_missing_psycopg_is_one_cli_line(hide, capsys):
    from ablate.cli import main

    require_driver("sqlite:///x.db")  # SQLite needs no extra
    require_driver("postgresql://u:pw@127.0.0.1:1/optuna")  # psycopg is installed here
    hide("psycopg")
    line = "error: psycopg is not installed: run pip install -e '.[postgres]' in the ablate checkout\n"
    quickstart = str(ROOT / "sweeps" / "studies" / "quickstart.yaml")
    for argv in (
        ["sweep", quickstart, "--storage", "postgresql://u:pw@127.0.0.1:1/optuna"],
        ["report", quickstart, "--tracking-uri", "postgresql+psycopg://u:pw@127.0.0.1:1/mlflow"],
    ):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == line, argv
