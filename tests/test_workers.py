import numpy as np
import pytest

from rlrun.algos.algorithm import make_policy
from rlrun.algos.ppo import PPOClipLossConfig, PPOConfig
from rlrun.config.schemas import EnvConfig, ModelConfig, RolloutConfig
from rlrun.core.registry import ENVS, MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.sources.plugins import load_builtins
from rlrun.sources.rollout_worker import RolloutWorker, WorkerSpec
from tests.scripted_env import ScriptedVectorEnv, ValueIsTenT

load_builtins()
ENVS.add("scripted", lambda num_envs, **kw: ScriptedVectorEnv(num_envs, **kw), override=True)
MODELS.add("value_is_ten_t", ValueIsTenT, override=True)
GAMMA = 0.5


def make_worker(lengths, truncate, fragment=4, batch_mode="truncate_episodes", n=2):
    env = EnvConfig(id="scripted", kwargs={"lengths": lengths, "truncate": truncate})
    rollout = RolloutConfig(num_envs_per_worker=n, rollout_fragment_length=fragment, batch_mode=batch_mode)
    algo = PPOConfig(gamma=GAMMA, gae_lambda=0.0)  # lambda 0: advantage = one-step TD error

    def factory(obs_space, act_space):
        return {DEFAULT_POLICY_ID: make_policy("ppo", obs_space, act_space, algo_config=algo,
                                               loss_config=PPOClipLossConfig(),
                                               model_config=ModelConfig(name="value_is_ten_t"))}

    return RolloutWorker(WorkerSpec(env=env, rollout=rollout, seed=0), factory)


def episodes_of(batch):
    return [(int(e[SB.OBS][0, 0]), e[SB.OBS][:, 1].astype(int).tolist()) for e in batch.split_by_episode()]


@pytest.mark.parametrize("truncate", [False, True])
def test_dummy_reset_step_never_enters_batch(truncate):
    w = make_worker([3, 5], [truncate, truncate], fragment=4)
    b1, b2 = w.sample(), w.sample()
    for b in (b1, b2):
        # every row is a real step: t runs 0..len-1 within each episode, rewards are 1 + t (never 0)
        assert (b[SB.REWARDS] == 1 + b[SB.OBS][:, 1]).all()
        for _env_i, ts in episodes_of(b):
            assert ts == list(range(ts[0], ts[0] + len(ts)))
    assert w.env.vector_env.dummy_steps > 0  # the env did take autoreset steps; they were dropped
    # rows: at least fragment x num_envs, fewer than num_envs extra
    assert 8 <= len(b1) < 10 and 8 <= len(b2) < 10


def test_truncated_episode_bootstraps_from_final_obs_value():
    w = make_worker([3, 100], [True, False], fragment=5)
    b = w.sample()
    env0 = b[b[SB.OBS][:, 0] == 0]
    end = np.flatnonzero(env0[SB.TRUNCATEDS])[0]
    assert env0[SB.OBS][end, 1] == 2  # last real step of a 3-step episode
    # lambda = 0: A = r + gamma * V(final obs) - V(s); final obs has t = 3 -> V = 30
    expected = 3.0 + GAMMA * 30.0 - 20.0
    assert env0[SB.ADVANTAGES][end] == pytest.approx(expected)
    assert env0[SB.VALUE_TARGETS][end] == pytest.approx(3.0 + GAMMA * 30.0)


def test_terminated_episode_does_not_bootstrap():
    w = make_worker([3, 100], [False, False], fragment=5)
    b = w.sample()
    env0 = b[b[SB.OBS][:, 0] == 0]
    end = np.flatnonzero(env0[SB.TERMINATEDS])[0]
    assert env0[SB.ADVANTAGES][end] == pytest.approx(3.0 - 20.0)  # r - V(s), no next value


def test_fragment_cut_bootstraps_from_current_obs():
    w = make_worker([100, 100], [False, False], fragment=4)
    b = w.sample()
    env1 = b[b[SB.OBS][:, 0] == 1]
    last = len(env1) - 1
    t = env1[SB.OBS][last, 1]
    assert env1[SB.ADVANTAGES][last] == pytest.approx((1 + t) + GAMMA * 10 * (t + 1) - 10 * t)


