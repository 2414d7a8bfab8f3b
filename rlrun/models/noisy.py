"""Noisy linear layers with factorised Gaussian noise (Fortunato et al. 2018, "Noisy Networks for
Exploration"), the exploration of Rainbow's DQN: ``y = (mu_w + sigma_w * (f(e_out) f(e_in)^T)) x +
mu_b + sigma_b * f(e_out)``, ``f(e) = sign(e) sqrt(|e|)``, ``e ~ N(0, 1)``.

Fresh noise on every forward pass in training mode (acting to explore, and each learner pass, the
target net's included), except inside ``shared_noise``, where a model's passes share one draw (DQN's
update: the online net at s and at s', as in Kaixhin's Rainbow); the mean weights alone in eval mode
(greedy evaluation and exports).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def scaled_noise(n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``f(e) = sign(e) sqrt(|e|)`` of ``n`` standard normal draws."""
    e = torch.randn(n, generator=generator)
    return torch.copysign(e.abs().sqrt_(), e)  # sign(e) sqrt(|e|), one operation fewer


class NoisyLinear(nn.Module):
    """``nn.Linear``'s interface (``in_features``, ``out_features``; ``weight`` and ``bias`` are the
    means) plus the learned noise scales ``weight_sigma`` and ``bias_sigma``, initialised to
    ``sigma0 / sqrt(in_features)``."""

    generator: torch.Generator | None = None  # None: torch's global generator (seeded by the policy)
    holding = False  # inside shared_noise: draw on the first training pass, then reuse ``held``
    held: tuple[torch.Tensor, torch.Tensor] | None = None

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight, self.bias)
        if not self.training:
            return y
        if self.held is not None:
            e_in, e_out = self.held
        else:
            e_in = scaled_noise(self.in_features, self.generator)
            e_out = scaled_noise(self.out_features, self.generator)
            if self.holding:
                self.held = (e_in, e_out)
        # (sigma_w * e_out e_in^T) x = e_out * (sigma_w (e_in * x)): no [out, in] noise matrix
        return y + e_out * (nn.functional.linear(x * e_in, self.weight_sigma) + self.bias_sigma)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


@contextmanager
def shared_noise(model: nn.Module) -> Iterator[None]:
    """Within it, each noisy layer of ``model`` draws its noise on its first training pass and reuses it on
    the passes after (a model without noisy layers is unaffected)."""
    layers = [m for m in model.modules() if isinstance(m, NoisyLinear)]
    for la in layers:
        la.holding = True
    try:
        yield
    finally:
        for la in layers:
            la.holding, la.held = False, None
