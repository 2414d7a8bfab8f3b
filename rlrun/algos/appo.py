"""Asynchronous PPO (APPO, as in RLlib): IMPALA's actor-learner split with PPO's clipped surrogate.

Every remote worker always has a sample request in flight; the learner trains on whatever
fragments have arrived, which may come from older weights. V-trace (Espeholt et al. 2018) corrects
for that: value targets ``vs`` and policy-gradient advantages are computed on the learner with the
current value function and importance ratios pi/mu against the behaviour policy mu that sampled
each row. The surrogate is PPO's, clipped around the same ratio, with PPO's adaptive KL penalty
when ``loss.kl_coeff > 0``. A worker gets new weights when every ``broadcast_interval``-th of its
fragments is collected. With ``num_workers: 0`` sampling is synchronous and V-trace reduces to
on-policy returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlrun.algos.algorithm import COLLECTED_COLUMNS, Algorithm, LearnContext, register_algorithm
from rlrun.algos.ppo import PPOConfig, adapt_kl, kl_state
from rlrun.config.schemas import AlgoConfig
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import fragment_ends, vtrace
from rlrun.policy.policy import Policy


@dataclass
class APPOConfig(PPOConfig):
    name: str = "appo"
    lr: float = 5e-4
    train_batch_size: int = 512
    num_sgd_iter: int = 1
    sgd_minibatch_size: int | None = None
    vtrace_clip_rho: float = 1.0  # rho-bar: truncation of the importance weights in the targets
    vtrace_clip_c: float = 1.0  # c-bar: truncation of the trace-cutting coefficients
    broadcast_interval: int = 1  # fragments collected from a worker between weight pushes to it


def appo_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """Mark where each trajectory segment stops; V-trace itself runs on the learner."""
    fragment[SB.ENDS] = fragment_ends(fragment)
    return fragment


def add_vtrace(policy: Policy, batch: SB) -> np.ndarray:
    """ADVANTAGES, VALUE_TARGETS and VF_PREDS from V-trace with the current model; returns rho [N]."""
    cfg = policy.config_as(APPOConfig)
    model, dist_class = policy.model, policy.dist_class
    with torch.no_grad():
        out = model(torch.from_numpy(batch[SB.OBS]))
        next_values = model(torch.from_numpy(batch[SB.NEXT_OBS])).values.numpy()
        target_logp = dist_class(out.dist_inputs).logp(torch.from_numpy(batch[SB.ACTIONS])).numpy()
    values = out.values.numpy()
    ends = batch[SB.ENDS]
    next_v = np.where(ends, next_values, np.r_[values[1:], 0.0]).astype(np.float32)
    res = vtrace(batch[SB.ACTION_LOGP], target_logp, batch[SB.REWARDS], values, next_v, batch[SB.TERMINATEDS],
                 ends, cfg.gamma, cfg.vtrace_clip_rho, cfg.vtrace_clip_c)
    batch[SB.ADVANTAGES] = res.pg_advantages
    batch[SB.VALUE_TARGETS] = res.vs
    batch[SB.VF_PREDS] = values.astype(np.float32)
    rho: np.ndarray = np.exp(target_logp - batch[SB.ACTION_LOGP])
    return rho


def appo_learn(policy: Policy, batch: SB, ctx: LearnContext) -> dict[str, float]:
    rho = add_vtrace(policy, batch)
    stats = policy.learn_on_batch(batch)
    adapt_kl(policy, stats)
    stats["train/mean_rho"] = float(rho.mean())
    stats["train/stale_fraction"] = float(np.mean(np.abs(rho - 1.0) > 1e-4))
    return stats


def broadcast_interval(config: AlgoConfig) -> int:
    return config.broadcast_interval if isinstance(config, APPOConfig) else 1


APPO = register_algorithm(Algorithm(
    "appo", APPOConfig, default_loss="ppo_clip", postprocess=appo_postprocess, make_state=kl_state,
    learn=appo_learn, async_broadcast_interval=broadcast_interval, needs_next_obs=True,
    provides_columns=(*COLLECTED_COLUMNS, SB.NEXT_OBS, SB.ENDS, SB.ADVANTAGES, SB.VALUE_TARGETS),
    metrics=("train/mean_rho", "train/stale_fraction"),
    description="asynchronous PPO with V-trace",
))
