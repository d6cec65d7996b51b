"""MkDocs hook: lets mkdocstrings find the ``ablate.*`` packages by static analysis.

setuptools installs the repository's top-level folders under one namespace
(``[tool.setuptools.package-dir]`` in pyproject.toml: ``ablate.lightning_modules`` is the
folder ``lightning_modules/``, and so on). griffe, which mkdocstrings uses to read the
docstrings, finds packages on the filesystem and does not know that mapping, not even
through the editable install (it would find ``ablate/`` and nothing under it). So at each
build this hook lays the namespace out in a temporary folder, one symbolic link per mapped
folder, and makes that folder the only source path of mkdocstrings' Python handler.

Nothing is imported and nothing needs to be installed: the API page builds from the source
tree alone. Without a mapping in pyproject.toml (the layout before the namespace), the five
design-card folders are mapped by their names.

The docstrings also use Sphinx roles (:class:`ConfigError`), which Markdown leaves as text;
the rendered pages keep the code span and drop the role.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

log = logging.getLogger("mkdocs.hooks.namespace")

NAMESPACE = "ablate"
FOLDERS = ("lightning_modules", "datamodules", "sweeps", "reports", "benchmarks")
_made: list[Path] = []
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):(?=<code>)")


def package_dirs(root: Path) -> dict[str, str]:
    """``[tool.setuptools.package-dir]`` of pyproject.toml, or the design card's folders."""
    mapping: dict[str, str] = {}
    if tomllib is not None and (root / "pyproject.toml").is_file():
        with open(root / "pyproject.toml", "rb") as f:
            setuptools = tomllib.load(f).get("tool", {}).get("setuptools", {})
        mapping = dict(setuptools.get("package-dir", {}))
    if not any(name.startswith(NAMESPACE + ".") for name in mapping):
        mapping.update({f"{NAMESPACE}.{folder}": folder for folder in FOLDERS if (root / folder).is_dir()})
    return mapping


def _link(target: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(target.resolve(), target_is_directory=target.is_dir())
    except OSError:  # no symbolic links (some Windows set-ups): a copy reads the same
        if target.is_dir():
            shutil.copytree(target, link)
        else:
            shutil.copy2(target, link)


def build_namespace(root: Path, into: Path) -> Path:
    """Lay ``ablate/`` out under ``into`` as setuptools installs it; return ``into``."""
    mapping = package_dirs(root)
    package = into / NAMESPACE
    package.mkdir(parents=True)
    own = root / mapping.get(NAMESPACE, NAMESPACE)
    if own.is_dir():  # ablate/__init__.py, cli.py, ... of the repository
        for entry in own.iterdir():
            if entry.name != "__pycache__":
                _link(entry, package / entry.name)
    if not (package / "__init__.py").exists():
        (package / "__init__.py").write_text('"""ablate: a research harness for BERT compression ablations."""\n')
    # outer packages first, so that a mapped subpackage lands inside its parent's link
    for name, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        if not name.startswith(NAMESPACE + "."):
            continue
        link = into.joinpath(*name.split("."))
        if not link.exists() and (root / folder).is_dir():
            _link(root / folder, link)
    return into


@event_priority(100)  # before mkdocstrings' own on_config, which creates the handler
def on_config(config, **kwargs):
    root = Path(config.config_file_path).parent
    into = build_namespace(root, Path(tempfile.mkdtemp(prefix="ablate-docs-")))
    _made.append(into)
    plugin = config.plugins.get("mkdocstrings")
    if plugin is not None:
        plugin.config.handlers.setdefault("python", {})["paths"] = [str(into)]
    log.debug("ablate namespace for mkdocstrings laid out in %s", into)
    return config


def on_shutdown(**kwargs):
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


def on_page_content(html, **kwargs):
    return _ROLE.sub("", html)
