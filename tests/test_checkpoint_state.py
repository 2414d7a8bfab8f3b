"""save -> restore gives identical weights, optimizer state, counters and next actions, for every algorithm."""

import numpy as np
import pytest
import torch

from rlrun import make_trainer
from rlrun.algos.dqn import DQNState
from rlrun.algos.sac import ActorCriticState
from rlrun.core.registry import ALGOS
from rlrun.sources.plugins import load_builtins
from rlrun.training.checkpoint import load_checkpoint, save_checkpoint

load_builtins()
PRESETS = {"pg": "pg_cartpole", "ppo": "ppo_cartpole", "a2c": "a2c_cartpole", "dqn": "dqn_cartpole",
           "appo": "appo_cartpole", "bc": "bc_cartpole", "marwil": "marwil_cartpole", "sac": "sac_pendulum",
           "td3": "td3_pendulum"}
REPLAY = {"dqn": DQNState, "sac": ActorCriticState, "td3": ActorCriticState}


def _optimizer_tensors(state):
    """Every tensor of an optimizer's state: rlrun's Adam, or a SAC/TD3 policy's groups of them."""
    if "exp_avg_sq" in state:
        return state["exp_avg_sq"] + state["steps"]
    return [t for k in sorted(state) for t in _optimizer_tensors(state[k])]


def test_every_registered_algorithm_has_a_round_trip_case():
    assert set(ALGOS.names()) <= set(PRESETS)


@pytest.mark.parametrize("algo", sorted(PRESETS))
def test_save_restore_round_trip(algo, tmp_path):
    overrides = [f"+experiment={PRESETS[algo]}", "tracking=none", "rollout.num_workers=0",
                 "checkpoint.include_replay=true"]
    if algo in REPLAY:
        overrides += ["algo.learning_starts=64"]  # learn in the 2 iterations below
    if algo in ("bc", "marwil"):  # they train from files: 30 random episodes
        import gymnasium as gym
        from rlrun.offline import EpisodeWriter

        env = gym.make("CartPole-v1")
        with EpisodeWriter(tmp_path / "data", env.observation_space, env.action_space, "CartPole-v1") as w:
            for ep in range(30):
                obs, _ = env.reset(seed=ep)
                done = False
                while not done:
                    nxt, r, term, trunc, _ = env.step(env.action_space.sample())
                    w.add_step(obs, env.action_space.sample(), r, term, trunc, nxt)
                    obs, done = nxt, term or trunc
        overrides += [f"input={tmp_path / 'data'}", "offline.shuffle_buffer=64", "algo.train_batch_size=256"]
    a = make_trainer(overrides)
    for _ in range(2):
        a.train()
    path = save_checkpoint(tmp_path / "ck", a.get_state(), {"algo": algo}, {})
    b = make_trainer([*overrides, "seed=123"])  # other seed: everything must come from the checkpoint
    b.set_state(load_checkpoint(path).state)
    for (ka, va), (kb, vb) in zip(a.policy.model.state_dict().items(), b.policy.model.state_dict().items(),
                                  strict=True):
        assert ka == kb and torch.equal(va, vb)
    ta, tb = _optimizer_tensors(a.policy.optimizer.state_dict()), _optimizer_tensors(b.policy.optimizer.state_dict())
    assert ta and len(ta) == len(tb)
    for x, y in zip(ta, tb, strict=True):
        assert torch.equal(x, y)
    assert (a.iteration, a.timesteps_total, a.episodes_total) == (b.iteration, b.timesteps_total, b.episodes_total)
    obs = np.random.default_rng(0).normal(size=(64, *a.policy.observation_space.shape)).astype(np.float32)
    act_a, act_b = a.policy.compute_actions(obs), b.policy.compute_actions(obs)
    np.testing.assert_array_equal(act_a.actions, act_b.actions)  # same weights and same RNG state
    assert a.policy.state.get_state().keys() == b.policy.state.get_state().keys()
    if algo in REPLAY:
        sa, sb = a.policy.state_as(REPLAY[algo]), b.policy.state_as(REPLAY[algo])
        assert len(sb.replay) == len(sa.replay) > 0
        np.testing.assert_array_equal(sa.replay.sample(32)["obs"], sb.replay.sample(32)["obs"])
        for x, y in zip(sa.target_model.state_dict().values(), sb.target_model.state_dict().values(), strict=True):
            assert torch.equal(x, y)
    if algo == "sac":  # the learned temperature and the update count (TD3's actor delay) come back too
        sa, sb = a.policy.state_as(ActorCriticState), b.policy.state_as(ActorCriticState)
        assert sa.num_updates == sb.num_updates > 0 and torch.equal(sa.log_alpha, sb.log_alpha)
        assert float(sa.log_alpha) != 0.0  # it learned
    a.stop()
    b.stop()


def test_a_restored_run_starts_its_envs_afresh_from_its_seed_and_step_count():
    # before, the envs of a resumed run were built and seeded as at the run's start, so the episodes after a resume
    # started from the initial states the run's first episodes started from
    overrides = ["+experiment=ppo_cartpole", "tracking=none", "rollout.num_workers=0", "rollout.num_envs_per_worker=4"]
    a = make_trainer(overrides)
    start = a.workers.local_worker.slots[0].obs.copy()
    a.train()
    state = a.get_state()
    b, c = make_trainer(overrides), make_trainer(overrides)
    np.testing.assert_array_equal(b.workers.local_worker.slots[0].obs, start)  # built: the run's first states
    b.set_state(state)
    c.set_state(state)
    resumed = b.workers.local_worker.slots[0].obs
    assert not np.isclose(resumed, start).all(axis=1).any(), (resumed, start)  # no copy starts where one started
    np.testing.assert_array_equal(resumed, c.workers.local_worker.slots[0].obs)  # the seed and step count's
    before = b.timesteps_total
    b.train()  # and it trains on from there
    assert b.timesteps_total > before
    for t in (a, b, c):
        t.stop()
