"""``model: cnn``: convolutions over image observations, then an MLP head (policy and value).

``conv_filters`` is RLlib's ``[[out_channels, kernel, stride], ...]``; ``conv_padding`` is ``valid`` (none),
``same`` (TensorFlow's: each layer's output ceil(size / stride), zeros split as TF does, the odd one after)
or ``same_but_last`` (RLlib's vision net: same on every layer but the last). Image layouts:
``[H, W, C]`` (gymnasium, MiniGrid, Atari after resizing) or ``[C, H, W]`` (``channel_order: auto``
picks by which end of the shape is smaller), ``[H, W]`` (one channel), and frame stacks
``[S, H, W, C]`` (the ``frame_stack`` wrapper), whose S frames become S x C channels. uint8
observations are scaled to [0, 1].

Convolutions run channels-last (NHWC in memory; the weights and the images fed to them): on this
CPU oneDNN's kernels for that layout train the Nature CNN on 256 84x84x4 frames in 278 ms against
360 ms (one thread) and 132 ms against 221 ms (two threads); experiments/atari has the whole-run figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlrun.config.typed import ConfigError
from rlrun.core.registry import MODELS
from rlrun.models.base import ACTIVATIONS, ModelConfig, ModelOutput, _init, _mlp


@dataclass
class CNNConfig(ModelConfig):
    name: str = "cnn"
    # [[out_channels, kernel, stride], ...]; the default suits small images (MiniGrid's 7x7)
    conv_filters: list[list[int]] = field(default_factory=lambda: [[16, 2, 1], [32, 2, 1], [64, 2, 1]])
    # valid: no padding; same: TF's "same" on every layer; same_but_last: RLlib's vision net (the last layer valid)
    conv_padding: Literal["valid", "same", "same_but_last"] = "valid"
    conv_activation: str = "relu"
    hiddens: list[int] = field(default_factory=lambda: [64])  # MLP after the flattened convolutions
    activation: str = "relu"
    vf_share_layers: bool = True  # one convolutional torso for policy and value (False: two)
    channel_order: Literal["auto", "hwc", "chw"] = "auto"
    action_dist: str | None = None  # None: categorical for Discrete, diag_gaussian for Box
    free_log_std: bool = True  # Gaussian policies: a state-independent learned log-std
    init_log_std: float = 0.0


def check_cnn_config(c: CNNConfig) -> str | None:
    """What is wrong with a CNN config before anything runs (``key: message`` below ``model``)."""
    for key in ("conv_activation", "activation"):
        if getattr(c, key) not in ACTIVATIONS:
            return f"{key}: unknown '{getattr(c, key)}'; known: {', '.join(ACTIVATIONS)}"
    if not c.conv_filters:
        return "conv_filters: empty; give at least one [out_channels, kernel, stride]"
    for i, f in enumerate(c.conv_filters):
        if len(f) != 3 or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in f):
            return f"conv_filters[{i}]: expected [out_channels, kernel, stride] of positive integers, got {f}"
    return None


def image_layout(shape: tuple[int, ...], order: str, model: str = "cnn", instead: str = "mlp"
                 ) -> tuple[int, int, int, str]:
    """(channels, height, width, how to bring an observation to [C, H, W]) for an observation shape; a shape
    that is no image is refused naming ``model`` and the model to use ``instead``."""
    if len(shape) == 2:
        return 1, shape[0], shape[1], "hw"
    if len(shape) == 4:  # frame stack of [H, W, C] images
        return shape[0] * shape[3], shape[1], shape[2], "shwc"
    if len(shape) != 3:
        raise ConfigError(f"model.name: {model} needs image observations ([H, W], [H, W, C], [C, H, W] or a frame "
                          f"stack), got shape {shape}; use model={instead}")
    if order == "auto":
        order = "hwc" if shape[-1] < shape[0] else "chw"
    return (shape[2], shape[0], shape[1], "hwc") if order == "hwc" else (shape[0], shape[1], shape[2], "chw")


def _same_pad(size: int, k: int, s: int) -> tuple[int, int]:
    """TensorFlow's "same" padding of one axis (before, after): the output is ceil(size / s)."""
    total = max((-(-size // s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def conv_plan(h: int, w: int, filters: list[list[int]], padding: str = "valid"
              ) -> tuple[tuple[int, int], list[tuple[int, int, int, int]]]:
    """The image size after ``filters`` and each layer's zero padding (left, right, top, bottom) under
    ``padding`` (``conv_padding``); ConfigError when a layer shrinks the image below 1x1."""
    pads: list[tuple[int, int, int, int]] = []
    for i, (_, k, s) in enumerate(filters):
        same = padding == "same" or (padding == "same_but_last" and i < len(filters) - 1)
        (top, bottom), (left, right) = (_same_pad(h, k, s), _same_pad(w, k, s)) if same else ((0, 0), (0, 0))
        nh, nw = (h + top + bottom - k) // s + 1, (w + left + right - k) // s + 1
        if nh < 1 or nw < 1:
            raise ConfigError(f"model.conv_filters: {filters} shrink the {h}x{w} image below 1x1 at layer {i} "
                              f"(kernel {k}, stride {s}, padding {'same' if same else 'valid'}); use smaller kernels "
                              "or strides, fewer layers, or the resize_observation wrapper")
        pads.append((left, right, top, bottom))
        h, w = nh, nw
    return (h, w), pads


class ConvInput(NamedTuple):
    channels: int  # of the images fed to the first layer
    layout: str  # for ``images``
    flat: int  # features after the convolutions, flattened
    pads: list[tuple[int, int, int, int]]  # each layer's zero padding (left, right, top, bottom)


def conv_input(obs_space: gym.Space, c: CNNConfig, model: str = "cnn", instead: str = "mlp") -> ConvInput:
    """What ``c``'s convolutions take and give on ``obs_space``; a ConfigError naming ``model`` (and the
    model to use ``instead``) for observations that are no images, or filters that shrink them away."""
    channels, h, w, layout = image_layout(tuple(obs_space.shape or ()), c.channel_order, model, instead)
    (oh, ow), pads = conv_plan(h, w, c.conv_filters, c.conv_padding)
    return ConvInput(channels, layout, c.conv_filters[-1][0] * oh * ow, pads)


def conv_torso(c: CNNConfig, conv: ConvInput) -> nn.Sequential:
    """``c``'s convolutions (each after its zero padding, if any) and activations, then a flatten."""
    layers: list[nn.Module] = []
    channels = conv.channels
    for (out, k, s), pad in zip(c.conv_filters, conv.pads, strict=True):
        layer = nn.Conv2d(channels, out, k, s)
        nn.init.orthogonal_(layer.weight, np.sqrt(2))
        nn.init.zeros_(layer.bias)  # type: ignore[arg-type]  # Conv2d has a bias unless bias=False
        layer.weight.data = layer.weight.data.contiguous(memory_format=torch.channels_last)
        layers += [*([nn.ZeroPad2d(pad)] if any(pad) else []), layer, ACTIVATIONS[c.conv_activation]()]
        channels = out
    return nn.Sequential(*layers, nn.Flatten())


def images(obs: torch.Tensor, layout: str) -> torch.Tensor:
    """Observations -> float ``[B, C, H, W]`` (uint8 scaled to [0, 1]), channels-last in memory;
    ``layout`` from ``image_layout``."""
    x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
    if layout == "hw":
        x = x.unsqueeze(1)
    elif layout == "hwc":
        x = x.permute(0, 3, 1, 2)
    elif layout == "shwc":
        b, s, h, w, c = x.shape
        x = x.permute(0, 1, 4, 2, 3).reshape(b, s * c, h, w)
    return x.contiguous(memory_format=torch.channels_last)


@MODELS.register("cnn", config=CNNConfig, validate=check_cnn_config)
class CNNModel(nn.Module):
    """Convolutional actor-critic for image observations."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: CNNConfig) -> None:
        super().__init__()
        conv = conv_input(obs_space, config)
        self.layout, flat = conv.layout, conv.flat
        act = ACTIVATIONS[config.activation]
        sizes = [flat, *config.hiddens]
        self.torso = nn.Sequential(conv_torso(config, conv), _mlp(sizes, act))
        self.vf_torso = None if config.vf_share_layers else nn.Sequential(conv_torso(config, conv),
                                                                           _mlp(sizes, act))
        self.free_log_std = config.free_log_std and isinstance(action_space, gym.spaces.Box)
        head_out = num_outputs // 2 if self.free_log_std else num_outputs
        self.pi_head = _init(nn.Linear(sizes[-1], head_out), 0.01)
        self.vf_head = _init(nn.Linear(sizes[-1], 1), 1.0)
        if self.free_log_std:
            self.log_std = nn.Parameter(torch.full((head_out,), float(config.init_log_std)))

    def images(self, obs: torch.Tensor) -> torch.Tensor:
        return images(obs, self.layout)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        x = self.images(obs)
        h = self.torso(x)
        logits = F.linear(h, self.pi_head.weight, self.pi_head.bias)
        if self.free_log_std:
            logits = torch.cat([logits, self.log_std.expand_as(logits)], dim=-1)
        hv = h if self.vf_torso is None else self.vf_torso(x)
        return ModelOutput(logits, self.vf_head(hv).squeeze(-1))
