"""Proximal policy optimisation with the clipped surrogate (Schulman et al. 2017).

Per iteration: GAE(lambda) advantages on the workers, then ``num_sgd_iter`` epochs of
``sgd_minibatch_size`` minibatches of: clipped surrogate + vf_coeff * value loss
- entropy_coeff * entropy (+ kl_coeff * KL(old || new) when the KL penalty is on). The KL
coefficient is the policy's learner state (``KLState``), adapted after every learn step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrun.algos.algorithm import COLLECTED_COLUMNS, Algorithm, LearnContext, register_algorithm
from rlrun.config.schemas import AlgoConfig, LossConfig
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import add_gae, normalize_advantages
from rlrun.models.distributions import ActionDistribution
from rlrun.policy.policy import LearnerState, LossOutput, Policy, TorchBatch


@dataclass
class PPOConfig(AlgoConfig):
    name: str = "ppo"
    gae_lambda: float = 0.95
    num_sgd_iter: int = 10
    sgd_minibatch_size: int | None = 64


@dataclass
class PPOClipLossConfig(LossConfig):
    name: str = "ppo_clip"
    clip_param: float = 0.2  # epsilon of the clipped ratio
    vf_coeff: float = 0.5
    entropy_coeff: float = 0.0
    vf_clip_param: float | None = None  # clip the value update around vf_preds (None: off)
    normalize_advantages: bool = True  # per minibatch
    kl_coeff: float = 0.0  # initial KL-penalty coefficient; 0 disables the penalty
    kl_target: float = 0.01  # the coefficient adapts toward this KL (x1.5 / x0.5, as RLlib)


@dataclass
class KLState:
    """The adaptive KL-penalty coefficient of one policy (PPO, APPO)."""

    kl_coeff: float = 0.0

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]:
        return {"kl_coeff": self.kl_coeff}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if "kl_coeff" in state:
            self.kl_coeff = float(state["kl_coeff"])

    def adapt(self, kl: float, target: float) -> None:
        """RLlib's rule: x1.5 when the KL is over twice the target, x0.5 when under half of it."""
        if kl > 2.0 * target:
            self.kl_coeff *= 1.5
        elif kl < 0.5 * target:
            self.kl_coeff *= 0.5


def kl_state(policy: Policy) -> LearnerState:
    c = policy.loss_config
    return KLState(c.kl_coeff if isinstance(c, PPOClipLossConfig) else 0.0)


def adapt_kl(policy: Policy, stats: dict[str, float]) -> None:
    """Move the policy's KL coefficient so the KL tracks ``loss.kl_target`` (penalty on only)."""
    state, c = policy.state, policy.loss_config
    if isinstance(state, KLState) and isinstance(c, PPOClipLossConfig) and state.kl_coeff > 0.0 \
            and "train/approx_kl" in stats:
        state.adapt(stats["train/approx_kl"], c.kl_target)


def ppo_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """GAE(lambda) on the time-major fragment."""
    cfg = policy.config_as(PPOConfig)
    return add_gae(fragment, last_values, cfg.gamma, cfg.gae_lambda)


def ppo_learn(policy: Policy, batch: SB, ctx: LearnContext) -> dict[str, float]:
    stats = policy.learn_on_batch(batch)
    adapt_kl(policy, stats)
    return stats


@LOSSES.register(
    "ppo_clip", config=PPOClipLossConfig,
    requires=(SB.OBS, SB.ACTIONS, SB.ACTION_LOGP, SB.ADVANTAGES, SB.VALUE_TARGETS, SB.VF_PREDS,
              SB.ACTION_DIST_INPUTS),
    terms=("policy", "vf", "entropy", "kl"), stats=("approx_kl", "clip_frac", "entropy", "kl_coeff"),
)
def ppo_clip_loss(
    policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch
) -> LossOutput:
    c = policy.loss_config_as(PPOClipLossConfig)
    out = model(batch[SB.OBS])
    dist = dist_class(out.dist_inputs)
    logp = dist.logp(batch[SB.ACTIONS])
    adv = normalize_advantages(batch[SB.ADVANTAGES]) if c.normalize_advantages else batch[SB.ADVANTAGES]
    logratio = logp - batch[SB.ACTION_LOGP]
    ratio = logratio.exp()
    surrogate = torch.min(ratio * adv, ratio.clamp(1.0 - c.clip_param, 1.0 + c.clip_param) * adv)
    policy_loss = -surrogate.mean()

    vf_err = (out.values - batch[SB.VALUE_TARGETS]).pow(2)
    if c.vf_clip_param is not None:
        old = batch[SB.VF_PREDS]
        clipped = old + (out.values - old).clamp(-c.vf_clip_param, c.vf_clip_param)
        vf_err = torch.max(vf_err, (clipped - batch[SB.VALUE_TARGETS]).pow(2))
    vf_loss = 0.5 * vf_err.mean()
    entropy = dist.entropy().mean()
    total = policy_loss + c.vf_coeff * vf_loss - c.entropy_coeff * entropy

    kl_coeff = policy.state.kl_coeff if isinstance(policy.state, KLState) else c.kl_coeff
    kl = torch.zeros(())
    if kl_coeff > 0.0:
        kl = dist_class(batch[SB.ACTION_DIST_INPUTS]).kl(dist).mean()
        total = total + kl_coeff * kl
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - logratio).mean()  # k3 estimator (Schulman's "Approximating KL")
        clip_frac = ((ratio - 1.0).abs() > c.clip_param).float().mean()
    return LossOutput(
        total,
        {"policy": policy_loss, "vf": vf_loss, "entropy": entropy, "kl": kl},
        {"approx_kl": approx_kl, "clip_frac": clip_frac, "entropy": entropy, "kl_coeff": kl_coeff},
    )


PPO = register_algorithm(Algorithm(
    "ppo", PPOConfig, default_loss="ppo_clip", postprocess=ppo_postprocess, make_state=kl_state, learn=ppo_learn,
    provides_columns=(*COLLECTED_COLUMNS, SB.ADVANTAGES, SB.VALUE_TARGETS),
    recurrent=True, description="PPO, clipped surrogate, optional adaptive KL penalty",
))
