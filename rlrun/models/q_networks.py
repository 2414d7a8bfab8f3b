"""Q-networks for DQN and its Rainbow parts: ``q_mlp`` (an MLP torso) and ``q_cnn`` (the Nature DQN's
convolutions, for Atari), both under the same heads: dueling or not, expected Q-values or C51's atom
distributions, plain or noisy linear layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.core.registry import MODELS
from rlrun.models.base import (
    _ACT_FNS,
    ACTIVATIONS,
    MLPConfig,
    ModelOutput,
    _init,
    _mlp,
    check_mlp_config,
    linear_layers,
    mlp_forward,
)
from rlrun.models.cnn import CNNConfig, check_cnn_config, conv_input, conv_torso, images
from rlrun.models.noisy import NoisyLinear


@dataclass
class QHeadConfig:
    """What every built-in Q-network's heads take (``q_mlp``, ``q_cnn``)."""

    dueling: bool = False  # Q = V + A - mean(A)
    num_atoms: int = 1  # > 1: distributional Q (C51): probabilities over num_atoms returns from v_min to v_max
    v_min: float = -10.0
    v_max: float = 10.0
    noisy: bool = False  # noisy-net heads (factorised Gaussian noise) explore instead of epsilon-greedy
    sigma0: float = 0.5  # the noisy heads' initial noise scale, over sqrt(fan-in)


@dataclass
class QMLPConfig(MLPConfig, QHeadConfig):
    name: str = "q_mlp"
    hiddens: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    free_log_std: bool = False  # unused: Q-values have no Gaussian head


@dataclass
class QCNNConfig(CNNConfig, QHeadConfig):
    """The Nature DQN's network by default (Mnih et al. 2015): three convolutions, 512 units."""

    name: str = "q_cnn"
    conv_filters: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])
    hiddens: list[int] = field(default_factory=lambda: [512])
    free_log_std: bool = False  # unused: Q-values have no Gaussian head


def check_q_heads(c: QHeadConfig) -> str | None:
    if c.num_atoms < 1:
        return f"num_atoms: must be at least 1 (1: expected Q-values; 51: C51), got {c.num_atoms}"
    if c.num_atoms > 1 and not c.v_min < c.v_max:
        return f"v_min: must be below model.v_max, got v_min={c.v_min}, v_max={c.v_max}"
    if c.noisy and not c.sigma0 > 0:
        return f"sigma0: must be above 0, got {c.sigma0}"
    return None


def check_q_mlp_config(c: QMLPConfig) -> str | None:
    return check_q_heads(c) or check_mlp_config(c)


def check_q_cnn_config(c: QCNNConfig) -> str | None:
    return check_q_heads(c) or check_cnn_config(c)


class QNetwork(nn.Module):
    """Q-network heads over a torso's features: ``dist_inputs`` are Q-values ``[B, num_actions]``,
    ``values`` = max_a Q.

    With ``num_atoms > 1`` the heads give, per action, logits over ``num_atoms`` returns evenly spaced
    from ``v_min`` to ``v_max`` (``support``); ``q_log_probs`` gives their log-probabilities
    ``[B, num_actions, num_atoms]`` and the Q-values are their expectations. With ``noisy`` the
    heads are ``NoisyLinear`` layers: fresh noise in training mode, their means in eval mode."""

    support: torch.Tensor  # buffer [num_atoms]: the returns the atoms stand for

    def _build_heads(self, features: int, num_actions: int, config: QHeadConfig) -> None:
        self.num_actions, self.num_atoms = num_actions, config.num_atoms

        def head(out: int, gain: float) -> nn.Module:
            if config.noisy:
                return NoisyLinear(features, out, config.sigma0)
            return _init(nn.Linear(features, out), gain)

        self.adv_head = head(num_actions * config.num_atoms, 0.01)
        self.v_head = head(config.num_atoms, 1.0) if config.dueling else None
        self.register_buffer("support", torch.linspace(config.v_min, config.v_max, config.num_atoms))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _heads(self, obs: torch.Tensor) -> torch.Tensor:
        """Dueling-combined head outputs ``[B, num_actions, num_atoms]`` (Q-values, or atom logits)."""
        h = self.features(obs)
        adv = self.adv_head(h).reshape(h.shape[0], self.num_actions, self.num_atoms)
        if self.v_head is None:
            return adv
        return self.v_head(h).unsqueeze(1) + adv - adv.mean(dim=1, keepdim=True)

    def q_log_probs(self, obs: torch.Tensor) -> torch.Tensor:
        """Distributional (``num_atoms > 1``): log-probabilities of the atoms ``[B, num_actions, num_atoms]``."""
        return torch.log_softmax(self._heads(obs), dim=-1)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        out = self._heads(obs)
        q = out.squeeze(-1) if self.num_atoms == 1 else (torch.softmax(out, dim=-1) * self.support).sum(-1)
        return ModelOutput(q, q.max(dim=-1).values)


@MODELS.register("q_mlp", config=QMLPConfig, validate=check_q_mlp_config)
class QMLPModel(QNetwork):
    """An MLP torso under the Q heads."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: QMLPConfig) -> None:
        super().__init__()
        sizes = [int(np.prod(obs_space.shape or (1,))), *config.hiddens]
        self.torso = _mlp(sizes, ACTIVATIONS[config.activation])
        self._build_heads(sizes[-1], num_outputs, config)
        self._act = _ACT_FNS[config.activation]
        self._layers = linear_layers(self.torso)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return mlp_forward(self._layers, self._act, obs.reshape(obs.shape[0], -1).float())


@MODELS.register("q_cnn", config=QCNNConfig, validate=check_q_cnn_config)
class QCNNModel(QNetwork):
    """A convolutional torso (rlrun/models/cnn.py's) under the Q heads: DQN on images (Atari)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: QCNNConfig) -> None:
        super().__init__()
        conv = conv_input(obs_space, config, "q_cnn", "q_mlp")
        self.layout, flat = conv.layout, conv.flat
        sizes = [flat, *config.hiddens]
        self.torso = nn.Sequential(conv_torso(config, conv), _mlp(sizes, ACTIVATIONS[config.activation]))
        self._build_heads(sizes[-1], num_outputs, config)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.torso(images(obs, self.layout))
