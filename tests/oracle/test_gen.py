"""The generated gRPC code is reproducible from proto/oracle.proto, and the check notices drift."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from percolator.oracle import gen

from tests.oracle.procs import REPO


def test_committed_code_matches_the_proto() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "percolator.oracle.gen", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_the_check_reports_edited_missing_and_stray_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "proto_gen"
    shutil.copytree(gen.OUTPUT_DIR, copy)
    monkeypatch.setattr(gen, "OUTPUT_DIR", copy)
    assert gen.check() == []
    pb2 = copy / "oracle_pb2.py"
    pb2.write_text(pb2.read_text() + "# edited\n")
    (copy / "oracle_pb2_grpc.pyi").unlink()
    (copy / "stray.py").write_text("")
    assert gen.check() == [
        "oracle/proto_gen/oracle_pb2.py differs from proto/oracle.proto's output",
        "oracle/proto_gen/oracle_pb2_grpc.pyi is missing",
        "oracle/proto_gen/stray.py is not produced from proto/oracle.proto",
    ]
