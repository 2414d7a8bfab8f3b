"""Losses pinned on hand-made tensors; n-step targets on hand-computed arrays; replay wrap-around."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlrun.algos.a2c import A2CLossConfig, a2c_loss
from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.algos.dqn import (
    TARGET_CHUNK,
    TARGET_Q_NEXT,
    DQNConfig,
    DQNLossConfig,
    DQNState,
    dqn_td_loss,
    replay_minibatches,
)
from rlrun.algos.pg import PGLossConfig, pg_loss
from rlrun.algos.ppo import PPOClipLossConfig, PPOConfig, ppo_clip_loss
from rlrun.algos.sac import SACConfig
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import add_nstep, compute_nstep
from rlrun.data.replay import ReplayBuffer
from rlrun.models.base import ModelOutput
from rlrun.models.distributions import Categorical
from rlrun.sources.plugins import load_builtins

load_builtins()
OBS, TWO = gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2)


def policy_for(algo, loss_config, algo_config=None):
    """A real Policy of ``algo`` whose loss config is ``loss_config`` (the model is passed separately)."""
    return make_policy(algo, OBS, TWO, algo_config=algo_config, loss_config=loss_config)


class Fixed(nn.Module):
    """A 'model' whose outputs are parameters, so gradients w.r.t. them can be read directly."""

    def __init__(self, logits, values):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits, dtype=torch.float32))
        self.values = nn.Parameter(torch.tensor(values, dtype=torch.float32))

    def forward(self, obs):
        # the same outputs for each block of rows, as a real model gives for a batch of copies
        reps = max(1, len(obs) // len(self.logits))
        return ModelOutput(self.logits.repeat(reps, 1), self.values.repeat(reps))


def two_actions(p_first):
    """Logits of a 2-action categorical with P(action 0) = p_first."""
    return [math.log(p_first), math.log(1 - p_first)]


def test_ppo_clip_values_and_clipping_edges():
    # row 0: ratio 1.5 > 1 + eps with A > 0 -> clipped, no policy gradient
    # row 1: ratio 0.5 < 1 - eps with A < 0 -> clipped, no policy gradient
    # row 2: ratio 1.0 inside the range -> gradient pushes logp(a) up for A > 0
    old_p, new_p = [0.4, 0.6, 0.5], [0.6, 0.3, 0.5]
    model = Fixed([two_actions(p) for p in new_p], [0.0, 0.0, 0.0])
    batch = {
        SB.OBS: torch.zeros(3, 1), SB.ACTIONS: torch.tensor([0, 0, 0]),
        SB.ACTION_LOGP: torch.log(torch.tensor(old_p)), SB.ADVANTAGES: torch.tensor([1.0, -1.0, 2.0]),
        SB.VALUE_TARGETS: torch.tensor([1.0, 2.0, 3.0]), SB.VF_PREDS: torch.zeros(3),
        SB.ACTION_DIST_INPUTS: torch.tensor([two_actions(p) for p in old_p]),
    }
    cfg = PPOClipLossConfig(clip_param=0.2, vf_coeff=0.5, entropy_coeff=0.0, normalize_advantages=False)
    out = ppo_clip_loss(policy_for("ppo", cfg), model, Categorical, batch)
    # surrogate per row: min(r A, clip(r) A) = [1.2 * 1, 0.8 * -1, 1.0 * 2]
    assert out.terms["policy"].item() == pytest.approx(-(1.2 - 0.8 + 2.0) / 3, rel=1e-5)
    assert out.terms["vf"].item() == pytest.approx(0.5 * (1 + 4 + 9) / 3, rel=1e-5)
    assert out.stats["clip_frac"].item() == pytest.approx(2 / 3)
    out.terms["policy"].backward()
    g = model.logits.grad
    assert torch.allclose(g[0], torch.zeros(2)) and torch.allclose(g[1], torch.zeros(2))
    assert g[2, 0] < 0 < g[2, 1]  # descending the loss raises the logit of the advantaged action


def test_ppo_value_clipping_takes_the_pessimistic_error():
    model = Fixed([two_actions(0.5)], [3.0])
    batch = {SB.OBS: torch.zeros(1, 1), SB.ACTIONS: torch.tensor([0]), SB.ACTION_LOGP: torch.log(torch.tensor([0.5])),
             SB.ADVANTAGES: torch.tensor([0.0]), SB.VALUE_TARGETS: torch.tensor([2.5]),
             SB.VF_PREDS: torch.tensor([0.0]), SB.ACTION_DIST_INPUTS: torch.tensor([two_actions(0.5)])}
    cfg = PPOClipLossConfig(vf_clip_param=1.0, normalize_advantages=False)
    out = ppo_clip_loss(policy_for("ppo", cfg), model, Categorical, batch)
    # unclipped error (3 - 2.5)^2 = 0.25; clipped prediction 1.0 -> (1 - 2.5)^2 = 2.25; max -> 2.25
    assert out.terms["vf"].item() == pytest.approx(0.5 * 2.25)


def test_pg_and_a2c_gradient_signs_and_values():
    model = Fixed([two_actions(0.5), two_actions(0.5)], [1.0, 1.0])
    batch = {SB.OBS: torch.zeros(2, 1), SB.ACTIONS: torch.tensor([0, 1]), SB.ADVANTAGES: torch.tensor([1.0, -1.0]),
             SB.VALUE_TARGETS: torch.tensor([3.0, 1.0])}
    out = pg_loss(policy_for("pg", PGLossConfig(normalize_advantages=False)), model, Categorical, batch)
    assert out.terms["policy"].item() == pytest.approx(-(math.log(0.5) * 1 + math.log(0.5) * -1) / 2)
    out.total.backward()
    assert model.logits.grad[0, 0] < 0 and model.logits.grad[1, 1] > 0
    model.logits.grad = None
    cfg = A2CLossConfig(vf_coeff=0.5, entropy_coeff=0.0)
    out = a2c_loss(policy_for("a2c", cfg), model, Categorical, batch)
    assert out.terms["vf"].item() == pytest.approx(0.5 * (4 + 0) / 2)
    out.total.backward()
    assert model.values.grad[0] < 0  # V below its target is pushed up


def test_dqn_td_target_double_q_and_huber():
    q_online = Fixed([[1.0, 2.0]], [0.0])
    target = Fixed([[10.0, 4.0]], [0.0])
    batch = {SB.OBS: torch.zeros(1, 1), SB.ACTIONS: torch.tensor([0]), SB.NSTEP_NEXT_OBS: torch.zeros(1, 1),
             SB.NSTEP_REWARDS: torch.tensor([1.0]), SB.NSTEP_DISCOUNT: torch.tensor([0.5])}
    policy = policy_for("dqn", DQNLossConfig(huber_delta=0.0), DQNConfig(double_q=True, epsilon=[[0, 0.1]]))
    policy.state_as(DQNState).target_model = target
    out = dqn_td_loss(policy, q_online, Categorical, batch)
    # double Q: argmax online(s') = action 1 -> target Q 4.0; target = 1 + 0.5 * 4 = 3; Q(s, 0) = 1
    assert out.stats["target_mean"].item() == pytest.approx(3.0)
    assert out.terms["td"].item() == pytest.approx(0.5 * 4.0)
    policy.config = DQNConfig(double_q=False, epsilon=[[0, 0.1]])
    out = dqn_td_loss(policy, q_online, Categorical, batch)
    assert out.stats["target_mean"].item() == pytest.approx(1 + 0.5 * 10.0)  # max over the target net
    policy.loss_config = DQNLossConfig(huber_delta=1.0)
    out = dqn_td_loss(policy, q_online, Categorical, batch)
    assert out.terms["td"].item() == pytest.approx(abs(6.0 - 1.0) - 0.5)  # Huber: linear beyond delta
    batch[SB.NSTEP_DISCOUNT] = torch.tensor([0.0])  # terminated: no bootstrap
    assert dqn_td_loss(policy, q_online, Categorical, batch).stats["target_mean"].item() == pytest.approx(1.0)


def test_dqn_minibatches_carry_the_target_nets_q_values_of_their_own_rows_across_chunks():
    """dqn_learn's minibatches come with the target net's Q(s') computed in pieces of TARGET_CHUNK
    rows: each minibatch's values are the ones the target net gives its own next observations."""
    policy = make_policy("dqn", gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2))
    state = policy.state_as(DQNState)
    rng = np.random.default_rng(0)
    n = 3 * TARGET_CHUNK
    state.replay.add(SB({SB.OBS: rng.standard_normal((n, 4)).astype(np.float32), SB.ACTIONS: rng.integers(0, 2, n),
                         SB.NSTEP_NEXT_OBS: rng.standard_normal((n, 4)).astype(np.float32),
                         SB.NSTEP_REWARDS: np.ones(n, np.float32), SB.NSTEP_DISCOUNT: np.ones(n, np.float32)}))
    minibatches = list(replay_minibatches(state, 96, 24))  # 2,304 rows: three pieces, the last one partial
    assert len(minibatches) == 24
    for mb in minibatches:
        with torch.no_grad():
            expected = state.target_model(mb[SB.NSTEP_NEXT_OBS]).dist_inputs
        assert mb[TARGET_Q_NEXT].shape == (96, 2)
        torch.testing.assert_close(mb[TARGET_Q_NEXT], expected)


