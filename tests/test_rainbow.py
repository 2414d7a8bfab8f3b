"""Rainbow's parts for DQN, each on its own: prioritized replay (sum tree, proportional sampling,
importance weights, priority updates, checkpoints), C51's projection and loss, noisy layers."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.algos.dqn import DQNConfig, dqn_actions, epsilon, project_distribution
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.prioritized import PrioritizedReplayBuffer, SumTree
from rlrun.models.noisy import NoisyLinear, shared_noise
from rlrun.models.q_networks import QMLPConfig, QMLPModel
from rlrun.sources.plugins import load_builtins

load_builtins()
OBS, ACT = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)


def rows(n: int, start: int = 0) -> SB:
    return SB({SB.OBS: np.arange(start, start + n, dtype=np.float32)[:, None].repeat(4, 1),
               SB.ACTIONS: np.arange(n) % 2, SB.NSTEP_NEXT_OBS: np.zeros((n, 4), np.float32),
               SB.NSTEP_REWARDS: np.ones(n, np.float32), SB.NSTEP_DISCOUNT: np.full(n, 0.99, np.float32)})


# ------------------------------------------------------------------ prioritized replay
@pytest.mark.parametrize("capacity", [10, 16, 300, 70_000])  # one node, one full level, 3 and 5 levels
def test_the_sum_tree_totals_and_finds_the_leaf_whose_interval_holds_a_mass(capacity):
    t = SumTree(capacity)
    values = np.random.default_rng(0).random(capacity) * (np.arange(capacity) % 3 != 0)  # every third is 0
    t.update(np.arange(capacity), values)
    assert t.total == pytest.approx(values.sum())
    edges = np.concatenate([[0.0], np.cumsum(values)])
    mass = np.random.default_rng(1).random(5000) * t.total
    expected = np.searchsorted(edges, mass, side="right") - 1
    assert np.array_equal(t.find(mass), expected)
    assert values[t.find(np.array([t.total * (1 - 1e-15), 0.0]))].min() > 0  # never a leaf of value 0


def test_prioritized_sampling_is_proportional_to_priority_to_the_alpha():
    """A chi-square test of 60k draws from 10 rows of priorities 1..10 (alpha 0.5): the counts fit
    p_i^alpha / sum_k p_k^alpha (statistic below the 99.99 % quantile of chi-square with 9 degrees of
    freedom, 33.72), and the uniform distribution does not."""
    buf = PrioritizedReplayBuffer(16, seed=3, alpha=0.5, eps=0.0)
    buf.add(rows(10))
    priorities = np.arange(1.0, 11.0)
    buf.update_priorities(np.arange(10), priorities)
    n = 60_000
    drawn = np.concatenate([buf.sample(1000)[SB.BATCH_INDEXES] for _ in range(n // 1000)])
    counts = np.bincount(drawn, minlength=16)
    assert counts[10:].sum() == 0  # rows never added are never drawn

    def chi2(p: np.ndarray) -> float:
        expected = n * p
        return float(((counts[:10] - expected) ** 2 / expected).sum())

    assert chi2(priorities**0.5 / (priorities**0.5).sum()) < 33.72
    assert chi2(np.full(10, 0.1)) > 33.72


def test_importance_weights_are_n_p_to_the_minus_beta_over_the_minibatchs_largest():
    buf = PrioritizedReplayBuffer(8, seed=0, alpha=1.0, eps=0.0)
    buf.add(rows(4))
    buf.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    got = buf.sample(64, beta=0.5)
    idx, w = got[SB.BATCH_INDEXES], got[SB.WEIGHTS]
    p = (idx + 1) / 10.0
    raw = (4 * p) ** -0.5
    assert np.allclose(w, raw / raw.max()) and w.max() == 1.0
    assert np.array_equal(got[SB.OBS][:, 0], idx.astype(np.float32))  # the rows are the ones indexed
    assert np.allclose(buf.sample(64, beta=0.0)[SB.WEIGHTS], 1.0)  # beta 0: no correction


def test_new_rows_get_the_largest_priority_seen_and_updates_set_td_plus_eps_to_the_alpha():
    buf = PrioritizedReplayBuffer(8, seed=0, alpha=0.6, eps=0.01)
    buf.add(rows(3))
    assert np.allclose(buf.tree.leaves(3), 1.0)  # the initial largest priority
    buf.update_priorities(np.array([0, 2]), np.array([-3.0, 0.5]))
    assert np.allclose(buf.tree.leaves(3), [3.01**0.6, 1.0, 0.51**0.6])
    buf.add(rows(6, start=3))  # wraps: rows 0 overwritten by the 9th row
    assert np.allclose(buf.tree.leaves()[[0, 3, 7]], 3.01**0.6) and buf.tree.total == pytest.approx(
        buf.tree.leaves().sum())


def test_a_dqn_checkpoint_with_its_buffer_restores_the_priorities(tmp_path):
    from rlrun.data.replay import replay_checkpoint, restore_replay

    buf = PrioritizedReplayBuffer(8, seed=0)
    buf.add(rows(5))
    buf.update_priorities(np.arange(5), np.array([0.1, 5.0, 0.2, 3.0, 0.0]))
    torch.save(replay_checkpoint(buf, include_buffers=True), tmp_path / "r.pt")
    back = PrioritizedReplayBuffer(8, seed=9)
    restore_replay(back, torch.load(tmp_path / "r.pt", weights_only=True))
    assert np.array_equal(back.tree.leaves(), buf.tree.leaves()) and back.max_priority == buf.max_priority
    assert np.array_equal(back.sample(32)[SB.BATCH_INDEXES], buf.sample(32)[SB.BATCH_INDEXES])  # same RNG too


def test_dqn_with_prioritized_replay_weights_its_loss_and_updates_priorities_from_td_errors():
    cfg = DQNConfig(learning_starts=0, prioritized_replay=True, sgd_minibatch_size=32, training_intensity=32.0)
    p = make_policy("dqn", OBS, ACT, algo_config=cfg)
    batch = rows(64)
    get_algorithm("dqn").learn(p, batch, LearnContext(64, 0))  # 64 steps of 32 rows
    leaves = p.state.replay.tree.leaves(64)
    assert not np.allclose(leaves, leaves[0])  # the TD errors set them apart
    assert np.all(leaves > 0)


def test_prioritized_replay_with_a_loss_that_gives_no_td_errors_says_what_it_needs():
    from rlrun.core.errors import PluginError
    from rlrun.policy.policy import LossOutput

    def plain(policy, model, dist_class, batch):  # a user's loss that knows nothing of priorities
        q = model(batch[SB.OBS]).dist_inputs.mean()
        return LossOutput(q, {"q": q})

    cfg = DQNConfig(learning_starts=0, prioritized_replay=True, sgd_minibatch_size=32, training_intensity=32.0)
    p = make_policy("dqn", OBS, ACT, algo_config=cfg, loss_fn=plain)
    with pytest.raises(PluginError, match=r"algo.prioritized_replay needs the loss to write each row's TD error "
                                          r"into its batch as batch\['td_error'\]"):
        get_algorithm("dqn").learn(p, rows(64), LearnContext(64, 0))


# ------------------------------------------------------------------ C51
def test_c51_projection_matches_a_hand_worked_example():
    """Atoms -1, 0, 1 with probabilities 0.2, 0.5, 0.3, reward 0.5, discount 1: they move to -0.5, 0.5
    and 1.5 (clipped to 1). -0.5 splits evenly between -1 and 0 (0.1 each); 0.5 between 0 and 1
    (0.25 each); 1 stays on 1 (0.3). Terminal (discount 0): all mass at 0.5, half on 0, half on 1."""
    support = torch.tensor([-1.0, 0.0, 1.0])
    p = torch.tensor([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3]])
    out = project_distribution(p, torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), support)
    assert torch.allclose(out, torch.tensor([[0.1, 0.35, 0.55], [0.0, 0.5, 0.5]]))
    exact = project_distribution(p[:1], torch.tensor([0.0]), torch.tensor([1.0]), support)
    assert torch.allclose(exact, p[:1])  # a target on the atoms themselves is unchanged


def test_a_distributional_q_model_gives_expected_values_of_its_atoms():
    m = QMLPModel(OBS, ACT, 2, QMLPConfig(hiddens=[16], num_atoms=11, v_min=-5, v_max=5, dueling=True))
    x = torch.randn(6, 4)
    log_p = m.q_log_probs(x)
    assert log_p.shape == (6, 2, 11) and torch.allclose(log_p.exp().sum(-1), torch.ones(6, 2))
    assert torch.allclose(m(x).dist_inputs, (log_p.exp() * torch.linspace(-5, 5, 11)).sum(-1), atol=1e-6)


def test_the_c51_loss_is_the_cross_entropy_to_the_projected_target_and_reports_it_as_td_error():
    mc = QMLPConfig(hiddens=[16], num_atoms=5, v_min=0, v_max=4)
    p = make_policy("dqn", OBS, ACT, model_config=mc, algo_config=DQNConfig(double_q=False))
    b = {k: torch.from_numpy(v) for k, v in rows(8).items()}
    out = p.loss_fn(p, p.model, p.dist_class, b)
    with torch.no_grad():
        p_next = p.state.target_model.q_log_probs(b[SB.NSTEP_NEXT_OBS]).exp()
        best = (p_next * p.model.support).sum(-1).argmax(-1)
        target = project_distribution(p_next[torch.arange(8), best], b[SB.NSTEP_REWARDS], b[SB.NSTEP_DISCOUNT],
                                      p.model.support)
        log_p = p.model.q_log_probs(b[SB.OBS])[torch.arange(8), b[SB.ACTIONS]]
    ce = -(target * log_p).sum(-1)
    assert torch.allclose(out.total, ce.mean()) and torch.allclose(b[SB.TD_ERROR], ce)


# ------------------------------------------------------------------ noisy nets
def test_noisy_layers_resample_noise_each_training_pass_and_use_their_means_in_eval_mode():
    torch.manual_seed(0)
    layer = NoisyLinear(8, 3, sigma0=0.5)
    x = torch.randn(4, 8)
    a, b = layer(x), layer(x)
    assert not torch.allclose(a, b)  # fresh noise each pass
    layer.eval()
    mean = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert torch.equal(layer(x), mean) and torch.equal(layer(x), layer(x))
    layer.train()
    layer(x).sum().backward()
    assert layer.weight_sigma.grad is not None and layer.weight_sigma.grad.abs().sum() > 0  # the noise scale learns
    assert torch.allclose(layer.weight_sigma, torch.full((3, 8), 0.5 / 8**0.5))


def test_inside_shared_noise_a_models_passes_share_one_draw_and_draw_afresh_after_it():
    torch.manual_seed(0)
    net = torch.nn.Sequential(NoisyLinear(8, 8), torch.nn.ReLU(), NoisyLinear(8, 3))
    x = torch.randn(4, 8)
    with shared_noise(net):
        a = net(x)
        with torch.no_grad():
            b = net(x)
    assert torch.equal(a.detach(), b)
    assert not torch.allclose(net(x), b) and not torch.allclose(net(x), net(x))  # fresh draws again
    with shared_noise(torch.nn.Linear(8, 3)):  # nothing noisy: nothing to hold
        pass


def test_a_noisy_dqn_explores_by_its_noise_not_epsilon_and_acts_on_its_means_greedily():
    p = make_policy("dqn", OBS, ACT, model_config=QMLPConfig(hiddens=[16], noisy=True))
    assert p.state.actor is not None and epsilon(p) == 0.0  # acting in numpy, no random actions
    obs = np.random.default_rng(0).standard_normal((256, 4)).astype(np.float32)
    explore = [dqn_actions(p, obs, explore=True).actions for _ in range(2)]
    assert not np.array_equal(*explore)  # two noise draws act differently somewhere
    greedy = [dqn_actions(p, obs, explore=False).actions for _ in range(2)]
    assert np.array_equal(*greedy) and p.model.training  # the means, and the model back in training mode
    with torch.no_grad():
        p.model.eval()
        means = p.model(torch.from_numpy(obs)).dist_inputs.argmax(-1).numpy()
        p.model.train()
    assert np.array_equal(greedy[0], means)


@pytest.mark.parametrize("atoms", [1, 11])
def test_acting_in_numpy_draws_the_noisy_heads_noise_from_the_policys_generator(atoms):
    """Exploring, the numpy actor's Q-values are the noisy heads' with factorised noise drawn from the
    policy's numpy generator (advantage head, then value head; e_in, then e_out), the same as torch's
    formula with that noise; the generator is what checkpoints carry, so a resumed run acts alike."""
    mc = QMLPConfig(hiddens=[16], noisy=True, dueling=True, num_atoms=atoms, v_min=-2, v_max=2)
    p = make_policy("dqn", OBS, ACT, model_config=mc, seed=3)
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    rng = copy.deepcopy(p.np_rng)  # the draws the actor is about to make
    q = dqn_actions(p, obs, explore=True).dist_inputs

    def f(n: int) -> torch.Tensor:
        e = torch.from_numpy(rng.standard_normal(n, dtype=np.float32))
        return e.sign() * e.abs().sqrt()

    def noisy(layer: NoisyLinear, h: torch.Tensor) -> torch.Tensor:
        e_in, e_out = f(layer.in_features), f(layer.out_features)
        w = layer.weight + layer.weight_sigma * torch.outer(e_out, e_in)
        return h @ w.t() + layer.bias + layer.bias_sigma * e_out

    m = p.model
    with torch.no_grad():
        h = m.features(torch.from_numpy(obs))
        adv = noisy(m.adv_head, h).reshape(8, 2, atoms)
        z = noisy(m.v_head, h).unsqueeze(1) + adv - adv.mean(1, keepdim=True)
        expected = z.squeeze(-1) if atoms == 1 else (torch.softmax(z, -1) * m.support).sum(-1)
    np.testing.assert_allclose(q, expected.numpy(), rtol=1e-5, atol=1e-5)
    assert not np.allclose(q, dqn_actions(p, obs, explore=True).dist_inputs)  # fresh noise each call


@pytest.mark.parametrize(("overrides", "says"), [
    (["model.num_atoms=0"], "model.num_atoms: must be at least 1"),
    (["model.num_atoms=51", "model.v_min=10", "model.v_max=0"], "model.v_min: must be below model.v_max"),
    (["model.noisy=true", "model.sigma0=0"], "model.sigma0: must be above 0"),
])
def test_bad_rainbow_settings_get_one_line(tmp_path, overrides, says):
    from .conftest import run_cli

    p = run_cli(["+experiment=rainbow_cartpole", "tracking=none", *overrides], tmp_path)
    assert p.returncode == 2 and p.stderr.strip().startswith(f"rlrun: error: {says}"), p.stderr  # the key once
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
