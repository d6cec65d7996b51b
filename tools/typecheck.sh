#!/usr/bin/env bash
# Type-check every ablate package with mypy as [tool.mypy] in pyproject.toml says (--strict on
# every package). Extra arguments go to mypy. Run from anywhere; PY picks the interpreter (default
# .venv/bin/python, relative to the repository).
#
# The packages import as ablate.* but their folders sit at the repository's top (setuptools maps
# them, [tool.setuptools.package-dir]); mypy cannot follow that mapping, so this links them under
# .typecheck/ablate/ (git-ignored), which pyproject's mypy_path points at:
#   .typecheck/ablate/{__init__,__main__,cli}.py -> ../../ablate/*.py
#   .typecheck/ablate/<package>                  -> ../../<folder>
set -euo pipefail

PY=${PY:-.venv/bin/python}
if [[ $PY == */* && $PY != /* && -e $PY ]]; then  # a path relative to where we were called from
    PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tree=.typecheck/ablate
mkdir -p "$tree"
link() {  # link TARGET NAME: NAME -> TARGET (relative to NAME's folder), replacing an older link
    if [[ -e $2 && ! -L $2 ]]; then
        echo "typecheck.sh: $2 is not a link; remove it and run again" >&2
        exit 2
    fi
    ln -sfn "$1" "$2"
}
# the package -> folder mapping, from pyproject (a failure here stops the script, set -e)
mapping=$("$PY" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    for package, folder in tomllib.load(f)["tool"]["setuptools"]["package-dir"].items():
        print(package, folder.rstrip("/"))
')
while read -r package folder; do
    if [[ $package == ablate ]]; then
        for f in "$folder"/*.py; do link "../../$f" "$tree/${f##*/}"; done
    elif [[ $package == ablate.* && ${package#ablate.} != *.* ]]; then
        link "../../$folder" "$tree/${package#ablate.}"
    else
        echo "typecheck.sh: cannot link $package (only ablate and ablate.<name> are handled)" >&2
        exit 2
    fi
done <<<"$mapping"
find .typecheck -type l ! -exec test -e {} \; -delete  # links to what no longer exists

exec "$PY" -m mypy "$@"  # files, paths and flags: [tool.mypy] in pyproject.toml