def test_nstep_matches_hand_computed():
    r = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
    term = np.array([False, False, True, False, False])
    ends = np.array([False, False, True, False, True])  # episode ends at t=2; fragment cut at t=4
    res = compute_nstep(r, term, ends, n=3, gamma=0.5)
    np.testing.assert_allclose(res.rewards, [1 + 1 + 0.75, 2 + 1.5, 3, 4 + 2.5, 5])
    np.testing.assert_array_equal(res.offsets, [3, 2, 1, 2, 1])
    np.testing.assert_allclose(res.discounts, [0, 0, 0, 0.25, 0.5])  # windows into the termination: 0



@pytest.mark.parametrize("T", [1, 5])
def test_one_step_columns_are_the_windows_columns(T):
    """add_nstep's n=1 shortcut gives the columns the general window gives (rewards, discounts, next obs)."""
    rng = np.random.default_rng(T)
    frag = {SB.REWARDS: rng.normal(size=(T, 3)).astype(np.float32), SB.TERMINATEDS: rng.random((T, 3)) < 0.3,
            SB.TRUNCATEDS: rng.random((T, 3)) < 0.2, SB.NEXT_OBS: rng.normal(size=(T, 3, 2)).astype(np.float32)}
    got = add_nstep(SB(dict(frag)), 1, 0.9)
    ends = frag[SB.TERMINATEDS] | frag[SB.TRUNCATEDS]
    ends[-1] = True
    res = compute_nstep(frag[SB.REWARDS], frag[SB.TERMINATEDS], ends, 1, 0.9)
    np.testing.assert_array_equal(got[SB.NSTEP_REWARDS], res.rewards)
    np.testing.assert_array_equal(got[SB.NSTEP_DISCOUNT], res.discounts)
    assert got[SB.NSTEP_DISCOUNT].dtype == res.discounts.dtype == np.float32
    np.testing.assert_array_equal(got[SB.NSTEP_NEXT_OBS], frag[SB.NEXT_OBS])
    assert not np.shares_memory(got[SB.NSTEP_NEXT_OBS], got[SB.NEXT_OBS])

