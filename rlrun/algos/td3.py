"""TD3 (Fujimoto et al. 2018): clipped double Q, target policy smoothing, delayed actor and target
updates; a deterministic tanh actor explores with Gaussian noise. DDPG (Lillicrap et al. 2016) is its
plain case, by config: ``model.num_critics: 1``, ``algo.policy_delay: 1``, ``algo.target_noise: 0``
(the ``ddpg`` algo file sets them).

An update is its loss in two stages (``rlrun.policy.loss.StagedLoss``), the order of the TD3 authors' code,
Stable-Baselines3's and CleanRL's: the critic term and a step of the critics, then - every ``policy_delay``-th
update - the actor term on the stepped critics, a step of the actor and a Polyak step of the targets
(RLlib's DDPG/TD3 takes both terms before either step).

Replay, targets, grouped optimizers and the update loop are SAC's (``rlrun/algos/sac.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlrun.algos.algorithm import Algorithm, register_algorithm
from rlrun.algos.sac import (
    OFF_POLICY_COLUMNS,
    REPLAY_COLUMNS,
    ActorCriticState,
    OffPolicyConfig,
    _critic_targets,
    _env_actions,
    actor_critic_learn,
    actor_critic_problem,
    actor_critic_state,
    off_policy_postprocess,
    polyak,
    random_actions,
)
from rlrun.config.schemas import LossConfig
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.distributions import ActionDistribution
from rlrun.models.td3_grad import TD3Grad
from rlrun.policy.loss import GradientFn, Stage, StagedLoss
from rlrun.policy.policy import ActionOutput, LearnerState, LossOutput, Policy, TorchBatch


@dataclass
class TD3Config(OffPolicyConfig):
    name: str = "td3"
    lr: float = 1e-3
    learning_starts: int = 10_000
    policy_delay: int = 2  # critic updates per actor (and target) update
    target_noise: float = 0.2  # std of the smoothing noise on the target action ([-1, 1] scale); 0: none
    target_noise_clip: float = 0.5
    exploration_noise: float = 0.1  # std of the Gaussian noise on the acting action ([-1, 1] scale)
    hand_gradient: bool = True  # the td3 loss's gradient on the built-in twin_q_mlp derived by hand (no autograd)


def td3_state(policy: Policy) -> LearnerState:
    return actor_critic_state(policy, learned_alpha=False)


def td3_actions(policy: Policy, obs: np.ndarray, explore: bool) -> ActionOutput:
    """tanh(actor(obs)) plus clipped Gaussian noise when exploring, scaled to the bounds."""
    cfg = policy.config_as(TD3Config)
    if explore and policy.global_timestep < cfg.learning_starts:
        return random_actions(policy, len(obs))
    with torch.inference_mode():
        di = policy.model(torch.as_tensor(obs)).dist_inputs.numpy()
    a = np.tanh(di)
    if explore and cfg.exploration_noise > 0:
        a = np.clip(a + cfg.exploration_noise * policy.np_rng.standard_normal(a.shape, dtype=np.float32), -1.0, 1.0)
    return _env_actions(policy, a, di)


@dataclass
class TD3LossConfig(LossConfig):
    name: str = "td3"
    huber_delta: float | None = None  # the critic's TD error through a Huber loss of this delta (None: squared)
    l2_reg: float = 0.0  # + l2_reg * sum(w^2)/2 over the actor's and critics' weights (RLlib DDPG's l2_reg)


def td3_critic_loss(policy: Policy, model: nn.Module, dist_class: type[ActionDistribution],
                    batch: TorchBatch) -> LossOutput:
    """sum_i mean_b (Q_i(s, a) - [R_n + gamma^n min_i Q'_i(s', clip(pi'(s') + clip(noise)))])^2 (or Huber)."""
    cfg = policy.config_as(TD3Config)
    m: Any = model
    target_model: Any = policy.state_as(ActorCriticState).target_model
    with torch.no_grad():
        next_obs = batch[SB.NSTEP_NEXT_OBS]
        a2 = torch.tanh(target_model(next_obs).dist_inputs)
        if cfg.target_noise > 0:
            noise = torch.randn(a2.shape, generator=policy.generator) * cfg.target_noise
            a2 = (a2 + noise.clamp(-cfg.target_noise_clip, cfg.target_noise_clip)).clamp(-1.0, 1.0)
        target = batch[SB.NSTEP_REWARDS] + batch[SB.NSTEP_DISCOUNT] * target_model.q(next_obs, a2).min(0).values
    q = m.q(batch[SB.OBS], m.to_unit(batch[SB.ACTIONS]))
    lc = policy.loss_config_as(TD3LossConfig)
    td = q - target
    if lc.huber_delta is None:
        critic = td.pow(2).mean(-1).sum()
    else:  # RLlib DDPG's use_huber: its huber_loss(x, delta), summed over the critics
        critic = F.huber_loss(td, torch.zeros_like(td), delta=lc.huber_delta, reduction="none").mean(-1).sum()
    if lc.l2_reg:
        critic = critic + lc.l2_reg * _l2(m.critics.named_parameters())
    return LossOutput(critic, {"critic": critic}, {"q_mean": q.detach().mean(), "target_mean": target.mean()})


def td3_actor_loss(policy: Policy, model: nn.Module, dist_class: type[ActionDistribution],
                   batch: TorchBatch) -> LossOutput:
    """-mean_b Q_1(s, pi(s)), the critics held fixed (after their step, in ``td3_loss``)."""
    m: Any = model
    obs = batch[SB.OBS]
    actor = -m.q(obs, torch.tanh(model(obs).dist_inputs), detach=True)[0].mean()
    l2_reg = policy.loss_config_as(TD3LossConfig).l2_reg
    if l2_reg:
        actor = actor + l2_reg * _l2([*m.actor.named_parameters(), *m.head.named_parameters()])
    return LossOutput(actor, {"actor": actor})


def actor_due(policy: Policy) -> bool:
    """Whether this update moves the actor: every ``policy_delay``-th, from the first."""
    return policy.state_as(ActorCriticState).num_updates % policy.config_as(TD3Config).policy_delay == 0


td3_loss = StagedLoss(
    Stage(td3_critic_loss, ("critic",)), Stage(td3_actor_loss, ("actor",), when=actor_due),
    doc="TD3's loss in two stages: the critics' (stepped first), then, every policy_delay-th update, the actor's "
        "on the stepped critics.",
)
LOSSES.add("td3", td3_loss, config=TD3LossConfig, requires=REPLAY_COLUMNS, terms=("critic", "actor"),
           stats=("q_mean", "target_mean"))


def td3_hand_gradient(policy: Policy) -> tuple[GradientFn, GradientFn] | None:
    """The ``td3`` loss on the built-in ``twin_q_mlp``, each stage's gradient derived by hand
    (rlrun/models/td3_grad.py): the same losses, draws and statistics, no autograd graph. None (autograd)
    for another loss or model, the Huber critic or ``l2_reg``, or with ``algo.hand_gradient: false``."""
    cfg, st = policy.config_as(TD3Config), policy.state_as(ActorCriticState)
    if not cfg.hand_gradient or policy.loss_fn is not td3_loss or not TD3Grad.supports(policy.model, st.target_model):
        return None
    lc = policy.loss_config_as(TD3LossConfig)
    if lc.huber_delta is not None or lc.l2_reg:
        return None
    grad = TD3Grad(policy.model, st.target_model)

    def critic_gradient(batch: TorchBatch) -> LossOutput:
        s = grad.critic_gradient(batch, REPLAY_COLUMNS, cfg.target_noise, cfg.target_noise_clip, policy.generator)
        return LossOutput(s.critic, {"critic": s.critic}, {"q_mean": s.q_mean, "target_mean": s.target_mean})

    def actor_gradient(batch: TorchBatch) -> LossOutput:
        actor = grad.actor_gradient(batch[SB.OBS])
        return LossOutput(actor, {"actor": actor})

    return critic_gradient, actor_gradient


def _l2(named: Any) -> torch.Tensor:
    """sum(w^2)/2 over the weights, biases excluded (RLlib's l2_reg)."""
    return sum((p.pow(2).sum() / 2 for name, p in named if "bias" not in name), torch.zeros(()))


def td3_after_update(policy: Policy, state: ActorCriticState) -> None:
    """After each actor update (every ``policy_delay``-th): Polyak steps of the target actor and critics."""
    cfg = policy.config_as(TD3Config)
    if (state.num_updates - 1) % cfg.policy_delay == 0:  # the update just taken moved the actor
        polyak(*state.polyak_pair("actor_critics", lambda: _td3_targets(policy, state)), cfg.tau)


def _td3_targets(policy: Policy, state: ActorCriticState) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model: Any = policy.model
    target: Any = state.target_model
    t_critic, o_critic = _critic_targets(state, model)
    t_actor = [*target.actor.parameters(), *target.head.parameters()]
    return [*t_actor, *t_critic], [*(p.detach() for p in model.actor_parameters()), *o_critic]


TD3 = register_algorithm(Algorithm(
    "td3", TD3Config, default_loss="td3", postprocess=off_policy_postprocess, compute_actions=td3_actions,
    make_state=td3_state, learn=actor_critic_learn(td3_after_update), needs_next_obs=True, bootstrap_values=False,
    hand_gradient=td3_hand_gradient,
    provides_columns=OFF_POLICY_COLUMNS, metrics=("train/replay_size", "train/num_updates"),
    description="TD3 (and DDPG by config): deterministic actor, clipped double Q, delayed updates",
    action_spaces=(gym.spaces.Box,), action_dists=("deterministic",), check_model=actor_critic_problem,
    default_model="twin_q_mlp",
))
