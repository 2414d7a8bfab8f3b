import os
import shutil
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


def isolated(argv):
    """``argv`` run in a fresh network namespace whose only interface is loopback, so the Ray
    processes a test starts (which bind every interface) can only be reached on 127.0.0.1."""
    if shutil.which("unshare") and shutil.which("ip"):
        return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    return list(argv)


def rlrun_cmd(*args):
    return [sys.executable, "-m", "rlrun", *args]


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(list(args), tmp_path, **kw)
