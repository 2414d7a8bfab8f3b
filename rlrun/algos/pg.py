"""Vanilla policy gradient (REINFORCE; Williams 1992): maximise E[log pi(a|s) * G_t].

G_t is the discounted reward-to-go within the episode, standardised over the train batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from rlrun.batch import SampleBatch as SB
from rlrun.config import AlgoConfig, LossConfig
from rlrun.distributions import ActionDistribution
from rlrun.policy import LossOutput, Policy, TorchBatch
from rlrun.postprocessing import discounted_returns
from rlrun.registry import ALGOS, LOSSES
from rlrun.trainer import COLLECTED_COLUMNS, Trainer
from rlrun.workers import fragment_ends


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
    ends = fragment_ends(fragment)
    # a fragment cut is not an episode end: the return there is unknown, so treat the tail as
    # truncated at the cut (the usual REINFORCE-with-fragments approximation)
    fragment[SB.ADVANTAGES] = discounted_returns(fragment[SB.REWARDS], ends, policy.config.gamma)
    return fragment


@LOSSES.register(
    "pg", config=PGLossConfig, requires=(SB.OBS, SB.ACTIONS, SB.ADVANTAGES),
    terms=("policy", "entropy"), stats=("entropy",),
)
def pg_loss(
    policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch
) -> LossOutput:
    """-mean(log pi(a|s) * A), A = standardised discounted returns."""
    c = policy.loss_config
    out = model(batch[SB.OBS])
    dist = dist_class(out.dist_inputs)
    adv = batch[SB.ADVANTAGES]
    if getattr(c, "normalize_advantages", True) and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy_loss = -(dist.logp(batch[SB.ACTIONS]) * adv).mean()
    entropy = dist.entropy().mean()
    total = policy_loss - getattr(c, "entropy_coeff", 0.0) * entropy
    return LossOutput(total, {"policy": policy_loss, "entropy": entropy}, {"entropy": entropy})


@ALGOS.register("pg", config=PGConfig)
class PGTrainer(Trainer):
    config_cls = PGConfig
    default_loss = "pg"
    postprocess_fn = pg_postprocess
    provides_columns = (*COLLECTED_COLUMNS, SB.ADVANTAGES)
