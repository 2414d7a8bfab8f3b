"""Action masking in the model, as RLlib's ActionMaskModel does it: any model, built for the observation
without its mask, behind ``MaskedModel``, which gives illegal actions the lowest float's logit.

An observation that carries its mask is one ``MaskedBox`` vector (rlrun/envs/action_mask.py): the mask's
``n`` entries, then the observation. Acting, evaluation, every loss, OPE and exported models call the
model, so all of them see masked logits: a categorical policy never samples an illegal action, its
greedy action is the best legal one, and log-probabilities, entropy and KL count legal actions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.core.registry import MODELS
from rlrun.data.spaces import MaskedBox
from rlrun.models.base import ModelOutput

FLOAT_MIN = torch.finfo(torch.float32).min  # an illegal action's logit: probability 0, no inf or NaN in the math


class MaskedModel(nn.Module):
    """``inner`` (built for ``space.inner``) on the observation part; its logits masked by the mask part.
    Recurrent models keep their interface (``initial_state``, ``forward_step``, ``forward_seq``)."""

    def __init__(self, inner: nn.Module, space: MaskedBox) -> None:
        super().__init__()
        self.inner: Any = inner  # any MODELS entry; a recurrent one's extra methods are called below
        self.mask_size = space.mask_size
        self.inner_shape = tuple(space.inner.shape or ())
        # uint8 images stay uint8 (the CNN scales them)
        self.inner_dtype = torch.from_numpy(np.zeros(0, space.inner.dtype)).dtype
        self.is_recurrent = bool(getattr(inner, "is_recurrent", False))

    def split(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[..., n + d]`` -> (legal ``[..., n]`` bool, observations ``[..., *inner_shape]``)."""
        n = self.mask_size
        rest = obs[..., n:].reshape(*obs.shape[:-1], *self.inner_shape)
        return obs[..., :n] > 0.5, rest if rest.dtype == self.inner_dtype else rest.to(self.inner_dtype)

    @staticmethod
    def masked(out: ModelOutput, legal: torch.Tensor) -> ModelOutput:
        logits = out.dist_inputs.masked_fill(~legal.reshape(out.dist_inputs.shape), FLOAT_MIN)
        return ModelOutput(logits, out.values)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        legal, x = self.split(obs)
        return self.masked(self.inner(x), legal)

    def initial_state(self, batch_size: int) -> list[torch.Tensor]:
        return self.inner.initial_state(batch_size)

    def forward_step(self, obs: torch.Tensor, state: Sequence[torch.Tensor]) -> tuple[ModelOutput, list[Any]]:
        legal, x = self.split(obs)
        out, new_state = self.inner.forward_step(x, state)
        return self.masked(out, legal), new_state

    def forward_seq(self, obs: torch.Tensor, state: Sequence[torch.Tensor]) -> tuple[ModelOutput, list[Any]]:
        legal, x = self.split(obs)
        out, new_state = self.inner.forward_seq(x, state)
        return self.masked(out, legal), new_state

    def __getattr__(self, name: str) -> Any:  # a recurrent model's max_seq_len, cell_size, ...
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def build_model(name: str, obs_space: gym.Space, action_space: gym.Space, num_outputs: int,
                config: Any) -> nn.Module:
    """The MODELS entry ``name`` for these spaces; for an observation that carries an action mask, the
    model built for the observation alone, behind ``MaskedModel``."""
    cls = MODELS.get(name)
    if isinstance(obs_space, MaskedBox):
        return MaskedModel(cls(obs_space.inner, action_space, num_outputs, config), obs_space)
    model: nn.Module = cls(obs_space, action_space, num_outputs, config)
    return model
