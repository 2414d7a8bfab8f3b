"""SAC's terms on a Discrete action space (Christodoulou 2019, "Soft Actor-Critic for Discrete Action Settings";
RLlib's SAC on Discrete spaces): the policy's probabilities are exact, so expectations over the actions replace
the sampled action of the Box case - in the critics' target, the actor's loss and the temperature's.

The ``sac`` loss and actions (``rlrun/algos/sac.py``) call these when the policy's action space is Discrete; the
model is ``twin_q_mlp``'s ``DiscreteTwinQModel`` (the actor's logits, one Q-value per action and critic). The actor's
term takes the minimum of the critics, as the paper's code and CleanRL's do (RLlib's takes its first critic's); the
critics' loss is SAC's squared error here as on a Box (RLlib's is Huber's), and the update autograd's.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

# The default target entropy: this fraction of the uniform policy's, log(n) (RLlib's 0.98)
TARGET_ENTROPY_SCALE = 0.98


def default_target_entropy(n: int) -> float:
    return TARGET_ENTROPY_SCALE * math.log(n)


def soft_value(logits: torch.Tensor, q_all: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """V(s) = sum_a pi(a|s) (min_i Q_i(s, a) - alpha log pi(a|s)) ``[B]``; ``logits`` [B, n], ``q_all`` [C, B, n]."""
    logp = F.log_softmax(logits, dim=-1)
    return (logp.exp() * (q_all.min(0).values - alpha * logp)).sum(-1)


def actor_terms(logits: torch.Tensor, q_all: torch.Tensor, alpha: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's loss, mean_s sum_a pi(a|s) (alpha log pi(a|s) - min_i Q_i(s, a)) with the critics' values
    ``q_all`` [C, B, n] held fixed, and each row's expected log-probability sum_a pi log pi ``[B]`` (minus its
    entropy: the temperature's term takes it where the Box case takes a sample's log pi)."""
    logp = F.log_softmax(logits, dim=-1)
    probs = logp.exp()
    actor = (probs * (alpha * logp - q_all.min(0).values)).sum(-1).mean()
    return actor, (probs * logp).sum(-1)


def sample_actions(logits: np.ndarray, rng: np.random.Generator, explore: bool) -> np.ndarray:
    """Action indices ``[B]``: a draw from the categorical (Gumbel-max on ``rng``), or the most probable."""
    if not explore:
        return logits.argmax(-1)
    return (logits + rng.gumbel(size=logits.shape)).argmax(-1)