def test_replay_buffer_wraps_around_and_samples_what_it_holds():
    buf = ReplayBuffer(capacity=5, seed=0)
    buf.add(SB({"x": np.arange(3)}))
    assert len(buf) == 3
    buf.add(SB({"x": np.arange(3, 7)}))  # 7 rows into 5 slots: 0 and 1 are overwritten
    assert len(buf) == 5 and buf.num_added == 7
    assert sorted(buf.get_state()["cols"]["x"].tolist()) == [2, 3, 4, 5, 6]
    assert set(buf.sample(200)["x"].tolist()) == {2, 3, 4, 5, 6}
    buf.add(SB({"x": np.arange(100, 112)}))  # more rows than the capacity: the newest 5 stay
    assert sorted(buf.get_state()["cols"]["x"].tolist()) == [107, 108, 109, 110, 111]
    with pytest.raises(ValueError, match="columns"):
        buf.add(SB({"y": np.arange(2)}))


def test_ppo_kl_penalty_reads_the_policys_learner_state():
    """The KL term uses the coefficient the policy holds (adapted by the learn hook), not the config's."""
    model = Fixed([two_actions(0.7)], [0.0])
    batch = {SB.OBS: torch.zeros(1, 1), SB.ACTIONS: torch.tensor([0]), SB.ACTION_LOGP: torch.log(torch.tensor([0.5])),
             SB.ADVANTAGES: torch.tensor([0.0]), SB.VALUE_TARGETS: torch.tensor([0.0]),
             SB.VF_PREDS: torch.tensor([0.0]), SB.ACTION_DIST_INPUTS: torch.tensor([two_actions(0.5)])}
    policy = policy_for("ppo", PPOClipLossConfig(kl_coeff=0.2, normalize_advantages=False), PPOConfig())
    out = ppo_clip_loss(policy, model, Categorical, batch)
    assert out.stats["kl_coeff"] == pytest.approx(0.2) and out.terms["kl"].item() > 0
    policy.state.kl_coeff = 0.8
    out2 = ppo_clip_loss(policy, model, Categorical, batch)
    assert out2.stats["kl_coeff"] == pytest.approx(0.8)
    assert (out2.total - out.total).item() == pytest.approx(0.6 * out.terms["kl"].item(), rel=1e-5)
    assert policy.get_state()["learner"] == {"kl_coeff": 0.8}


