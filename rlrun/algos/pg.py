"""Vanilla policy gradient (REINFORCE; Williams 1992): maximise E[log pi(a|s) * G_t].

G_t is the discounted reward-to-go within the episode, standardised over the train batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from rlrun.algos.algorithm import COLLECTED_COLUMNS, Algorithm, register_algorithm
from rlrun.config.schemas import AlgoConfig, LossConfig
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import discounted_returns, fragment_ends, normalize_advantages
from rlrun.models.distributions import ActionDistribution
from rlrun.policy.policy import LossOutput, Policy, TorchBatch


@dataclass
class PGConfig(AlgoConfig):
    name: str = "pg"
    lr: float = 4e-3
    grad_clip: float | None = None


@dataclass
class PGLossConfig(LossConfig):
    name: str = "pg"
    normalize_advantages: bool = True  # standardise returns over the batch (a constant baseline)
    entropy_coeff: float = 0.0


def pg_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """ADVANTAGES = discounted reward-to-go; no critic, so truncations are not bootstrapped."""
    # a fragment cut is not an episode end: the return there is unknown, so treat the tail as
    # truncated at the cut (the usual REINFORCE-with-fragments approximation)
    fragment[SB.ADVANTAGES] = discounted_returns(fragment[SB.REWARDS], fragment_ends(fragment), policy.config.gamma)
    return fragment


@LOSSES.register(
    "pg", config=PGLossConfig, requires=(SB.OBS, SB.ACTIONS, SB.ADVANTAGES),
    terms=("policy", "entropy"), stats=("entropy",),
)
def pg_loss(
    policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch
) -> LossOutput:
    """-mean(log pi(a|s) * A), A = standardised discounted returns."""
    c = policy.loss_config_as(PGLossConfig)
    out = model(batch[SB.OBS])
    dist = dist_class(out.dist_inputs)
    adv = normalize_advantages(batch[SB.ADVANTAGES]) if c.normalize_advantages else batch[SB.ADVANTAGES]
    policy_loss = -(dist.logp(batch[SB.ACTIONS]) * adv).mean()
    entropy = dist.entropy().mean()
    total = policy_loss - c.entropy_coeff * entropy
    return LossOutput(total, {"policy": policy_loss, "entropy": entropy}, {"entropy": entropy})


PG = register_algorithm(Algorithm(
    "pg", PGConfig, default_loss="pg", postprocess=pg_postprocess,
    provides_columns=(*COLLECTED_COLUMNS, SB.ADVANTAGES),
    recurrent=True, description="REINFORCE with batch-standardised returns",
))
