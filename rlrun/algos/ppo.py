"""Proximal policy optimisation with the clipped surrogate (Schulman et al. 2017).

Per iteration: GAE(lambda) advantages on the workers, then ``num_sgd_iter`` epochs of
``sgd_minibatch_size`` minibatches of: clipped surrogate + vf_coeff * value loss
- entropy_coeff * entropy (+ kl_coeff * KL(old || new) when the KL penalty is on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrun.batch import SampleBatch as SB
from rlrun.config import AlgoConfig, LossConfig
from rlrun.distributions import ActionDistribution
from rlrun.policy import LossOutput, Policy, TorchBatch
from rlrun.postprocessing import compute_gae
from rlrun.registry import ALGOS, LOSSES
from rlrun.trainer import COLLECTED_COLUMNS, Trainer
from rlrun.workers import fragment_ends


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


def ppo_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """GAE on the time-major fragment. ``next_values`` is the next row's V(s); at a truncation that
    row is the dummy autoreset step, whose V was computed on the final observation."""
    values = fragment[SB.VF_PREDS]
    next_values = np.concatenate([values[1:], last_values[None]], axis=0)
    res = compute_gae(
        fragment[SB.REWARDS], values, next_values, fragment[SB.TERMINATEDS], fragment_ends(fragment),
        policy.config.gamma, policy.config.gae_lambda,  # type: ignore[attr-defined]
    )
    fragment[SB.ADVANTAGES] = res.advantages
    fragment[SB.VALUE_TARGETS] = res.value_targets
    return fragment


@LOSSES.register(
    "ppo_clip", config=PPOClipLossConfig,
    requires=(SB.OBS, SB.ACTIONS, SB.ACTION_LOGP, SB.ADVANTAGES, SB.VALUE_TARGETS, SB.VF_PREDS,
              SB.ACTION_DIST_INPUTS),
    terms=("policy", "vf", "entropy", "kl"), stats=("approx_kl", "clip_frac", "entropy", "kl_coeff"),
)
def ppo_clip_loss(
    policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch
) -> LossOutput:
    c: PPOClipLossConfig = policy.loss_config  # type: ignore[assignment]
    out = model(batch[SB.OBS])
    dist = dist_class(out.dist_inputs)
    logp = dist.logp(batch[SB.ACTIONS])
    adv = batch[SB.ADVANTAGES]
    if c.normalize_advantages and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
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

    kl_coeff = float(getattr(policy, "kl_coeff", c.kl_coeff))
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


@ALGOS.register("ppo", config=PPOConfig)
class PPOTrainer(Trainer):
    config_cls = PPOConfig
    default_loss = "ppo_clip"
    postprocess_fn = ppo_postprocess
    provides_columns = (*COLLECTED_COLUMNS, SB.ADVANTAGES, SB.VALUE_TARGETS)

    def setup(self) -> None:
        self.policy.kl_coeff = float(getattr(self.cfg.loss, "kl_coeff", 0.0))  # type: ignore[attr-defined]

    def extra_state(self) -> dict[str, Any]:
        return {"kl_coeff": float(getattr(self.policy, "kl_coeff", 0.0))}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if "kl_coeff" in state:
            self.policy.kl_coeff = float(state["kl_coeff"])  # type: ignore[attr-defined]

    def after_learn(self, stats: dict[str, float]) -> None:
        """Adaptive KL penalty (RLlib's PPO): move kl_coeff so the KL tracks kl_target."""
        coeff = float(getattr(self.policy, "kl_coeff", 0.0))
        if coeff <= 0.0 or "train/approx_kl" not in stats:
            return
        target = float(getattr(self.cfg.loss, "kl_target", 0.01))
        kl = stats["train/approx_kl"]
        if kl > 2.0 * target:
            coeff *= 1.5
        elif kl < 0.5 * target:
            coeff *= 0.5
        self.policy.kl_coeff = coeff  # type: ignore[attr-defined]