@pytest.mark.parametrize("truncate", [False, True])
def test_complete_episodes_mode_holds_only_whole_episodes(truncate):
    w = make_worker([3, 5], [truncate, truncate], fragment=4, batch_mode="complete_episodes")
    for _ in range(3):
        b = w.sample()
        assert len(b) >= 8
        for env_i, ts in episodes_of(b):
            assert ts == list(range({0: 3, 1: 5}[env_i]))  # whole episodes from t = 0
        ends = b[SB.TERMINATEDS] | b[SB.TRUNCATEDS]
        assert ends.sum() == len(b.split_by_episode())
        if truncate:  # truncated ends bootstrap from V(final obs) = 10 * length
            last = np.flatnonzero(ends)
            lengths = np.where(b[SB.OBS][last, 0] == 0, 3, 5)
            np.testing.assert_allclose(b[SB.VALUE_TARGETS][last], lengths + GAMMA * 10.0 * lengths)


def test_an_episode_that_never_ends_stops_complete_episodes_with_one_line(monkeypatch):
    """complete_episodes takes rows of ended episodes only: episodes that never end get one line naming the fix
    before the fragment's buffers outgrow the machine (here a machine of 4 MiB), not a hang until it runs out."""
    from rlrun.config.typed import ConfigError
    from rlrun.sources import rollout_worker

    monkeypatch.setattr(rollout_worker, "machine_memory", lambda: 4 << 20)
    w = make_worker([3, 5], [False, True], fragment=4, batch_mode="complete_episodes")
    assert len(w.sample()) >= 8  # episodes that end fit the same machine
    w = make_worker([10**9, 10**9], [False, False], fragment=4, batch_mode="complete_episodes")
    with pytest.raises(ConfigError, match=r"^rollout.batch_mode: complete_episodes: scripted's episodes ran [\d,]+ "
                                          r"steps without all ending, and the fragment that waits for them would need "
                                          r"[\d,]+ MiB \(this machine has 4 MiB\); give its episodes a limit \(env."
                                          r"wrappers: \[\{time_limit: \{max_episode_steps: N\}\}\]\) or use "
                                          r"rollout.batch_mode=truncate_episodes$"):
        w.sample()


def test_episode_metrics_and_seeded_reproducibility():
    w = make_worker([3, 5], [False, True], fragment=8)
    w.sample()
    stats = w.get_metrics()
    assert stats.lengths and set(stats.lengths) <= {3, 5}
    assert stats.returns[stats.lengths.index(3)] == 1 + 2 + 3
    assert w.get_metrics().returns == []
    a, b = make_worker([3, 5], [False, True]).sample(), make_worker([3, 5], [False, True]).sample()
    np.testing.assert_array_equal(a[SB.ACTIONS], b[SB.ACTIONS])


def test_next_obs_and_nstep_columns_for_replay_algorithms():
    from rlrun.algos.dqn import DQNConfig, DQNLossConfig

    env = EnvConfig(id="scripted", kwargs={"lengths": [3, 4], "truncate": [False, True]})
    rollout = RolloutConfig(num_envs_per_worker=2, rollout_fragment_length=6)
    algo = DQNConfig(gamma=0.5, n_step=2)

    def factory(obs_space, act_space):
        return {DEFAULT_POLICY_ID: make_policy("dqn", obs_space, act_space, algo_config=algo,
                                               loss_config=DQNLossConfig(),
                                               model_config=ModelConfig(name="value_is_ten_t"))}

    b = RolloutWorker(WorkerSpec(env=env, rollout=rollout, seed=0), factory).sample()
    t, nt = b[SB.OBS][:, 1], b[SB.NSTEP_NEXT_OBS][:, 1]
    assert not (b[SB.NEXT_OBS][:, 1] - t - 1).any()  # NEXT_OBS stays the next step's observation
    ended = b[SB.TERMINATEDS] | b[SB.TRUNCATEDS]
    env_id = b[SB.OBS][:, 0]
    length = np.where(env_id == 0, 3, 4)
    # a window of m <= 2 steps bootstraps from the obs m steps later (discount gamma^m); windows stop
    # at episode ends and at the fragment cut
    disc = b[SB.NSTEP_DISCOUNT]
    boot = disc > 0
    m = np.round(np.log(disc[boot]) / np.log(0.5)).astype(int)
    assert set(m.tolist()) <= {1, 2} and 2 in m
    np.testing.assert_array_equal(nt[boot], t[boot] + m)
    np.testing.assert_array_equal(nt[ended], length[ended])  # the final observation
    assert (env_id[~boot] == 0).all() and (nt[~boot] == 3).all()  # only windows into a termination
    # terminated windows never bootstrap; a truncated end bootstraps with gamma^1
    last = ended & (env_id == 0)
    assert (b[SB.NSTEP_DISCOUNT][last] == 0).all()
    trunc_end = ended & (env_id == 1)
    np.testing.assert_allclose(b[SB.NSTEP_DISCOUNT][trunc_end], 0.5)
    np.testing.assert_allclose(b[SB.NSTEP_REWARDS][trunc_end], 4.0)  # reward at t=3 is 1 + 3
