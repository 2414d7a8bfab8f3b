"""What the hand-derived gradients (``q_mlp_grad`` for DQN, ``twin_q_grad`` for SAC) share: an MLP
torso's forward and backward pass without autograd, into buffers kept between updates (a freshly
allocated 128 KB activation is a fresh mmap whose pages fault in on first touch), for ReLU or tanh.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

HAND_ACTIVATIONS = (torch.relu, torch.tanh)  # the activations whose backward act_backward writes out


class Buffers:
    """Tensors kept between updates, by name and shapes (another row count gets its own)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, tuple[tuple[int, ...], ...]], list[torch.Tensor]] = {}

    def get(self, key: str, shapes: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
        k = (key, tuple(shapes))
        bufs = self._bufs.get(k)
        if bufs is None:
            bufs = self._bufs[k] = [torch.empty(s) for s in shapes]
        return bufs


def act_backward(relu: bool, d: torch.Tensor, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """d(act(z)) -> dz into ``out``, from the activation's output ``h`` (ReLU, else tanh)."""
    if relu:
        return torch.ops.aten.threshold_backward.grad_input(d, h, 0, grad_input=out)
    return torch.ops.aten.tanh_backward.grad_input(d, h, grad_input=out)


def grad_buffer(p: torch.Tensor) -> torch.Tensor:
    """``p.grad``, made a tensor of ``p``'s shape if it is not one (optimizers set it to None)."""
    if p.grad is None or p.grad.shape != p.shape:
        p.grad = torch.empty_like(p)
    return p.grad


def torso_forward(layers: list[nn.Linear], relu: bool, x: torch.Tensor, bufs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The input ``x [N, in]`` and every layer's activations ``[N, width]``, written into ``bufs``."""
    hs = [x]
    for layer, buf in zip(layers, bufs, strict=True):
        h = torch.addmm(layer.bias, hs[-1], layer.weight.t(), out=buf)
        hs.append(h.relu_() if relu else h.tanh_())
    return hs


def torso_backward(layers: list[nn.Linear], relu: bool, hs: list[torch.Tensor], dh: torch.Tensor,
                   dzs: list[torch.Tensor], dhs: list[torch.Tensor]) -> None:
    """Back-propagate ``dh`` (the gradient at the last layer's activations) through ``layers`` into
    their ``.grad``; ``hs`` from ``torso_forward``; ``dzs``, ``dhs``: buffers shaped like the activations."""
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        dz = act_backward(relu, dh, hs[i + 1], dzs[i])
        torch.mm(dz.t(), hs[i], out=grad_buffer(layer.weight))
        torch.sum(dz, 0, out=grad_buffer(layer.bias))
        if i:
            dh = torch.mm(dz, layer.weight, out=dhs[i - 1])
