"""Action distributions: thin, validation-free wrappers over a model's output tensor.

A distribution class knows how many model outputs it needs for an action space
(``required_inputs``) and is built per forward pass from those outputs (``dist_inputs``).
We avoid ``torch.distributions`` in the hot path: its argument checks cost more than the math here.
"""

from __future__ import annotations

import math
from typing import ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rlrun.core.registry import DISTRIBUTIONS, MODELS

SpaceT = TypeVar("SpaceT", bound=gym.Space)


class ActionDistribution:
    """Interface. ``inputs``: ``[B, required_inputs(space)]`` tensor from the model."""

    name: ClassVar[str] = "base"
    # True: actions come out in [-1, 1] per dimension, and whoever acts scales them to the Box's bounds
    unit_actions: ClassVar[bool] = False

    def __init__(self, inputs: torch.Tensor) -> None:
        self.inputs = inputs

    @staticmethod
    def required_inputs(action_space: gym.Space) -> int:
        raise NotImplementedError

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        raise NotImplementedError

    def deterministic_sample(self) -> torch.Tensor:
        raise NotImplementedError

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self) -> torch.Tensor:
        raise NotImplementedError

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        raise NotImplementedError


def _space(action_space: gym.Space, kind: type[SpaceT], name: str) -> SpaceT:
    """``action_space`` if a ``kind``, else a ValueError (``models.check`` turns it into one line)."""
    if not isinstance(action_space, kind):
        raise ValueError(f"{name} acts in a {kind.__name__} action space, not {action_space}")
    return action_space


