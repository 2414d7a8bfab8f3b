"""``twin_q_cnn``: SAC's (and TD3's) actor and Q-critics on image observations - pixel SAC, as RLlib's SAC on
Atari (``sac/atari-sac.yaml``) and CleanRL's ``sac_atari``.

The same interface as ``twin_q_mlp`` (``rlrun/models/twin_q.py``): ``forward(obs)`` is the actor, ``q`` /
``q_all`` the critics, ``to_unit`` / ``to_env`` the action maps, so the ``sac`` and ``td3`` losses run on it
unchanged (by autograd: the hand-derived gradients are the MLP's). The actor has convolutions of its own (as
RLlib's and CleanRL's); the critics share one convolutional encoder, trained by the critics' loss only, under
a ``CriticStack`` (one ``baddbmm`` per layer for all critics). CleanRL's ``sac_atari`` gives each critic its own
convolutions: one encoder for both is one convolutional pass a critic forward instead of two (SAC-AE's and
DrQ's critics share theirs as well). The target critics are a copy of encoder and stack, Polyak-averaged.
Observations go through ``rlrun/models/cnn.py``'s layouts (``[H, W, C]``, ``[C, H, W]``, ``[H, W]``, frame
stacks; uint8 scaled to [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import torch
from torch import nn

from rlrun.core.registry import MODELS
from rlrun.models.base import ACTIVATIONS, ModelOutput, _init, _mlp
from rlrun.models.cnn import CNNConfig, check_cnn_config, conv_input, conv_torso, images
from rlrun.models.twin_q import ActorCriticGroups, BoxActions, CriticStack, DiscreteActions, check_critics


@dataclass
class TwinQCNNConfig(CNNConfig):
    """The Nature DQN's convolutions and 512 units by default, for the actor and for the critics."""

    name: str = "twin_q_cnn"
    conv_filters: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])
    hiddens: list[int] = field(default_factory=lambda: [512])  # the actor's, after its convolutions
    critic_hiddens: list[int] = field(default_factory=lambda: [512])  # each critic's, after the shared encoder
    num_critics: int = 2
    vf_share_layers: bool = False  # unused
    free_log_std: bool = False  # unused: a squashed Gaussian's log-std is an actor output
    # None: squashed_gaussian on a Box, categorical on a Discrete (SAC); deterministic: TD3, DDPG
    action_dist: str | None = None


def check_twin_q_cnn_config(c: TwinQCNNConfig) -> str | None:
    return check_critics(c) or check_cnn_config(c)


class ConvCritics(nn.Module):
    """One convolutional encoder under ``num`` stacked critics; ``forward(images, actions)`` -> [C, B(, n)]."""

    def __init__(self, encoder: nn.Module, stack: CriticStack) -> None:
        super().__init__()
        self.encoder = encoder
        self.stack = stack

    def forward(self, x: torch.Tensor, actions: torch.Tensor | None = None, detach: bool = False) -> torch.Tensor:
        """``detach``: the weights as constants (the actor's term: gradients reach ``actions`` only)."""
        if detach:
            with torch.no_grad():
                features = self.encoder(x)
        else:
            features = self.encoder(x)
        if actions is not None:
            features = torch.cat([features, actions.reshape(actions.shape[0], -1)], dim=-1)
        return self.stack(features, detach)


class ConvActorAndCritics(ActorCriticGroups):
    """The actor (convolutions, an MLP, a head giving the action distribution's inputs) and ``ConvCritics``
    whose stack takes ``critic_inputs`` more inputs than the encoder's features and gives ``critic_outputs``."""

    def __init__(self, obs_space: gym.Space, num_outputs: int, config: TwinQCNNConfig, critic_inputs: int,
                 critic_outputs: int) -> None:
        super().__init__()
        conv = conv_input(obs_space, config, "twin_q_cnn", "twin_q_mlp")
        self.layout, flat = conv.layout, conv.flat
        act = ACTIVATIONS[config.activation]
        sizes = [flat, *config.hiddens]
        self.actor = nn.Sequential(conv_torso(config, conv), _mlp(sizes, act))
        self.head = _init(nn.Linear(sizes[-1], num_outputs), 0.01)  # near-uniform / near-zero-mean first actions
        stack = CriticStack(config.num_critics, [flat + critic_inputs, *config.critic_hiddens], config.activation,
                            critic_outputs)
        self.critics = ConvCritics(conv_torso(config, conv), stack)

    def images(self, obs: torch.Tensor) -> torch.Tensor:
        return images(obs, self.layout)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        out = self.head(self.actor(self.images(obs)))
        return ModelOutput(out, torch.zeros(out.shape[0]))


class TwinQCNNModel(ConvActorAndCritics, BoxActions):
    """``twin_q_cnn`` on a Box action space: critics over (encoded image, action in [-1, 1])."""

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Box, num_outputs: int,
                 config: TwinQCNNConfig) -> None:
        super().__init__(obs_space, num_outputs, config, int(torch.Size(action_space.shape).numel()), 1)
        self._register_bounds(action_space, "twin_q_cnn")

    def q(self, obs: torch.Tensor, actions: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """Every critic's Q(obs, actions) ``[C, B]``; ``actions`` in [-1, 1] (``to_unit``)."""
        return self.critics(self.images(obs), actions, detach)


class DiscreteTwinQCNNModel(ConvActorAndCritics, DiscreteActions):
    """``twin_q_cnn`` on a Discrete action space: the actor's logits, critics of one Q-value per action."""

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Discrete, num_outputs: int,
                 config: TwinQCNNConfig) -> None:
        super().__init__(obs_space, num_outputs, config, 0, int(action_space.n))

    def q_all(self, obs: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """Every critic's Q-value of every action ``[C, B, n]``."""
        return self.critics(self.images(obs), None, detach)


@MODELS.register("twin_q_cnn", config=TwinQCNNConfig, validate=check_twin_q_cnn_config,
                 action_dists={gym.spaces.Box: "squashed_gaussian", gym.spaces.Discrete: "categorical"})
def twin_q_cnn(obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: TwinQCNNConfig) -> nn.Module:
    """A ``DiscreteTwinQCNNModel`` for a Discrete action space, a ``TwinQCNNModel`` for a Box one."""
    if isinstance(action_space, gym.spaces.Discrete):
        return DiscreteTwinQCNNModel(obs_space, action_space, num_outputs, config)
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"twin_q_cnn needs a Box or Discrete action space, got {action_space}")
    return TwinQCNNModel(obs_space, action_space, num_outputs, config)
