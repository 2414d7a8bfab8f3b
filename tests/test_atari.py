"""Atari through rlrun's atari extra: the env and its preprocessing from YAML, the Nature-CNN Q
network, reward clipping for the learner only, and the dqn_breakout / ppo_breakout presets running,
recording to MLflow, checkpointing and resuming (short runs; the 20k-step runs are in the closing note)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlrun.app.cli import compose
from rlrun.envs.make import env_from_config

from .conftest import run_cli, run_summary, without_module


def test_the_breakout_env_gives_four_stacked_84x84_grey_frames():
    cfg = compose(["+experiment=dqn_breakout", "tracking=none"])
    env = env_from_config(cfg.env, 2)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        obs, *_ = env.step(np.array([1, 1]))  # FIRE
        assert obs.shape == (2, 4, 84, 84) and obs.max() > 0
    finally:
        env.close()


def test_the_nature_cnn_q_network_takes_stacked_frames_with_rainbows_heads():
    import gymnasium as gym

    from rlrun.models.q_networks import QCNNConfig, QCNNModel

    obs = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    m = QCNNModel(obs, gym.spaces.Discrete(4), 4, QCNNConfig(dueling=True, num_atoms=11, noisy=True))
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    assert m(x).dist_inputs.shape == (3, 4) and m.q_log_probs(x).shape == (3, 4, 11)
    convs = [c for c in m.torso.modules() if isinstance(c, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == [(32, 8, 4), (64, 4, 2), (64, 3, 1)]


def test_clip_rewards_gives_the_learner_signs_and_leaves_the_reported_returns_alone():
    from rlrun.algos.algorithm import make_policy
    from rlrun.config.schemas import AlgoConfig
    from rlrun.data.batch import SampleBatch as SB
    from rlrun.sources.plugins import load_builtins

    load_builtins()
    import gymnasium as gym

    cfg = compose(["+experiment=ppo_breakout", "tracking=none"])
    assert cfg.algo.clip_rewards is True and not AlgoConfig().clip_rewards
    p = make_policy("pg", gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2),
                    algo_config=AlgoConfig(name="pg", clip_rewards=True))
    zeros = np.zeros((3, 1), bool)
    fragment = SB({SB.REWARDS: np.array([[4.0], [0.0], [-7.0]], np.float32), SB.TERMINATEDS: zeros,
                   SB.TRUNCATEDS: zeros})
    out = p.postprocess_trajectory(fragment, np.zeros(1))
    assert out[SB.REWARDS].tolist() == [[1.0], [0.0], [-1.0]]
    assert out[SB.ADVANTAGES][:, 0] == pytest.approx([1 - 0.99**2, -0.99, -1.0], abs=1e-6)  # from the signs
    # a number c (RLlib's clip_rewards: 1.0 in its atari-sac file): each reward clipped to [-c, c]
    p = make_policy("pg", gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2),
                    algo_config=AlgoConfig(name="pg", clip_rewards=2.5))
    fragment = SB({SB.REWARDS: np.array([[4.0], [0.5], [-7.0]], np.float32), SB.TERMINATEDS: zeros,
                   SB.TRUNCATEDS: zeros})
    assert p.postprocess_trajectory(fragment, np.zeros(1))[SB.REWARDS].tolist() == [[2.5], [0.5], [-2.5]]


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "extra"), [
    ("dqn_breakout", ["algo.learning_starts=256"]),
    ("ppo_breakout", ["algo.train_batch_size=256", "algo.sgd_minibatch_size=128", "rollout.num_envs_per_worker=2"]),
])
def test_the_atari_presets_run_record_checkpoint_and_resume_into_the_same_mlflow_run(tmp_path, preset, extra):
    from mlflow.tracking import MlflowClient

    run = [f"+experiment={preset}", *extra, "progress=true", "tracking.wait=true"]  # the record complete at exit
    first = run_cli([*run, "stop.timesteps_total=512"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    s = run_summary(first.stdout)
    assert int(s["steps"]) >= 512 and s["checkpoint"]
    again = run_cli([*run, "stop.timesteps_total=1024", "resume=latest"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    t = run_summary(again.stdout)
    assert t["run_id"] == s["run_id"] and int(t["steps"]) >= 1024
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    steps = [m.value for m in client.get_metric_history(s["run_id"], "timesteps_total")]
    assert steps and steps == sorted(set(steps)) and steps[-1] >= 1024, (  # one curve, no step twice
        steps, _store_contents(client), first.stdout[-1500:], first.stderr[-1500:], again.stdout[-1500:],
        again.stderr[-1500:])
    returns = client.get_metric_history(s["run_id"], "rollout/episode_return_mean")
    assert returns and all(np.isfinite(m.value) for m in returns)


def _store_contents(client):
    """Every run of the store with its status and metric keys (what a failure message shows)."""
    return [(r.info.run_id, r.info.status, r.info.experiment_id, sorted(r.data.metrics))
            for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_an_atari_env_without_the_atari_extra_names_it(tmp_path):
    p = run_cli(["+experiment=ppo_breakout", "tracking=none"], tmp_path, env=without_module(tmp_path, "ale_py"))
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "env.id: 'ALE/Breakout-v5' needs the ale_py package" in lines[0], lines
    assert 'pip install -e ".[atari]"' in lines[0]