@DISTRIBUTIONS.register("categorical")
class Categorical(ActionDistribution):
    """Categorical over ``n`` discrete actions; inputs are unnormalised logits ``[B, n]``."""

    name = "categorical"

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.log_probs = F.log_softmax(inputs, dim=-1)

    @staticmethod
    def required_inputs(action_space: gym.Space) -> int:
        return int(_space(action_space, gym.spaces.Discrete, "categorical").n)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        # Gumbel-max: argmax(logits + Gumbel noise) is an exact sample, one kernel, no CPU sync.
        u = torch.rand(self.log_probs.shape, generator=generator).clamp_(1e-20, 1.0)
        return torch.argmax(self.log_probs - torch.log(-torch.log(u)), dim=-1)

    def deterministic_sample(self) -> torch.Tensor:
        return torch.argmax(self.log_probs, dim=-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return self.log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        assert isinstance(other, Categorical)
        return (self.log_probs.exp() * (self.log_probs - other.log_probs)).sum(-1)


@DISTRIBUTIONS.register("diag_gaussian")
class DiagGaussian(ActionDistribution):
    """Diagonal Gaussian; inputs are ``[B, 2 * action_dim]`` = means, then log standard deviations."""

    name = "diag_gaussian"

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.mean, self.log_std = torch.chunk(inputs, 2, dim=-1)
        self.std = self.log_std.exp()

    @staticmethod
    def required_inputs(action_space: gym.Space) -> int:
        return 2 * int(np.prod(_space(action_space, gym.spaces.Box, "diag_gaussian").shape))

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(self.mean.shape, generator=generator)
        return self.mean + self.std * noise

    def deterministic_sample(self) -> torch.Tensor:
        return self.mean

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        assert isinstance(other, DiagGaussian)
        return (
            other.log_std
            - self.log_std
            + (self.std.pow(2) + (self.mean - other.mean).pow(2)) / (2.0 * other.std.pow(2))
            - 0.5
        ).sum(-1)


@DISTRIBUTIONS.register("squashed_gaussian")
class SquashedGaussian(ActionDistribution):
    """tanh of a diagonal Gaussian (SAC): actions in [-1, 1] per dimension, which the algorithm scales
    to the action space's bounds. Inputs are ``[B, 2 * action_dim]`` = means, then log standard
    deviations (clamped to [-20, 2]). ``logp`` includes the tanh correction."""

    name = "squashed_gaussian"
    unit_actions = True
    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
    TANH_EPS = 1e-6

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.mean, log_std = torch.chunk(inputs, 2, dim=-1)
        self.log_std = log_std.clamp(self.LOG_STD_MIN, self.LOG_STD_MAX)
        self.std = self.log_std.exp()

    @staticmethod
    def required_inputs(action_space: gym.Space) -> int:
        return 2 * int(np.prod(_space(action_space, gym.spaces.Box, "squashed_gaussian").shape))

    def sample_logp(self, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample (gradients flow to the inputs) and its log-probability."""
        a, logp, _ = self.sample_logp_noise(generator)
        return a, logp

    def sample_logp_noise(self, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``sample_logp``'s sample and log-probability, and the standard normal noise it drew (or
        was given: ``noise``, of the means' shape)."""
        if noise is None:
            noise = torch.randn(self.mean.shape, generator=generator)
        u = self.mean + self.std * noise
        a = torch.tanh(u)
        return a, self._logp(noise, a), noise

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.sample_logp(generator)[0]

    def deterministic_sample(self) -> torch.Tensor:
        return torch.tanh(self.mean)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        a = actions.clamp(-1.0 + 1e-6, 1.0 - 1e-6)
        u = torch.atanh(a)
        return self._logp((u - self.mean) / self.std, a)

    def _logp(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """log pi(a) for the standardised pre-squash value ``z = (u - mean) / std`` and ``a = tanh(u)``:
        log N(u) - sum log(1 - a^2 + 1e-6). The tanh correction as SB3, RLlib and CleanRL write it (Tianshou:
        float32's epsilon): where an action saturates (|u| > ~7) it stops at log(1e-6) and passes no gradient;
        the exact 2 (log 2 - u - softplus(-2u)) kept pulling u back there, and learned less on HalfCheetah-v5
        (experiments/continuous_control)."""
        logp = (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return logp - torch.log(1.0 - a.pow(2) + self.TANH_EPS).sum(-1)


@DISTRIBUTIONS.register("deterministic")
class Deterministic(ActionDistribution):
    """A deterministic policy (TD3, DDPG): the action is tanh of the inputs, in [-1, 1] per dimension,
    which the algorithm scales to the bounds; exploration noise is the algorithm's (``algo.*_noise``)."""

    name = "deterministic"
    unit_actions = True

    @staticmethod
    def required_inputs(action_space: gym.Space) -> int:
        return int(np.prod(_space(action_space, gym.spaces.Box, "deterministic").shape))

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.tanh(self.inputs)

    def deterministic_sample(self) -> torch.Tensor:
        return torch.tanh(self.inputs)


def default_distribution(action_space: gym.Space) -> str:
    """The registry name of the distribution rlrun uses for ``action_space`` by default."""
    if isinstance(action_space, gym.spaces.Discrete):
        return "categorical"
    if isinstance(action_space, gym.spaces.Box):
        return "diag_gaussian"
    raise ValueError(
        f"no default action distribution for action space {action_space}; "
        f"register one and set model.action_dist (known: {', '.join(DISTRIBUTIONS.names())})"
    )


def model_distribution(model_cfg: object, action_space: gym.Space) -> str:
    """The distribution a model config acts with: ``model.action_dist``; when null, the model's own default
    for the space (its MODELS entry's ``action_dists``, e.g. ``twin_q_mlp``: squashed_gaussian on a Box,
    categorical on a Discrete), else ``default_distribution``."""
    name = getattr(model_cfg, "action_dist", None)
    if name:
        return str(name)
    model = getattr(model_cfg, "name", None)
    if isinstance(model, str) and model in MODELS:
        for kind, dist in MODELS.entry(model).info.get("action_dists", {}).items():
            if isinstance(action_space, kind):
                return str(dist)
    return default_distribution(action_space)
