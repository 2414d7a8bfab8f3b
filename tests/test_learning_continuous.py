"""One-seed learning tests of the continuous-control presets (SAC, TD3): the greedy evaluation each
preset runs every 1,024 env steps must reach its target within the env-step budget. A module of its
own, so that pytest-xdist runs it beside test_learning.py rather than after it."""

import pytest

from rlrun.app.cli import compose
from rlrun.app.runner import run

pytestmark = pytest.mark.slow


def _one_seed(tmp_path, *overrides):
    # one torch thread: the suite runs two test processes on this 2-core machine
    cfg = compose([*overrides, "seed=0", "tracking=none", "progress=false", "torch_threads=1",
                   f"output_dir={tmp_path}"])
    return run(cfg, launch_dir=tmp_path)


@pytest.mark.parametrize("preset", ["sac_pendulum", "td3_pendulum"])
def test_sac_and_td3_pendulum_reach_minus_200_greedy_within_20k_steps(preset, tmp_path):
    r = _one_seed(tmp_path, f"+experiment={preset}")
    assert r.target_met and r.metrics["eval/episode_return_mean"] >= -200, r.stop_reason
    assert r.metrics["timesteps_total"] <= 20_000


def test_sac_inverted_pendulum_reaches_900_greedy_within_50k_steps(tmp_path):
    r = _one_seed(tmp_path, "+experiment=sac_inverted_pendulum")
    assert r.target_met and r.metrics["eval/episode_return_mean"] >= 900, r.stop_reason
    assert r.metrics["timesteps_total"] <= 50_000
