"""The layering and no-cycle rules (pyproject's [tool.importlinter]) are checked, and the
checker really fails on a planted cycle and a planted upward import.

lint-imports runs on the installed layout staged by tools/layout.py (import-linter, like
mypy, cannot read pyproject's package-dir mapping)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def stage(dest: Path) -> Path:
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "layout.py"), str(dest)], check=True, cwd=REPO
    )
    return dest


def lint(staged: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(staged))
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=staged,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stage(tmp_path_factory.mktemp("layout") / "layout")


def test_the_code_keeps_every_contract(staged: Path) -> None:
    result = lint(staged)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 kept, 0 broken" in result.stdout


def plant(staged: Path, tmp_path: Path, module: str, line: str) -> Path:
    copy = tmp_path / "planted"
    shutil.copytree(staged, copy)
    target = copy / "percolator" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    return copy


def test_a_planted_upward_import_is_caught(staged: Path, tmp_path: Path) -> None:
    # The engine's layout module importing the observers package above it.
    result = lint(plant(staged, tmp_path, "layout.py", "import percolator.observers.api"))
    assert result.returncode != 0
    assert "Layers" in result.stdout and "BROKEN" in result.stdout
    assert "percolator.layout -> percolator.observers.api" in result.stdout


def test_a_planted_cycle_is_caught(staged: Path, tmp_path: Path) -> None:
    # The transaction importing the client that creates transactions: a cycle.
    result = lint(plant(staged, tmp_path, "transaction.py", "import percolator.client"))
    assert result.returncode != 0
    assert "No import cycle" in result.stdout
    assert "No cycles are allowed in percolator" in result.stdout
