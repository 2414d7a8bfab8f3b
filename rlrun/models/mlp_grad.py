"""What the hand-derived gradients (``q_mlp_grad`` and ``c51_grad`` for DQN, ``twin_q_grad`` for SAC)
share: an MLP torso's forward and backward pass without autograd, into buffers kept between updates (a
freshly allocated 128 KB activation is a fresh mmap whose pages fault in on first touch), for ReLU or tanh.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlrun.models import gemm

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
    """The input ``x [N, in]`` and every layer's activations ``[N, width]``, written into ``bufs`` (on torch's BLAS;
    a large layer on oneDNN returns a tensor of its own, ``gemm.addmm_act``)."""
    hs = [x]
    for layer, buf in zip(layers, bufs, strict=True):
        hs.append(gemm.addmm_act(layer.bias, hs[-1], layer.weight.t(), relu, out=buf))
    return hs


def torso_backward(layers: list[nn.Linear], relu: bool, hs: list[torch.Tensor], dh: torch.Tensor,
                   dzs: list[torch.Tensor], dhs: list[torch.Tensor]) -> None:
    """Back-propagate ``dh`` (the gradient at the last layer's activations) through ``layers`` into
    their ``.grad``; ``hs`` from ``torso_forward``; ``dzs``, ``dhs``: buffers shaped like the activations."""
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        dz = act_backward(relu, dh, hs[i + 1], dzs[i])
        gemm.mm(dz.t(), hs[i], out=grad_buffer(layer.weight))
        torch.sum(dz, 0, out=grad_buffer(layer.bias))
        if i:
            dh = gemm.mm(dz, layer.weight, out=dhs[i - 1])


def flat(obs: torch.Tensor) -> torch.Tensor:
    """Observations ``[N, *obs_shape]`` as the float32 rows ``[N, obs_size]`` a torso takes."""
    return obs.reshape(len(obs), -1).float()


class Torso:
    """An MLP torso (``nn.Linear`` layers, ReLU or tanh) run without autograd, reading its parameters
    in place (optimizer steps and ``load_state_dict`` write them in place), into its own buffers."""

    def __init__(self, layers: list[nn.Linear], relu: bool) -> None:
        self.layers, self.relu = layers, relu
        self.bufs = Buffers()

    def _shapes(self, rows: int) -> list[tuple[int, int]]:
        return [(rows, la.out_features) for la in self.layers]

    def forward(self, x: torch.Tensor, key: str) -> list[torch.Tensor]:
        """The input ``x [N, in]`` and every layer's activations ``[N, width]``, in the buffers named
        ``key`` (overwritten by the next call with the same key and row count; ``torso_forward``)."""
        return torso_forward(self.layers, self.relu, x, self.bufs.get(key, self._shapes(len(x))))

    def backward(self, hs: list[torch.Tensor], d_out: torch.Tensor, w_out: torch.Tensor, key: str) -> None:
        """Back-propagate ``d_out [N, out]``, the gradient at the outputs of the linear map ``w_out
        [out, width]`` on the last activations of ``hs`` (from ``forward``), into the layers' ``.grad``."""
        shapes = self._shapes(len(d_out))
        dzs, dhs = self.bufs.get(key + "/dz", shapes), self.bufs.get(key + "/dh", shapes)
        torso_backward(self.layers, self.relu, hs, torch.mm(d_out, w_out, out=dhs[-1]), dzs, dhs)
