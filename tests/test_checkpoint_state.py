"""save -> restore gives identical weights, optimizer state, counters and next actions, for every algorithm."""

import numpy as np
import pytest
import torch

from rlrun import make_trainer
from rlrun.checkpoint import load_checkpoint, save_checkpoint
from rlrun.registry import ALGOS, load_builtins

load_builtins()
PRESETS = {"pg": "pg_cartpole", "ppo": "ppo_cartpole", "a2c": "a2c_cartpole", "dqn": "dqn_cartpole",
           "appo": "appo_cartpole"}


def test_every_registered_algorithm_has_a_round_trip_case():
    assert set(ALGOS.names()) <= set(PRESETS)


@pytest.mark.parametrize("algo", sorted(PRESETS))
def test_save_restore_round_trip(algo, tmp_path):
    overrides = [f"+experiment={PRESETS[algo]}", "tracking=none", "rollout.num_workers=0",
                 "checkpoint.include_replay=true"]
    if algo == "dqn":
        overrides += ["algo.learning_starts=256"]  # learn in the 2 iterations below
    a = make_trainer(overrides)
    for _ in range(2):
        a.train()
    path = save_checkpoint(tmp_path / "ck", a.get_state(), {"algo": algo}, {})
    b = make_trainer([*overrides, "seed=123"])  # other seed: everything must come from the checkpoint
    b.set_state(load_checkpoint(path).state)
    for (ka, va), (kb, vb) in zip(a.policy.model.state_dict().items(), b.policy.model.state_dict().items(),
                                  strict=True):
        assert ka == kb and torch.equal(va, vb)
    for x, y in zip(a.policy.optimizer.exp_avg_sq + a.policy.optimizer.steps,
                    b.policy.optimizer.exp_avg_sq + b.policy.optimizer.steps, strict=True):
        assert torch.equal(x, y)
    assert (a.iteration, a.timesteps_total, a.episodes_total) == (b.iteration, b.timesteps_total, b.episodes_total)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    act_a, act_b = a.policy.compute_actions(obs), b.policy.compute_actions(obs)
    np.testing.assert_array_equal(act_a.actions, act_b.actions)  # same weights and same RNG state
    if algo == "dqn":
        assert len(b.replay) == len(a.replay)
        np.testing.assert_array_equal(a.replay.sample(32)["obs"], b.replay.sample(32)["obs"])
    a.stop()
    b.stop()
