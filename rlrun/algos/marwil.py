"""MARWIL (Wang et al. 2018, "Exponentially Weighted Imitation Learning for Batched Historical
Data") and behaviour cloning, its beta = 0 case.

    loss = -mean(exp(beta * A / c) * log pi(a|s)) + vf_coeff * 0.5 * mean((V(s) - R)^2)

R is the discounted return of the recorded episode from s on (bootstrapped from V where an episode
was cut or truncated), A = R - V(s), and c^2 a moving average of A^2 (the paper's normaliser; RLlib's
start value 100 and update rate 1e-8 per train batch). BC (``algo=bc``) clones the recorded actions:
no value function, no weights. Both learn from any ``input`` (files or the rollout workers).
"""

from __future__ import annotations

import math
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
from rlrun.data.postprocessing import add_gae
from rlrun.models.distributions import ActionDistribution
from rlrun.policy.policy import LearnerState, LossOutput, Policy, TorchBatch

MAX_EXPONENT = 20.0  # exp(20) ~ 5e8: one outlier advantage cannot overflow the weights to inf


@dataclass
class MARWILConfig(AlgoConfig):
    name: str = "marwil"
    lr: float = 1e-3
    beta: float = 1.0  # 0: behaviour cloning; larger: favour actions with higher advantage
    train_batch_size: int = 2000
    grad_clip: float | None = None
    moving_average_sqd_adv_norm_start: float = 100.0
    moving_average_sqd_adv_norm_update_rate: float = 1e-8


@dataclass
class BCConfig(MARWILConfig):
    name: str = "bc"
    beta: float = 0.0


@dataclass
class MARWILLossConfig(LossConfig):
    name: str = "marwil"
    vf_coeff: float = 1.0  # weight of the value loss (unused when beta = 0)


@dataclass
class MARWILState:
    """The moving average of squared advantages (c^2) of one policy."""

    sqd_adv_norm: float = 100.0

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]:
        return {"sqd_adv_norm": self.sqd_adv_norm}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if "sqd_adv_norm" in state:
            self.sqd_adv_norm = float(state["sqd_adv_norm"])


def marwil_state(policy: Policy) -> LearnerState:
    return MARWILState(policy.config_as(MARWILConfig).moving_average_sqd_adv_norm_start)


def marwil_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """VALUE_TARGETS = the discounted return from each row (GAE with lambda 1 telescopes to it, with
    the bootstrap at truncations and cuts); data without value predictions gets zeros there."""
    if SB.VF_PREDS not in fragment:
        fragment[SB.VF_PREDS] = np.zeros(fragment[SB.REWARDS].shape, dtype=np.float32)
    return add_gae(fragment, last_values, policy.config.gamma, 1.0)


def marwil_learn(policy: Policy, batch: SB, ctx: LearnContext) -> dict[str, float]:
    """Move c^2 toward this batch's mean squared advantage, then SGD on the batch."""
    cfg = policy.config_as(MARWILConfig)
    state = policy.state_as(MARWILState)
    if cfg.beta != 0.0:
        adv = batch[SB.VALUE_TARGETS] - policy.compute_values(batch[SB.OBS])
        rate = cfg.moving_average_sqd_adv_norm_update_rate
        state.sqd_adv_norm += rate * (float(np.mean(np.square(adv, dtype=np.float64))) - state.sqd_adv_norm)
    stats = policy.learn_on_batch(batch)
    stats["train/sqd_adv_norm"] = state.sqd_adv_norm
    return stats


@LOSSES.register(
    "marwil", config=MARWILLossConfig, requires=(SB.OBS, SB.ACTIONS, SB.VALUE_TARGETS),
    terms=("policy", "vf"), stats=("entropy", "weight_mean"),
)
def marwil_loss(
    policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch
) -> LossOutput:
    c = policy.loss_config_as(MARWILLossConfig)
    beta = policy.config_as(MARWILConfig).beta
    out = model(batch[SB.OBS])
    dist = dist_class(out.dist_inputs)
    logp = dist.logp(batch[SB.ACTIONS])
    if beta == 0.0:  # behaviour cloning
        policy_loss, vf_loss, weights = -logp.mean(), torch.zeros(()), torch.ones(())
    else:
        returns = batch[SB.VALUE_TARGETS]
        norm = math.sqrt(policy.state_as(MARWILState).sqd_adv_norm)
        adv = returns - out.values.detach()
        weights = torch.exp((beta * adv / (1e-8 + norm)).clamp(max=MAX_EXPONENT))
        policy_loss = -(weights * logp).mean()
        vf_loss = 0.5 * (out.values - returns).pow(2).mean()
    total = policy_loss + c.vf_coeff * vf_loss
    entropy = dist.entropy().mean().detach()
    return LossOutput(total, {"policy": policy_loss, "vf": vf_loss},
                      {"entropy": entropy, "weight_mean": weights.mean().detach()})


for _name, _cls, _what in (("marwil", MARWILConfig, "MARWIL: advantage-weighted imitation of recorded actions"),
                           ("bc", BCConfig, "behaviour cloning (MARWIL with beta 0)")):
    register_algorithm(Algorithm(
        _name, _cls, default_loss="marwil", postprocess=marwil_postprocess, make_state=marwil_state,
        learn=marwil_learn, provides_columns=(*COLLECTED_COLUMNS, SB.ADVANTAGES, SB.VALUE_TARGETS),
        metrics=("train/sqd_adv_norm",), description=_what,
    ))
