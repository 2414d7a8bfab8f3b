"""SAC on a Discrete action space (RLlib's SAC on CartPole): the model's shapes, the exact expectations over
actions in the critics' target, the actor's and the temperature's terms, acting, and the preset learning."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlrun.algos.algorithm import make_policy
from rlrun.algos.sac import ActorCriticState, sac_actor_loss, sac_critic_loss, target_entropy
from rlrun.app.cli import compose
from rlrun.app.runner import run
from rlrun.core.registry import MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.distributions import Categorical
from rlrun.models.twin_q import DiscreteTwinQModel
from rlrun.sources.plugins import load_builtins

from .conftest import assert_same_losses_and_stop, trained_and_restored

load_builtins()
OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gym.spaces.Discrete(3)


def _policy(seed=3, **algo):
    from rlrun.algos.sac import SACConfig

    cfg = MODELS.entry("twin_q_mlp").config_cls(hiddens=[16, 16], critic_hiddens=[16, 16])
    return make_policy("sac", OBS, ACT, model_config=cfg, algo_config=SACConfig(**algo), seed=seed)


def _batch(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return {SB.OBS: torch.as_tensor(rng.uniform(-1, 1, (n, 4)).astype(np.float32)),
            SB.ACTIONS: torch.as_tensor(rng.integers(0, 3, n)),
            SB.NSTEP_NEXT_OBS: torch.as_tensor(rng.uniform(-1, 1, (n, 4)).astype(np.float32)),
            SB.NSTEP_REWARDS: torch.as_tensor(rng.standard_normal(n).astype(np.float32)),
            SB.NSTEP_DISCOUNT: torch.full((n,), 0.9)}


def test_twin_q_mlp_on_a_discrete_space_is_a_categorical_actor_with_a_q_value_per_action_and_critic():
    p = _policy()
    m = p.model
    assert isinstance(m, DiscreteTwinQModel) and p.dist_class is Categorical
    obs = _batch()[SB.OBS]
    assert m(obs).dist_inputs.shape == (32, 3)
    q_all = m.q_all(obs)
    assert q_all.shape == (2, 32, 3) and not torch.allclose(q_all[0], q_all[1])  # two critics, drawn apart
    a = torch.tensor([0, 1, 2] * 10 + [2, 0])
    torch.testing.assert_close(m.q(obs, a), q_all[:, torch.arange(32), a])
    # each critic is the MLP its stacked weights describe
    h = obs
    for w, b in zip(m.critics.weights, m.critics.biases, strict=True):
        h = torch.relu(h @ w[1] + b[1, 0])
    torch.testing.assert_close(q_all[1], h @ m.critics.out_weight[1] + m.critics.out_bias[1, 0])
    assert target_entropy(p) == pytest.approx(0.98 * math.log(3))
    assert target_entropy(_policy(target_entropy=0.2)) == 0.2


def test_the_critic_target_is_the_exact_expectation_over_next_actions_of_min_q_minus_alpha_log_pi():
    p = _policy(initial_alpha=0.5)
    st = p.state_as(ActorCriticState)
    with torch.no_grad():  # let the target critics differ from the online ones
        for w in st.target_model.critics.parameters():
            w.add_(0.1 * torch.randn_like(w))
    b = _batch()
    out = sac_critic_loss(p, p.model, p.dist_class, b)
    with torch.no_grad():
        n = b[SB.NSTEP_NEXT_OBS]
        probs = F.softmax(p.model(n).dist_inputs, -1)
        qn = st.target_model.q_all(n)
        v = sum(probs[:, a] * (torch.minimum(qn[0, :, a], qn[1, :, a]) - 0.5 * probs[:, a].log()) for a in range(3))
        y = b[SB.NSTEP_REWARDS] + 0.9 * v
        q = p.model.q_all(b[SB.OBS])[:, torch.arange(32), b[SB.ACTIONS]]
        want = 0.5 * ((q[0] - y) ** 2).mean() + 0.5 * ((q[1] - y) ** 2).mean()
    torch.testing.assert_close(out.stats["target_mean"], y.mean())
    torch.testing.assert_close(out.total.detach(), want)
    out.total.backward()
    assert all(w.grad is not None for w in p.model.critics.parameters())
    assert all(w.grad is None for w in p.model.actor_parameters())  # the target is a constant


def test_the_actor_term_moves_pi_towards_the_better_action_and_the_temperature_towards_the_target_entropy():
    p = _policy(initial_alpha=0.1)
    b = _batch()
    out = sac_actor_loss(p, p.model, p.dist_class, b)
    logits = p.model(b[SB.OBS]).dist_inputs
    probs, logp = F.softmax(logits, -1), F.log_softmax(logits, -1)
    q = p.model.q_all(b[SB.OBS]).min(0).values
    torch.testing.assert_close(out.terms["actor"], (probs * (0.1 * logp - q)).sum(-1).mean())
    entropy = -(probs * logp).sum(-1).mean()
    torch.testing.assert_close(out.stats["entropy"], entropy.detach())
    out.total.backward()
    assert all(w.grad is None for w in p.model.critic_parameters())  # the critics' values held fixed
    log_alpha = p.state_as(ActorCriticState).log_alpha
    # d(alpha loss)/d(log alpha) = entropy - target: the temperature rises while pi is below the target entropy
    assert float(log_alpha.grad) == pytest.approx(float(entropy.detach()) - 0.98 * math.log(3), rel=1e-5)
    # a step down the actor's gradient raises each row's probability of its best action (alpha small)
    before = probs.detach().gather(1, q.argmax(1, keepdim=True))
    with torch.no_grad():
        for w in p.model.actor_parameters():
            w.sub_(0.5 * w.grad)
    after = F.softmax(p.model(b[SB.OBS]).dist_inputs, -1).gather(1, q.argmax(1, keepdim=True))
    assert (after > before).float().mean() > 0.9


def test_actions_are_indices_uniform_before_learning_starts_drawn_from_pi_then_greedy_is_the_argmax():
    p = _policy(learning_starts=100)
    obs = np.random.default_rng(0).uniform(-1, 1, (3000, 4)).astype(np.float32)
    p.global_timestep = 0
    random = p.compute_actions(obs).actions
    assert random.dtype == np.int64 and random.shape == (3000,)
    np.testing.assert_allclose(np.bincount(random, minlength=3) / 3000, 1 / 3, atol=0.04)
    p.global_timestep = 10**6
    with torch.no_grad():
        p.model.head.bias.copy_(torch.tensor([1.5, 0.0, -1.5]))
        p.model.head.weight.mul_(0.01)
        probs = F.softmax(p.model(torch.as_tensor(obs)).dist_inputs, -1).mean(0).numpy()
    explore = p.compute_actions(obs).actions
    np.testing.assert_allclose(np.bincount(explore, minlength=3) / 3000, probs, atol=0.03)
    greedy = p.compute_actions(obs, explore=False).actions
    assert (greedy == 0).all()


def test_a_discrete_sac_policy_updates_its_temperature_and_its_checkpoint_restores_the_same(tmp_path):
    overrides = ["+experiment=sac_cartpole", "tracking=none", "algo.learning_starts=64", "algo.train_batch_size=64",
                 "checkpoint.include_replay=true"]
    a, r, b = trained_and_restored(overrides, tmp_path)
    st = a.policy.state_as(ActorCriticState)
    assert st.num_updates == 128 and float(st.log_alpha) != 0.0 and r["train/loss/critic"] > 0
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    np.testing.assert_array_equal(a.policy.compute_actions(obs).actions, b.policy.compute_actions(obs).actions)
    batch = {k: v if k != SB.ACTIONS else v % 2 for k, v in _batch().items()}  # CartPole: 2 actions
    assert_same_losses_and_stop(a, b, batch, (sac_critic_loss, sac_actor_loss))


@pytest.mark.slow
def test_sac_cartpole_reaches_475_greedy_within_30k_steps(tmp_path):
    # one torch thread: the suite runs two test processes on this 2-core machine
    cfg = compose(["+experiment=sac_cartpole", "seed=0", "tracking=none", "progress=false", "torch_threads=1",
                   f"output_dir={tmp_path}"])
    r = run(cfg, launch_dir=tmp_path)
    assert r.target_met and r.metrics["eval/episode_return_mean"] >= 475, r.stop_reason
    assert r.metrics["timesteps_total"] <= 30_000


NO_Q_ALL = """
from dataclasses import dataclass

