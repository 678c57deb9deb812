"""The engine's wheel: one top-level package, typed, licensed, without observers, and
importable from a plain virtual environment whatever folders the working directory holds.

The wheel is built from a copy of the source tree (``pip wheel --no-deps
--no-build-isolation``), so nothing in the checkout changes.  The install test creates a
plain venv (no system site-packages) and installs the wheel with its dependencies from the
package index (pip's cache makes that quick); about 15-20 s on a loaded 2-core machine,
so it is not marked slow.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with the tomli backport
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
DIST = PYPROJECT["project"]["name"].replace("-", "_")
DIST_INFO = f"{DIST}-{VERSION}.dist-info"
#: what the source tree holds besides the product (never copied into the build)
SKIP = shutil.ignore_patterns(
    ".venv",
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "tests",
    "bench",
    "examples",
    "docker",
    "percolator-data",
    ".hbase-local",
    "demo-out",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "src"
    shutil.copytree(ROOT, source, ignore=SKIP)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("*.whl")
    return built


def test_one_top_level_package_typed_everywhere(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"percolator", DIST_INFO}
    top_level = zipfile.ZipFile(wheel).read(f"{DIST_INFO}/top_level.txt").decode().split()
    assert top_level == ["percolator"]
    packages = {name.rsplit("/", 1)[0] for name in names if name.endswith("/__init__.py")}
    assert {
        "percolator",
        "percolator/oracle",
        "percolator/observers",
        "percolator/spark_jobs",
        "percolator/testing",
    } <= packages
    untyped = sorted(p for p in packages if f"{p}/py.typed" not in names)
    assert untyped == []
    # The generated gRPC modules' stubs ship too, or the types of oracle_pb2 are Any.
    assert "percolator/oracle/proto_gen/oracle_pb2.pyi" in names


def test_licence_and_metadata(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    licence = archive.read(f"{DIST_INFO}/licenses/LICENSE").decode()
    assert "Apache License" in licence and "Version 2.0" in licence
    metadata = archive.read(f"{DIST_INFO}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert f"Version: {VERSION}" in metadata


def test_the_engine_registers_no_observer(wheel: Path) -> None:
    entry_points = configparser.ConfigParser()
    entry_points.read_string(zipfile.ZipFile(wheel).read(f"{DIST_INFO}/entry_points.txt").decode())
    assert "percolator.observers" not in entry_points.sections()
    assert dict(entry_points["console_scripts"]) == {"percolator": "percolator.cli:main"}
    assert "status" in entry_points["percolator.commands"]


def test_installs_into_a_plain_venv_and_ignores_local_folders(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # Isolated: the engine must not be importable before its wheel is installed.
    assert (
        subprocess.run(
            [python, "-c", "import percolator"], capture_output=True, cwd=tmp_path
        ).returncode
        != 0
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert installed.returncode == 0, installed.stderr
    # A working directory with folders named like the repository's (issue 12): the
    # installed percolator.oracle and percolator.observers are imported, not these.
    work = tmp_path / "work"
    for folder in ("oracle", "observers", "spark_jobs"):
        (work / folder).mkdir(parents=True)
        (work / folder / "__init__.py").write_text(f"raise ImportError('local {folder}/')\n")
    code = (
        "import percolator, percolator.oracle, percolator.observers, percolator.oracle.client\n"
        "print(percolator.__version__)\n"
        "print(percolator.oracle.__file__)\n"
    )
    result = subprocess.run(
        [python, "-c", code], cwd=work, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    version, oracle_file = result.stdout.split()
    assert version == VERSION  # from the installed metadata
    assert Path(oracle_file).is_relative_to(venv)
    cli = subprocess.run(
        [venv / "bin" / "percolator", "--version"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert cli.stdout.strip() == f"percolator {VERSION}", cli.stderr
