"""Pixel SAC and TD3: ``twin_q_cnn`` (the actor's own convolutions; one convolutional encoder shared by the
stacked critics) under the ``sac`` and ``td3`` losses, on Discrete and Box action spaces."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import make_policy
from rlrun.algos.sac import ActorCriticState, SACConfig, sac_actor_loss, sac_after_update, sac_critic_loss
from rlrun.algos.td3 import TD3Config, td3_actor_loss, td3_after_update
from rlrun.core.registry import MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.distributions import Categorical, Deterministic, SquashedGaussian
from rlrun.models.twin_q_cnn import DiscreteTwinQCNNModel, TwinQCNNModel
from rlrun.sources.plugins import load_builtins

from .conftest import assert_same_losses_and_stop, trained_and_restored

load_builtins()
IMAGES = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)  # [H, W, C]
SMALL = {"conv_filters": [[8, 3, 2], [16, 3, 1]], "hiddens": [32], "critic_hiddens": [32]}


def _policy(algo="sac", space=None, seed=3, **algo_cfg):
    cfg = MODELS.entry("twin_q_cnn").config_cls(**SMALL)
    if algo == "td3":
        cfg.action_dist = "deterministic"
        algo_config = TD3Config(**algo_cfg)
    else:
        algo_config = SACConfig(**algo_cfg)
    space = space or gym.spaces.Discrete(3)
    return make_policy(algo, IMAGES, space, model_config=cfg, algo_config=algo_config, seed=seed)


def _batch(actions, n=16, seed=0):
    rng = np.random.default_rng(seed)
    return {SB.OBS: torch.as_tensor(rng.integers(0, 256, (n, 12, 12, 3), dtype=np.uint8)),
            SB.ACTIONS: torch.as_tensor(actions(rng, n)),
            SB.NSTEP_NEXT_OBS: torch.as_tensor(rng.integers(0, 256, (n, 12, 12, 3), dtype=np.uint8)),
            SB.NSTEP_REWARDS: torch.as_tensor(rng.standard_normal(n).astype(np.float32)),
            SB.NSTEP_DISCOUNT: torch.full((n,), 0.9)}


def _discrete(rng, n):
    return rng.integers(0, 3, n)


def _box(rng, n):
    return rng.uniform(-2, 2, (n, 2)).astype(np.float32)


BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def test_on_a_discrete_space_the_critics_share_one_encoder_under_stacked_heads_and_the_actor_has_its_own():
    p = _policy()
    m = p.model
    assert isinstance(m, DiscreteTwinQCNNModel) and p.dist_class is Categorical
    b = _batch(_discrete)
    assert m(b[SB.OBS]).dist_inputs.shape == (16, 3)
    q_all = m.q_all(b[SB.OBS])
    assert q_all.shape == (2, 16, 3) and not torch.allclose(q_all[0], q_all[1])
    # every critic is its stacked head over the one encoder's features of the [C, H, W] image scaled to [0, 1]
    x = b[SB.OBS].permute(0, 3, 1, 2).float() / 255
    torch.testing.assert_close(q_all, m.critics.stack(m.critics.encoder(x)))
    a = torch.as_tensor(b[SB.ACTIONS])
    torch.testing.assert_close(m.q(b[SB.OBS], a), q_all[:, torch.arange(16), a])
    actor_ids = {id(w) for w in m.actor_parameters()}
    assert actor_ids.isdisjoint(id(w) for w in m.critic_parameters())
    assert {id(w) for w in m.critics.encoder.parameters()} <= {id(w) for w in m.critic_parameters()}
    assert len(actor_ids) + len(m.critic_parameters()) == len(list(m.parameters()))


@pytest.mark.parametrize("space,actions", [(gym.spaces.Discrete(3), _discrete), (BOX, _box)], ids=["discrete", "box"])
def test_the_critic_stage_trains_the_critics_and_their_encoder_the_actor_stage_the_actor_alone(space, actions):
    p = _policy(space=space)
    b = _batch(actions)
    critic = sac_critic_loss(p, p.model, p.dist_class, b)
    critic.total.backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in p.model.critic_parameters())
    assert all(w.grad is None for w in p.model.actor_parameters())  # the target is a constant
    p.model.zero_grad(set_to_none=True)
    actor = sac_actor_loss(p, p.model, p.dist_class, b)
    actor.total.backward()
    assert all(w.grad is None for w in p.model.critic_parameters())  # the critics held fixed, encoder included
    assert all(w.grad is not None for w in p.model.actor_parameters())
    assert torch.isfinite(critic.total) and torch.isfinite(actor.total)


def test_on_a_box_space_the_critics_take_actions_in_unit_bounds_and_the_actor_a_squashed_gaussian():
    p = _policy(space=BOX, learning_starts=0)
    m = p.model
    assert isinstance(m, TwinQCNNModel) and p.dist_class is SquashedGaussian
    b = _batch(_box)
    assert m(b[SB.OBS]).dist_inputs.shape == (16, 4)  # means and log-stds
    unit = m.to_unit(b[SB.ACTIONS])
    torch.testing.assert_close(unit, b[SB.ACTIONS] / 2)
    x = b[SB.OBS].permute(0, 3, 1, 2).float() / 255
    torch.testing.assert_close(m.q(b[SB.OBS], unit), m.critics.stack(torch.cat([m.critics.encoder(x), unit], -1)))
    acts = p.compute_actions(b[SB.OBS].numpy()).actions
    assert acts.shape == (16, 2) and (np.abs(acts) <= 2).all() and acts.std() > 0
    # the actor's term: gradients reach the actions, never the critics' weights
    a = unit.clone().requires_grad_(True)
    m.q(b[SB.OBS], a, detach=True).sum().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0
    assert all(w.grad is None for w in m.critic_parameters())


def test_polyak_steps_move_the_target_encoder_with_the_critics_and_td3_moves_the_target_actor_too():
    for algo, after, space in (("sac", sac_after_update, gym.spaces.Discrete(3)), ("td3", td3_after_update, BOX)):
        p = _policy(algo, space=space, tau=0.5)
        st = p.state_as(ActorCriticState)
        with torch.no_grad():
            for w in p.model.parameters():
                w.add_(1.0)
        before = {k: v.clone() for k, v in st.target_model.state_dict().items()}
        st.num_updates = 1
        after(p, st)
        moved = {k for k, v in st.target_model.state_dict().items() if not torch.equal(v, before[k])}
        encoder = {k for k in before if k.startswith("critics.encoder.") and k.endswith("weight")}
        assert encoder and encoder <= moved
        actor = {k for k in before if k.startswith("actor.") and k.endswith("weight")}
        assert actor <= moved if algo == "td3" else not actor & moved
        key = sorted(encoder)[0]
        want = before[key] + 0.5 * (p.model.state_dict()[key] - before[key])
        torch.testing.assert_close(st.target_model.state_dict()[key], want)


def test_td3_acts_deterministically_on_pixels_and_its_actor_term_passes_through_the_first_critic_alone():
    p = _policy("td3", space=BOX, learning_starts=0)
    assert p.dist_class is Deterministic
    m = p.model
    b = _batch(_box)
    before = td3_actor_loss(p, m, p.dist_class, b).total.detach()
    with torch.no_grad():  # the second critic's layers: the actor's term must not see them
        for w in m.critics.stack.parameters():
            w[1].add_(1.0)
    after = td3_actor_loss(p, m, p.dist_class, b).total.detach()
    torch.testing.assert_close(after, before)
    with torch.no_grad():
        m.critics.stack.weights[0][0].add_(1.0)  # the first critic's: it must
    assert not torch.equal(td3_actor_loss(p, m, p.dist_class, b).total.detach(), before)
    greedy = p.compute_actions(b[SB.OBS].numpy(), explore=False).actions
    with torch.no_grad():
        x = b[SB.OBS].permute(0, 3, 1, 2).float() / 255
        want = 2 * torch.tanh(m.head(m.actor(x)))  # the actor's own convolutions, scaled to the bounds [-2, 2]
    np.testing.assert_allclose(greedy, want.numpy(), rtol=1e-5, atol=1e-6)


def test_a_pixel_sac_checkpoint_restores_the_same_actions_losses_and_target_encoder(tmp_path):
    overrides = ["+experiment=sac_minigrid_empty", "tracking=none", "algo.learning_starts=64",
                 "checkpoint.include_replay=true"]
    a, r, b = trained_and_restored(overrides, tmp_path)
    st = a.policy.state_as(ActorCriticState)
    assert st.num_updates == 128 and r["train/loss/critic"] > 0
    for key, v in st.target_model.state_dict().items():  # the target encoder, Polyak-stepped 128 times
        assert torch.equal(v, b.policy.state_as(ActorCriticState).target_model.state_dict()[key]), key
    obs = np.random.default_rng(0).integers(0, 11, (64, 7, 7, 3), dtype=np.uint8)
    np.testing.assert_array_equal(a.policy.compute_actions(obs, explore=False).actions,
                                  b.policy.compute_actions(obs, explore=False).actions)
    batch = {k: torch.as_tensor(v) for k, v in st.replay.sample(32).items()}
    assert_same_losses_and_stop(a, b, batch, (sac_critic_loss, sac_actor_loss))


@pytest.mark.slow
def test_sac_minigrid_empty_reaches_0_9_greedy_within_10k_steps_and_records_its_distribution(tmp_path):
    from mlflow.tracking import MlflowClient

    from rlrun.app.cli import compose
    from rlrun.app.runner import run

    # one torch thread: the suite runs two test processes on this 2-core machine; 2,048 env steps on seeds 0-2
    cfg = compose(["+experiment=sac_minigrid_empty", "seed=0", "progress=false", "torch_threads=1",
                   f"output_dir={tmp_path / 'out'}"])
    r = run(cfg, launch_dir=tmp_path)
    assert r.target_met and r.metrics["eval/episode_return_mean"] >= 0.9, r.stop_reason
    assert r.metrics["timesteps_total"] <= 10_000
    run_record = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(r.run_id)
    # model.action_dist is null in the config (the params); the tag names what it resolved to
    params = run_record.data.params
    assert params["model.name"] == "twin_q_cnn" and params["model.action_dist"] == "null"
    assert run_record.data.tags["rlrun.action_dist"] == "categorical"
    assert run_record.data.metrics["train/loss/critic"] > 0 and "train/alpha" in run_record.data.metrics


def test_the_memory_check_counts_the_critics_encoder_as_well_as_the_actors_convolutions():
    from rlrun.config.resources import model_parameters

    cfg = MODELS.entry("twin_q_cnn").config_cls(**SMALL)
    parts = model_parameters(cfg)
    conv = (8 * 1 * 9 + 8) + (16 * 8 * 9 + 16)  # the lower bound's one-channel image
    assert parts["conv_filters"] == 2 * conv  # the actor's and the critics' encoder
    assert parts["critic_hiddens"] == 2 * (16 * 32 + 32)  # each critic's layer over the encoder's 16 channels at least
    model = make_policy("sac", IMAGES, gym.spaces.Discrete(3), model_config=cfg).model
    assert sum(parts.values()) <= sum(w.numel() for w in model.parameters())  # a lower bound
