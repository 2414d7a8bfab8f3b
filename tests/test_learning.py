"""One-seed learning tests of every preset: each must reach its target within its env-step budget.

Multi-seed studies live in experiments/ (see experiments/README.md).
"""

import re

import pytest

from rlrun.cli import compose
from rlrun.run import run

pytestmark = pytest.mark.slow


def test_ppo_cartpole_reaches_475_within_150k_steps_through_the_cli(cli, tmp_path):
    # the exact user command, with the default MLflow store in the launch dir
    p = cli("+experiment=ppo_cartpole", "seed=0")
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    m = re.search(r"steps\s+([\d,]+)\s+return\s+([\d.]+).*stopped: rollout/episode_return_mean", last)
    assert m, last
    steps, ret = int(m[1].replace(",", "")), float(m[2])
    assert ret >= 475 and steps <= 150_000, last
    assert (tmp_path / "mlflow.db").is_file()


def test_pg_cartpole_reaches_150_within_200k_steps(tmp_path):
    cfg = compose(["+experiment=pg_cartpole", "seed=0", "tracking=none", "progress=false",
                   f"output_dir={tmp_path}"])
    r = run(cfg, launch_dir=tmp_path)
    assert r.target_met, r.stop_reason
    assert r.metrics["rollout/episode_return_mean"] >= 150
    assert r.metrics["timesteps_total"] <= 200_000
