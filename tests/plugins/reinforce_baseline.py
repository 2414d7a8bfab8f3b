"""REINFORCE with a learned state-value baseline (Williams 1992; Sutton & Barto 2018, sec. 13.4),
written as a user would: one module outside rlrun (config + loss + postprocess + one registration)
and one YAML file (tests/plugins/conf/algo/reinforce_bl.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from rlrun import (
    COLLECTED_COLUMNS,
    LOSSES,
    ActionDistribution,
    AlgoConfig,
    Algorithm,
    LossConfig,
    LossOutput,
    Policy,
    TorchBatch,
    discounted_returns,
    fragment_ends,
    normalize_advantages,
    register_algorithm,
)
from rlrun import SampleBatch as SB


@dataclass
class ReinforceBLConfig(AlgoConfig):
    name: str = "reinforce_bl"
    lr: float = 3e-3
    grad_clip: float | None = None


@dataclass
class ReinforceBLLossConfig(LossConfig):
    name: str = "reinforce_bl"
    vf_coeff: float = 0.5


def returns_to_go(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """VALUE_TARGETS = G_t, the discounted reward-to-go within the episode (or fragment)."""
    fragment[SB.VALUE_TARGETS] = discounted_returns(fragment[SB.REWARDS], fragment_ends(fragment),
                                                    policy.config.gamma)
    return fragment


@LOSSES.register("reinforce_bl", config=ReinforceBLLossConfig, requires=(SB.OBS, SB.ACTIONS, SB.VALUE_TARGETS),
                 terms=("policy", "vf"))
def reinforce_bl_loss(policy: Policy, model: nn.Module, dist_class: type[ActionDistribution],
                      batch: TorchBatch) -> LossOutput:
    """-log pi(a|s) (G - V(s)) with V fitted to G; the baseline reduces variance, not the bias."""
    c = policy.loss_config_as(ReinforceBLLossConfig)
    out = model(batch[SB.OBS])
    adv = normalize_advantages(batch[SB.VALUE_TARGETS] - out.values.detach())
    policy_loss = -(dist_class(out.dist_inputs).logp(batch[SB.ACTIONS]) * adv).mean()
    vf_loss = 0.5 * (out.values - batch[SB.VALUE_TARGETS]).pow(2).mean()
    return LossOutput(policy_loss + c.vf_coeff * vf_loss, {"policy": policy_loss, "vf": vf_loss})


register_algorithm(Algorithm(
    "reinforce_bl", ReinforceBLConfig, default_loss="reinforce_bl", postprocess=returns_to_go,
    provides_columns=(*COLLECTED_COLUMNS, SB.VALUE_TARGETS),
))
