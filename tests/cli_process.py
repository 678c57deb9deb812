"""The ``percolator`` command run as a subprocess, for tests of what a user sees."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_percolator(
    args: list[str],
    env: Mapping[str, str] | None = None,
    *,
    cwd: Path = ROOT,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m percolator ARGS`` in ``cwd``, its output captured as text.  The
    environment is this process's without any ``PERCOLATOR_*`` variable, plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PERCOLATOR_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "percolator", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
