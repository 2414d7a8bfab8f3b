"""Advantage actor-critic, synchronous (A2C; Mnih et al. 2016, the synchronous variant of A3C).

One gradient step per train batch on: -log pi(a|s) * A + vf_coeff * (V - R)^2 / 2 - entropy_coeff * H,
with A from GAE(lambda) (``use_gae``) or n-step returns bootstrapped at the fragment end
(``use_gae: false``; n = rollout_fragment_length).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from rlrun.algos.algorithm import COLLECTED_COLUMNS, Algorithm, register_algorithm
from rlrun.config.schemas import AlgoConfig, LossConfig
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import add_gae, discounted_returns, fragment_ends, normalize_advantages
from rlrun.models.distributions import ActionDistribution
from rlrun.policy.policy import LossOutput, Policy, TorchBatch


@dataclass
class A2CConfig(AlgoConfig):
    name: str = "a2c"
    lr: float = 1e-3
    gamma: float = 0.99
    use_gae: bool = True  # False: n-step returns (n = fragment length), bootstrapped from V
    gae_lambda: float = 0.95
    num_sgd_iter: int = 1
    sgd_minibatch_size: int | None = None  # one step on the whole batch


@dataclass
class A2CLossConfig(LossConfig):
    name: str = "a2c"
    vf_coeff: float = 0.5
    entropy_coeff: float = 0.01
    normalize_advantages: bool = False


def a2c_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """GAE(lambda), or n-step returns: R_t = r_t + gamma R_{t+1}, bootstrapped with V at a
    truncation or the fragment cut, 0 at a termination."""
    cfg = policy.config_as(A2CConfig)
    if cfg.use_gae:
        return add_gae(fragment, last_values, cfg.gamma, cfg.gae_lambda)
    values = fragment[SB.VF_PREDS]
    next_values = np.concatenate([values[1:], last_values[None]], axis=0)
    ends = fragment_ends(fragment)
    boot = np.where(fragment[SB.TERMINATEDS], 0.0, next_values).astype(np.float32)
    returns = discounted_returns(fragment[SB.REWARDS], ends, cfg.gamma, bootstrap=boot)
    fragment[SB.VALUE_TARGETS] = returns
    fragment[SB.ADVANTAGES] = (returns - values).astype(np.float32)
    return fragment


@LOSSES.register(
    "a2c", config=A2CLossConfig, requires=(SB.OBS, SB.ACTIONS, SB.ADVANTAGES, SB.VALUE_TARGETS),
    terms=("policy", "vf", "entropy"), stats=("entropy",),
)
def a2c_loss(policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch) -> LossOutput:
    c = policy.loss_config_as(A2CLossConfig)
    out = model(batch[SB.OBS])
    dist = dist_class(out.dist_inputs)
    adv = normalize_advantages(batch[SB.ADVANTAGES]) if c.normalize_advantages else batch[SB.ADVANTAGES]
    policy_loss = -(dist.logp(batch[SB.ACTIONS]) * adv).mean()
    vf_loss = 0.5 * (out.values - batch[SB.VALUE_TARGETS]).pow(2).mean()
    entropy = dist.entropy().mean()
    total = policy_loss + c.vf_coeff * vf_loss - c.entropy_coeff * entropy
    return LossOutput(total, {"policy": policy_loss, "vf": vf_loss, "entropy": entropy}, {"entropy": entropy})


A2C = register_algorithm(Algorithm(
    "a2c", A2CConfig, default_loss="a2c", postprocess=a2c_postprocess,
    provides_columns=(*COLLECTED_COLUMNS, SB.ADVANTAGES, SB.VALUE_TARGETS),
    recurrent=True, description="synchronous advantage actor-critic",
))
