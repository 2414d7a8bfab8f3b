import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
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


def on_ray_cluster(command, port):
    """argv: start a 2-CPU Ray head on ``port``, run the shell ``command`` against it, stop the head
    and exit with the command's status (90: the head did not start). In a loopback-only namespace."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths have a length limit
    script = textwrap.dedent(f"""
        set -u
        ray start --head --port={port} --num-cpus=2 --include-dashboard=false --disable-usage-stats \\
            --temp-dir={ray_tmp} >/dev/null 2>&1 || exit 90
        {command}
        rc=$?
        # stop only this head's processes (their command lines name its temp dir): `ray stop --force`
        # would kill every Ray process on the machine
        for sig in TERM KILL; do
            for pid in $(pgrep -f -- "{ray_tmp}"); do [ "$pid" != "$$" ] && kill -$sig "$pid" 2>/dev/null; done
            sleep 2
        done
        rm -rf "{ray_tmp}"
        exit $rc
    """)
    return isolated(["bash", "-c", script])


def rlrun_cmd(*args):
    return [sys.executable, "-m", "rlrun", *args]


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(list(args), tmp_path, **kw)