def test_a_loss_asking_for_another_algos_config_fails_clearly():
    policy = policy_for("pg", PGLossConfig())
    with pytest.raises(TypeError, match="algo is a PGConfig, this code needs a DQNConfig"):
        policy.config_as(DQNConfig)


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_training_intensity_schedule_sets_the_updates_of_each_batch(algo):
    """64 new env steps, 32-row minibatches: ``training_intensity`` 16 replays 32 of them at any env
    step; ``training_intensity_schedule`` [[0, 16], [1000, 16], [2000, 4]] replays 32 up to env step
    1,000, 20 at 1,500 (10, halfway), 8 from 2,000 on, read at the run's env steps, not the policy's."""
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    if algo == "dqn":
        act_space: gym.Space = TWO
        cfg: object = DQNConfig(learning_starts=0, sgd_minibatch_size=32, training_intensity=16.0)
    else:
        act_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        cfg = SACConfig(learning_starts=0, sgd_minibatch_size=32, training_intensity=16.0)
    rng = np.random.default_rng(0)
    acts = rng.integers(0, 2, 64) if algo == "dqn" else rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    batch = SB({SB.OBS: rng.standard_normal((64, 3)).astype(np.float32), SB.ACTIONS: acts,
                SB.NSTEP_NEXT_OBS: rng.standard_normal((64, 3)).astype(np.float32),
                SB.NSTEP_REWARDS: rng.standard_normal(64).astype(np.float32),
                SB.NSTEP_DISCOUNT: np.full(64, 0.99, np.float32)})
    learn = get_algorithm(algo).learn

    def updates(t: int, schedule) -> float:
        cfg.training_intensity_schedule = schedule  # type: ignore[attr-defined]
        return learn(make_policy(algo, obs_space, act_space, algo_config=cfg), batch, LearnContext(t, 0))[
            "train/num_sgd_steps"]

    assert [updates(t, None) for t in (64, 1500, 5000)] == [32, 32, 32]
    schedule = [[0, 16.0], [1000, 16.0], [2000, 4.0]]
    assert [updates(t, schedule) for t in (64, 1000, 1500, 2000, 5000)] == [32, 32, 20, 8, 8]
