"""Advantage actor-critic, synchronous (A2C; Mnih et al. 2016, the synchronous variant of A3C).

One gradient step per train batch on: -log pi(a|s) * A + vf_coeff * (V - R)^2 / 2 - entropy_coeff * H,
with A from GAE(lambda) (``use_gae``) or n-step returns bootstrapped at the fragment end
(``use_gae: false``; n = rollout_fragment_length).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from rlrun.algos.ppo import ppo_postprocess
from rlrun.batch import SampleBatch as SB
from rlrun.config import AlgoConfig, LossConfig
from rlrun.distributions import ActionDistribution
from rlrun.policy import LossOutput, Policy, TorchBatch
from rlrun.postprocessing import discounted_returns
from rlrun.registry import ALGOS, LOSSES
from rlrun.trainer import COLLECTED_COLUMNS, Trainer
from rlrun.workers import fragment_ends


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
    """GAE(lambda) like PPO, or n-step returns: R_t = r_t + gamma R_{t+1}, bootstrapped with V at a
    truncation or the fragment cut, 0 at a termination."""
    cfg: A2CConfig = policy.config  # type: ignore[assignment]
    if cfg.use_gae:
        return ppo_postprocess(policy, fragment, last_values)
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
    c: A2CLossConfig = policy.loss_config  # type: ignore[assignment]
    out = model(batch[SB.OBS])
    dist = dist_class(out.dist_inputs)
    adv = batch[SB.ADVANTAGES]
    if c.normalize_advantages and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy_loss = -(dist.logp(batch[SB.ACTIONS]) * adv).mean()
    vf_loss = 0.5 * (out.values - batch[SB.VALUE_TARGETS]).pow(2).mean()
    entropy = dist.entropy().mean()
    total = policy_loss + c.vf_coeff * vf_loss - c.entropy_coeff * entropy
    return LossOutput(total, {"policy": policy_loss, "vf": vf_loss, "entropy": entropy}, {"entropy": entropy})


@ALGOS.register("a2c", config=A2CConfig)
class A2CTrainer(Trainer):
    config_cls = A2CConfig
    default_loss = "a2c"
    postprocess_fn = a2c_postprocess
    provides_columns = (*COLLECTED_COLUMNS, SB.ADVANTAGES, SB.VALUE_TARGETS)
