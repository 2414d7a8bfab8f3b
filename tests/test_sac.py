"""SAC, TD3 and DDPG: the squashed Gaussian, the stacked critics, which parameters each loss term
reaches, TD3's delayed actor and target updates, acting within the bounds, and bad set-ups refused."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.algos.sac import ActorCriticState, sac_loss
from rlrun.algos.td3 import td3_loss
from rlrun.app.cli import compose
from rlrun.app.runner import run
from rlrun.core.errors import PluginError
from rlrun.core.registry import MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.distributions import SquashedGaussian
from rlrun.policy.loss import Stage, StagedLoss
from rlrun.sources.plugins import load_builtins

from .conftest import run_cli, without_module

load_builtins()
OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


def _policy(algo="sac", algo_keys=None, **model):
    cfg = MODELS.entry("twin_q_mlp").config_cls(hiddens=[32, 32], critic_hiddens=[32, 32], **model)
    if algo == "td3":
        cfg.action_dist = "deterministic"
    algo_config = get_algorithm(algo).config_cls(**(algo_keys or {}))
    return make_policy(algo, OBS, ACT, model_config=cfg, algo_config=algo_config, seed=3)


def _batch(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return SB({SB.OBS: rng.standard_normal((n, 3)).astype(np.float32),
               SB.ACTIONS: rng.uniform(ACT.low, ACT.high, (n, 2)).astype(np.float32),
               SB.NSTEP_NEXT_OBS: rng.standard_normal((n, 3)).astype(np.float32),
               SB.NSTEP_REWARDS: rng.standard_normal(n).astype(np.float32),
               SB.NSTEP_DISCOUNT: np.full(n, 0.99, np.float32)})


def test_squashed_gaussian_logp_matches_torchs_tanh_transformed_normal():
    torch.manual_seed(0)
    inputs = torch.randn(500, 4) * 0.7
    d = SquashedGaussian(inputs)
    a, logp = d.sample_logp(torch.Generator().manual_seed(1))
    ref = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(d.mean, d.std), [torch.distributions.TanhTransform()])
    keep = a.abs().max(-1).values < 0.999  # atanh is ill-conditioned at the edges
    assert keep.sum() > 400 and (a.abs() <= 1).all()
    torch.testing.assert_close(logp[keep], ref.log_prob(a).sum(-1)[keep], rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(d.logp(a)[keep], logp[keep], rtol=1e-4, atol=1e-3)
    assert torch.equal(d.deterministic_sample(), torch.tanh(d.mean))


def test_the_tanh_correction_stops_at_log_eps_where_an_action_saturates():
    """SB3's, RLlib's and CleanRL's form, log(1 - tanh(u)^2 + 1e-6): at a saturated action the
    correction is log(1e-6) a dimension and passes no gradient to the mean (the exact form's correction,
    2 (log 2 - u - softplus(-2u)), is -22.6 a dimension here, logp 42.8, and its gradient 2 tanh(u) = +-2
    pulls u back)."""
    inputs = torch.tensor([[12.0, -12.0, 0.3, 0.3]], requires_grad=True)  # means +-12, log-stds 0.3
    a, logp, _ = SquashedGaussian(inputs).sample_logp_noise(noise=torch.zeros(1, 2))
    assert torch.equal(a.abs(), torch.ones(1, 2))
    expected = 2 * (-0.3 - 0.5 * math.log(2 * math.pi)) - 2 * math.log(1e-6)
    assert float(logp) == pytest.approx(expected, rel=1e-5)
    (grad,) = torch.autograd.grad(logp.sum(), inputs)
    assert torch.equal(grad[0, :2], torch.zeros(2))  # the means: nothing through a saturated tanh
    torch.testing.assert_close(grad[0, 2:], torch.full((2,), -1.0))  # the log-stds: the Gaussian's -1 each


def test_the_stacked_critics_compute_what_separate_mlps_would():
    p = _policy(num_critics=3)
    m = p.model
    obs, act = torch.randn(16, 3), torch.rand(16, 2) * 2 - 1
    q = m.q(obs, act)
    assert q.shape == (3, 16)
    x = torch.cat([obs, act], -1)
    for c in range(3):
        h = x
        layers = m.critics.weight_of(c)
        for i, (w, b) in enumerate(layers):
            h = F.linear(h, w.T, b)
            h = torch.relu(h) if i < len(layers) - 1 else h
        torch.testing.assert_close(q[c], h.squeeze(-1))
    # detach: the critics' weights are constants, the actions still get gradients
    act.requires_grad_(True)
    m.q(obs, act, detach=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(w.grad is None for w in m.critic_parameters())


def _grads(params):
    return [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params]


def test_each_sac_loss_term_reaches_only_its_own_parameters():
    p = _policy()
    st = p.state_as(ActorCriticState)
    tb = {k: torch.from_numpy(v) for k, v in _batch().items()}
    for term, actor, critic, alpha in (("critic", False, True, False), ("actor", True, False, False),
                                       ("alpha", False, False, True)):
        p.optimizer.zero_grad()
        st.log_alpha.grad = None
        out = sac_loss(p, p.model, p.dist_class, tb)
        out.terms[term].backward()
        assert all(_grads(p.model.actor_parameters())) == actor, term
        assert any(_grads(p.model.critic_parameters())) == critic, term
        assert (st.log_alpha.grad is not None and float(st.log_alpha.grad) != 0) == alpha, term
    assert set(out.stats) == {"alpha", "q_mean", "target_mean", "entropy"}


def _params(p):
    return [*p.model.parameters(), p.state.log_alpha]


@pytest.mark.parametrize("hand", [True, False])
def test_an_update_steps_the_critics_before_the_actors_term_is_computed(hand):
    """SB3's and CleanRL's order: the actor's term passes through the critics after this update's critic
    step. One update equals those two stages done by hand, and differs from every term on the critics
    before the step (RLlib's order)."""
    tb = {k: torch.from_numpy(v) for k, v in _batch().items()}
    keys = {"learning_starts": 0, "hand_gradient": hand}
    p, staged, together = _policy(algo_keys=keys), _policy(algo_keys=keys), _policy(algo_keys=keys)
    assert (p.hand_gradient is not None) == hand and [s.groups for s in p.stages] == [("critic",), ("actor", "alpha")]
    for q in (p, staged, together):
        q.optimizer.set_lr(q.config.lr)
    for _ in range(3):  # (Adam's first step is lr x the gradient's sign: the orders part from the second)
        stats = p.learn_on_minibatch(dict(tb))
        for stage in sac_loss.stages:
            staged.optimizer.zero_grad()
            stage.loss_fn(staged, staged.model, staged.dist_class, dict(tb)).total.backward()
            staged.optimizer.step(stage.groups + stage.optional)
        together.optimizer.zero_grad()
        sac_loss(together, together.model, together.dist_class, dict(tb)).total.backward()
        together.optimizer.step()
    assert {"train/loss/critic", "train/loss/actor", "train/loss/alpha", "train/q_mean", "train/entropy"} <= set(stats)
    for a, b in zip(_params(p), _params(staged), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(p.model.critic_parameters(), together.model.critic_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the critic stage is the same either way
    assert not torch.allclose(p.model.head.weight, together.model.head.weight, rtol=1e-5, atol=1e-6)


def test_a_staged_loss_names_groups_the_optimizer_has():
    def critic(policy, model, dist_class, batch):
        return sac_loss.stages[0].loss_fn(policy, model, dist_class, batch)

    typo = StagedLoss(Stage(critic, ("critc",)))
    with pytest.raises(PluginError, match=r"loss.name: loss 'sac' steps optimizer groups \['critc'\] in stages; "
                                          r"algo 'sac' has groups \['actor', 'alpha', 'critic'\]"):
        make_policy("sac", OBS, ACT, algo_config=get_algorithm("sac").config_cls(), loss_fn=typo)
    with pytest.raises(PluginError, match=r"algo 'ppo' has one optimizer"):
        make_policy("ppo", OBS, ACT, loss_fn=StagedLoss(Stage(critic, ("critic",))))
    with pytest.raises(ValueError, match="each naming the optimizer groups"):
        StagedLoss(Stage(critic, ()))


def test_sac_learns_with_its_own_rate_per_group_and_moves_the_target_critics_by_tau():
    p = _policy(algo_keys={"learning_starts": 0, "critic_lr": 1e-3, "alpha_lr": 1e-2})  # algo.lr 3e-4: the actor's
    st = p.state_as(ActorCriticState)
    p.optimizer.set_lr(p.config.lr)  # the Policy sets it before every learning round
    rates = {k: g.lr for k, g in p.optimizer.groups.items()}
    assert rates == pytest.approx({"actor": 3e-4, "critic": 1e-3, "alpha": 1e-2})
    online0 = [t.clone() for t in p.model.critic_parameters()]
    target0 = [t.clone() for t in st.target_model.critics.parameters()]
    stats = get_algorithm("sac").learn(p, _batch(1), LearnContext(1, 0))  # 256 rows per env step: one update
    assert stats["train/num_updates"] == 1 and st.num_updates == 1
    for t0, t1, o1 in zip(target0, st.target_model.critics.parameters(), p.model.critic_parameters(), strict=True):
        torch.testing.assert_close(t1, t0 + 0.005 * (o1 - t0))
    assert any(not torch.equal(a, b) for a, b in zip(online0, p.model.critic_parameters(), strict=True))
    assert float(st.log_alpha) != 0.0 and {"train/loss/critic", "train/loss/actor", "train/alpha"} <= set(stats)


def test_td3_moves_the_actor_and_the_targets_every_policy_delay_th_update():
    p = _policy("td3")
    p.config.learning_starts = 0
    p.config.policy_delay = 2
    st = p.state_as(ActorCriticState)
    tb = {k: torch.from_numpy(v) for k, v in _batch().items()}
    assert "actor" in td3_loss(p, p.model, p.dist_class, tb).terms  # update 0 moves the actor
    moved = []
    for i in range(4):
        actor0 = [t.clone() for t in p.model.actor_parameters()]
        target0 = [t.clone() for t in st.target_model.parameters()]
        get_algorithm("td3").learn(p, _batch(1, seed=i), LearnContext(i + 1, i))
        moved.append((any(not torch.equal(a, b) for a, b in zip(actor0, p.model.actor_parameters(), strict=True)),
                      any(not torch.equal(a, b) for a, b in zip(target0, st.target_model.parameters(), strict=True))))
    assert moved == [(True, True), (False, False), (True, True), (False, False)]
    assert st.num_updates == 4


def test_a_td3_update_steps_the_critics_before_the_delayed_actors_term_is_computed():
    """The TD3 authors' order (SB3's, CleanRL's): the critics step, then on every policy_delay-th update the actor's
    term passes through the stepped critics. Updates equal those stages done by hand (the actor's only where
    due), and differ from both terms on the critics before their step (RLlib's DDPG/TD3 order)."""
    tb = {k: torch.from_numpy(v) for k, v in _batch().items()}
    p, staged, together = (_policy("td3", {"learning_starts": 0, "policy_delay": 2}) for _ in range(3))
    assert [(s.groups, s.when is not None) for s in p.stages] == [(("critic",), False), (("actor",), True)]
    for q in (p, staged, together):
        q.optimizer.set_lr(q.config.lr)
    took = []
    for _ in range(4):  # updates 0 and 2 move the actor, 1 and 3 do not (Adam's first step is lr x sign(grad))
        stats = p.learn_on_minibatch(dict(tb))
        took.append("train/loss/actor" in stats)
        for stage in td3_loss.stages:
            if stage.when is None or stage.when(staged):
                staged.optimizer.zero_grad()
                stage.loss_fn(staged, staged.model, staged.dist_class, dict(tb)).total.backward()
                staged.optimizer.step(stage.groups)
        together.optimizer.zero_grad()
        td3_loss(together, together.model, together.dist_class, dict(tb)).total.backward()
        together.optimizer.step()
        for q in (p, staged, together):  # what the update loop counts after each update
            q.state.num_updates += 1
    assert took == [True, False, True, False] and {"train/loss/critic", "train/q_mean"} <= set(stats)
    for a, b in zip(p.model.parameters(), staged.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(p.model.critic_parameters(), together.model.critic_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the critic stage is the same either way
    assert not torch.allclose(p.model.head.weight, together.model.head.weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_actions_stay_within_the_bounds_random_before_learning_starts_greedy_is_deterministic(algo):
    p = _policy(algo)
    obs = np.random.default_rng(0).standard_normal((500, 3)).astype(np.float32)
    p.global_timestep = 0
    random = p.compute_actions(obs).actions
    assert random.shape == (500, 2) and (random >= ACT.low).all() and (random <= ACT.high).all()
    assert random.std(0) == pytest.approx((ACT.high - ACT.low) / np.sqrt(12), rel=0.15)  # uniform
    p.global_timestep = 10**9
    explore, greedy = p.compute_actions(obs).actions, p.compute_actions(obs, explore=False).actions
    assert (explore >= ACT.low).all() and (explore <= ACT.high).all()
    np.testing.assert_array_equal(greedy, p.compute_actions(obs, explore=False).actions)
    assert not np.array_equal(explore, greedy)


def test_ddpg_is_td3_with_one_critic_no_delay_and_no_smoothing(tmp_path):
    cfg = compose(["+experiment=ddpg_pendulum", "tracking=none", "progress=false", f"output_dir={tmp_path}",
                   "algo.learning_starts=128", "stop.timesteps_total=256", "evaluation.interval=0"])
    # 64 env steps an iteration: the second stores 128 rows and makes 64 updates, as do the third and fourth
    assert (cfg.algo.name, cfg.model.num_critics, cfg.algo.policy_delay, cfg.algo.target_noise) == ("td3", 1, 1, 0)
    r = run(cfg, launch_dir=tmp_path)
    assert r.metrics["train/num_updates"] == 192 and np.isfinite(r.metrics["train/loss/actor"])


@pytest.mark.parametrize(("preset", "hiddens"), [
    ("sac_halfcheetah", [256, 256]), ("td3_halfcheetah", [400, 300])])
def test_the_halfcheetah_presets_run_rl_zoos_nets_on_halfcheetah_v5(tmp_path, preset, hiddens):
    preset_cfg = compose([f"+experiment={preset}"])
    # rl-zoo's cadence: rounds of one env step and one update, reported every 1,024 env steps
    assert (preset_cfg.algo.train_batch_size, preset_cfg.rollout.rollout_fragment_length,
            preset_cfg.min_sample_timesteps_per_iteration) == (1, 1, 1024)
    cfg = compose([f"+experiment={preset}", "tracking=none", "progress=false", f"output_dir={tmp_path}",
                   "algo.learning_starts=64", "stop.timesteps_total=128", "evaluation.interval=0",
                   "min_sample_timesteps_per_iteration=64"])
    assert (cfg.env.id, list(cfg.model.critic_hiddens), cfg.stop["timesteps_total"]) == ("HalfCheetah-v5", hiddens, 128)
    r = run(cfg, launch_dir=tmp_path)
    # two iterations of 64 rounds: updates from the 64th stored row on, one a round
    assert (r.metrics["training_iteration"], r.metrics["timesteps_total"]) == (2, 128)
    assert r.metrics["train/num_updates"] == 65 and np.isfinite(r.metrics["train/loss/critic"])
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


@pytest.mark.parametrize(("overrides", "says"), [
    (["env=cartpole", "model.action_dist=squashed_gaussian"],
     "model.action_dist: 'squashed_gaussian' cannot act in the env's action space Discrete(2)"),
    (["env=cartpole", "algo=td3", "loss=td3", "model.action_dist=deterministic"],
     "algo 'td3' needs a Box action space"),
    # the preset sets model.critic_hiddens, which the mlp model does not have
    (["model=mlp", "~model.critic_hiddens"], "needs a model with actor and Q-critics"),
    (["model=mlp"], "model.critic_hiddens: unknown key"),
    (["model.action_dist=diag_gaussian"], "model.action_dist: algo 'sac' needs squashed_gaussian"),
    (["algo.tau=1.5"], "algo.tau: 1.5"),
    (["model.num_critics=0"], "model.num_critics: 0"),
])
def test_bad_sac_set_ups_get_one_line(overrides, says, refuse):
    p = refuse("+experiment=sac_pendulum", "tracking=none", *overrides)
    assert p.returncode == 2, p.stderr[-2000:]
    line = p.stderr.strip().splitlines()[-1]
    assert says in line and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_mujoco_env_without_mujoco_installed_names_the_extra(tmp_path):
    p = run_cli(["+experiment=sac_inverted_pendulum", "tracking=none"], tmp_path,
                env=without_module(tmp_path, "mujoco"))
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlrun: error: env.id: InvertedPendulum-v5 is a MuJoCo env"), lines
    assert 'pip install -e ".[mujoco]"' in lines[0]
    assert not (tmp_path / "mlflow.db").exists()  # refused before anything started


def test_mujoco_warnings_are_python_warnings_and_leave_no_log_file_in_the_working_directory(tmp_path, monkeypatch):
    import warnings

    import mujoco

    from rlrun.envs.make import make_vector_env

    monkeypatch.chdir(tmp_path)
    make_vector_env("HalfCheetah-v5", 2).close()  # rlrun's env creation routes MuJoCo's warnings
    xml = '<mujoco><worldbody><body><freejoint/><geom size="0.1"/></body></worldbody></mujoco>'
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    d.qvel[:] = np.nan  # an unstable simulation: MuJoCo warns
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        mujoco.mj_step(m, d)
    routed = [str(w.message) for w in said if "MuJoCo:" in str(w.message)]
    assert routed and routed[0].startswith("MuJoCo: Nan, Inf or huge value"), routed
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_the_summary_names_the_configured_return_window(tmp_path):
    from rlrun.tracking.progress import Summary

    rows = [{"rollout/episode_return_mean": -300.0, "timesteps_total": 64.0}]
    summary = Summary("timesteps_total = 64 >= 64", False, rows, 1.0, tmp_path, None, None, None, "e", None, window=10)
    lines = summary.lines()
    assert "final -300.0, best -300.0 (mean of the last 10 episodes)" in lines[1]


def test_td3_loss_takes_rllib_ddpgs_huber_critic_and_l2_reg():
    from rlrun.algos.td3 import TD3LossConfig

    p = _policy("td3", {"target_noise": 0.0})
    tb = {k: torch.as_tensor(v) for k, v in _batch(seed=2).items()}
    tb[SB.NSTEP_REWARDS] = tb[SB.NSTEP_REWARDS] * 50  # TD errors far beyond the Huber delta

    def loss(**kw):
        p.loss_config = TD3LossConfig(**kw)
        return td3_loss(p, p.model, p.dist_class, tb)

    plain, huber = loss(), loss(huber_delta=1.0)
    assert huber.terms["critic"] < plain.terms["critic"] / 5  # linear, not squared, in the large errors
    m = p.model
    weights = [w for n, w in [*m.actor.named_parameters(), *m.head.named_parameters()] if "bias" not in n]
    critic_weights = [w for n, w in m.critics.named_parameters() if "bias" not in n]
    reg = loss(l2_reg=0.1)
    l2 = lambda ws: sum(float(w.pow(2).sum()) / 2 for w in ws)  # noqa: E731
    assert float(reg.terms["critic"] - plain.terms["critic"]) == pytest.approx(0.1 * l2(critic_weights), rel=1e-4)
    assert float(reg.terms["actor"] - plain.terms["actor"]) == pytest.approx(0.1 * l2(weights), rel=1e-4)
