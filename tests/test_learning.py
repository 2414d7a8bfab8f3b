"""One-seed learning tests of every preset: each must reach its target within its env-step budget.

Multi-seed studies live in experiments/ (see experiments/README.md).
"""

import os
import re
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from rlrun.app.cli import compose
from rlrun.app.runner import run

from .conftest import REPO, run_summary

pytestmark = pytest.mark.slow


def test_ppo_cartpole_reaches_475_within_150k_steps_through_the_cli(cli, tmp_path):
    # the exact user command, with the default MLflow store in the launch dir
    p = cli("+experiment=ppo_cartpole", "seed=0")
    assert p.returncode == 0, p.stderr[-3000:]
    summary = run_summary(p.stdout)
    assert summary["stopped"].startswith("rollout/episode_return_mean"), summary
    steps, ret = int(summary["steps"]), float(summary["final"])
    assert ret >= 475 and steps <= 150_000, summary
    assert (tmp_path / "mlflow.db").is_file()

    # the saved policy, evaluated greedily by the separate console script, with a video in MLflow
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "rlrun.app.eval_cli", "checkpoint=latest", "episodes=20", "render=true"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"greedy return over 20 episodes: mean ([\d.]+)", p.stdout)
    assert m and float(m[1]) >= 475, p.stdout
    run_id = re.search(r"to MLflow run (\w+) under (\S+)/", p.stdout)
    assert run_id, p.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert f"{run_id[2]}/episode.gif" in {a.path for a in client.list_artifacts(run_id[1], run_id[2])}


def test_pg_cartpole_reaches_150_within_200k_steps(tmp_path):
    cfg = compose(["+experiment=pg_cartpole", "seed=0", "tracking=none", "progress=false",
                   f"output_dir={tmp_path}"])
    r = run(cfg, launch_dir=tmp_path)
    assert r.target_met, r.stop_reason
    assert r.metrics["rollout/episode_return_mean"] >= 150
    assert r.metrics["timesteps_total"] <= 200_000


def _one_seed(tmp_path, *overrides):
    cfg = compose([*overrides, "seed=0", "tracking=none", "progress=false", f"output_dir={tmp_path}"])
    return run(cfg, launch_dir=tmp_path)


def test_a2c_cartpole_reaches_475_within_500k_steps(tmp_path):
    r = _one_seed(tmp_path, "+experiment=a2c_cartpole")
    assert r.target_met and r.metrics["rollout/episode_return_mean"] >= 475, r.stop_reason
    assert r.metrics["timesteps_total"] <= 500_000


def test_dqn_cartpole_reaches_475_within_100k_steps(tmp_path):
    r = _one_seed(tmp_path, "+experiment=dqn_cartpole")
    assert r.target_met and r.metrics["rollout/episode_return_mean"] >= 475, r.stop_reason
    assert r.metrics["timesteps_total"] <= 100_000


def test_rainbow_cartpole_reaches_475_within_100k_steps(tmp_path):
    """All six of Rainbow's parts together (prioritized replay, C51, noisy heads, dueling, double Q,
    3-step returns); seed 0 reached 475 at 58,880 env steps on the 2-core Xeon (2026-11-30, the replay ratio
    cut from 30k env steps), seed 1 at 69,888, seed 2 at 161,280 (the preset's budget is 200k;
    experiments/dqn_cartpole_tuning: the preset is seed-sensitive). Seed 0 within 100k here."""
    r = _one_seed(tmp_path, "+experiment=rainbow_cartpole")
    assert r.target_met and r.metrics["rollout/episode_return_mean"] >= 475, r.stop_reason
    assert r.metrics["timesteps_total"] <= 100_000


@pytest.mark.parametrize(("part", "target"), [
    # seeds 0/1/2 reached 200 at 23,296 / 21,760 / 30,976 env steps (2026-11-27)
    (["algo.prioritized_replay=true"], 200),
    # 21,760 / 21,504 / 21,248
    (["model.num_atoms=51", "model.v_min=0.0", "model.v_max=500.0"], 200),
    # noisy heads instead of epsilon-greedy explore more slowly here: seed 0 reached 100 at 20,992 (200 on
    # seed 1 at 29,184; seeds 0 and 2 stood at 130 and 127 at 60k)
    (["model.noisy=true"], 100),
], ids=["prioritized_replay", "c51", "noisy"])
def test_a_rainbow_part_alone_on_dqn_cartpole_learns_within_40k_steps(tmp_path, part, target):
    """One of Rainbow's parts added to dqn_cartpole (double Q, dueling, 3-step returns) learns on its own
    (a random policy's return is ~22)."""
    r = _one_seed(tmp_path, "+experiment=dqn_cartpole", *part,
                  f"++stop={{rollout/episode_return_mean: {target}, timesteps_total: 40000}}")
    assert r.target_met and r.metrics["rollout/episode_return_mean"] >= target, r.stop_reason


def test_ppo_pendulum_reaches_minus_250_within_500k_steps(tmp_path):
    r = _one_seed(tmp_path, "+experiment=ppo_pendulum")
    assert r.target_met and r.metrics["rollout/episode_return_mean"] >= -250, r.stop_reason
    assert r.metrics["timesteps_total"] <= 500_000


def test_appo_runs_synchronously_without_workers(tmp_path):
    r = _one_seed(tmp_path, "+experiment=appo_cartpole", "rollout.num_workers=0", "stop.training_iteration=5")
    assert r.metrics["training_iteration"] == 5 and r.metrics["train/mean_rho"] == pytest.approx(1.0, abs=1e-3)

