import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(args, cwd, timeout=600, env=None):
    """Run the real `python -m rlrun` in ``cwd``; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlrun", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(list(args), tmp_path, **kw)
