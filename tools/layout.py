"""Stage the installed layout of the source tree for tools that cannot read pyproject's
``package-dir`` mapping (mypy, import-linter).

The wheel installs ``oracle/`` as ``percolator.oracle`` (and so on, see pyproject.toml), and an
editable install maps those names at import time; static tools only see folders.  This copies
every mapped package's Python files into ``DEST/percolator/...`` exactly as the wheel lays them
out, so ``MYPYPATH=DEST mypy -p percolator`` and ``PYTHONPATH=DEST lint-imports`` see the
names the code imports.  The copy is throw-away (recreated at every call).

    python tools/layout.py build/layout
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".pyi", ".typed"}


def package_dirs() -> dict[str, Path]:
    """Installed package name -> source folder, from pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items()}


def stage(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    for name, source in package_dirs().items():
        target = dest.joinpath(*name.split("."))
        for path in source.rglob("*"):
            if path.suffix not in SUFFIXES or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(source)
            out = target / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/layout.py DEST")
    stage(Path(sys.argv[1]))