from rlrun.core.registry import MODELS
from rlrun.models.twin_q import DiscreteTwinQModel, TwinQConfig


@dataclass
class NoQAllConfig(TwinQConfig):
    name: str = "no_q_all"


class NoQAll(DiscreteTwinQModel):
    q_all = None  # a model of Q(s, a) only: SAC on a Discrete space needs every action's


MODELS.add("no_q_all", NoQAll, config=NoQAllConfig)
"""


def test_a_model_without_q_values_per_action_is_refused_on_a_discrete_space_before_a_run_is_recorded(tmp_path):
    import sqlite3

    from tests.inprocess import cli_in_process

    (tmp_path / "no_q_all_model.py").write_text(NO_Q_ALL)
    p = cli_in_process(["algo=sac", "loss=sac", "model=custom", "model.name=no_q_all", "env=cartpole", "rollout=local",
                        "rollout.rollout_fragment_length=auto",
                        "plugins=[no_q_all_model]", "progress=false"], tmp_path)
    assert p.returncode == 2 and p.stderr.strip() == (
        "rlrun: error: model.name: algo 'sac' needs a model with a Q-value per action on a Discrete action space like "
        "twin_q_mlp's (method q_all); model 'no_q_all' has not"), p.stderr[-2000:]
    if (tmp_path / "mlflow.db").exists():  # no MLflow run was started
        with sqlite3.connect(tmp_path / "mlflow.db") as db:
            assert db.execute("select count(*) from runs").fetchone()[0] == 0
