"""The built-in ``q_mlp`` without autograd: its Q-values, and the gradient of DQN's TD regression
(a weighted Huber or squared loss of Q(s, a) against fixed targets), derived by hand.

Why: one DQN update of ``dqn_cartpole``'s 128-row minibatch on its 256x256 net is ~100 operator calls
and autograd nodes, each paying eager PyTorch's fixed cost, while its matrix products are ~half of
the time (experiments/dqn_learner). Here the same arithmetic runs with no autograd graph, in fewer
calls that write into buffers kept between updates (a freshly allocated 128 KB activation is a fresh
mmap whose pages fault in on first touch), with a dueling head computed as the one linear map it is.
Measured on one thread, blocks of 384 updates alternated in one process (9 pairs): 1.22x the updates/s
of autograd with SB3's settings, 1.23x with ``dqn_cartpole``'s (experiments/dqn_learner/README.md).
The gradients equal autograd's to float rounding (tests/test_q_mlp_grad.py); ``algo.hand_gradient:
false`` gives autograd back.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard, cast

import torch
from torch import nn

from rlrun.models.mlp_grad import HAND_ACTIVATIONS, Torso, flat, grad_buffer
from rlrun.models.q_networks import QMLPModel


class TDStep(NamedTuple):
    """What one hand-derived TD gradient step computed (no autograd graph): the loss, each row's
    TD error Q(s, a) - target ``[B]`` and Q(s, a) ``[B]``."""

    loss: torch.Tensor
    td_error: torch.Tensor
    q_sa: torch.Tensor


class QMLPGrad:
    """Forward passes and the TD-loss gradient of one ``QMLPModel``, reading its parameters in place
    (optimizer steps and ``load_state_dict`` write them in place, so nothing is ever copied)."""

    def __init__(self, model: QMLPModel) -> None:
        self.torso = Torso(model._layers, model._act is torch.relu)
        self.adv = cast(nn.Linear, model.adv_head)  # supports() checked both heads' types
        self.v = cast(nn.Linear | None, model.v_head)  # dueling: the state value's head

    @staticmethod
    def supports(model: Any, trains: bool = True) -> TypeGuard[QMLPModel]:
        """The built-in ``q_mlp`` exactly (not a subclass), with ReLU or tanh, plain linear heads
        giving Q-values (not C51's atoms, not noisy), float32 parameters that all train (``trains``;
        a target net's do not)."""
        if type(model) is not QMLPModel or model._act not in HAND_ACTIVATIONS or model.num_atoms != 1:
            return False
        heads_linear = type(model.adv_head) is nn.Linear and (model.v_head is None or type(model.v_head) is nn.Linear)
        params = list(model.parameters())
        return heads_linear and all(p.dtype == torch.float32 and (p.requires_grad or not trains) for p in params)

    @torch.no_grad()
    def head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The Q head as one linear map, weight ``[A, F]`` and bias ``[A]``: a dueling head
        V(h) + A(h) - mean_a A(h) is linear in the features h. Valid until the next optimizer step."""
        w, b = self.adv.weight, self.adv.bias
        if self.v is None:
            return w, b
        return w - w.mean(0, keepdim=True) + self.v.weight, b - b.mean() + self.v.bias

    @torch.no_grad()
    def q_values(self, obs: torch.Tensor, head: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Q-values ``[N, num_actions]`` of observations ``[N, *obs_shape]`` (a new tensor); ``head``:
        this step's ``head()``, if the caller has it."""
        w, b = head or self.head()
        return torch.addmm(b, self.torso.forward(flat(obs), "eval")[-1], w.t())

    @torch.no_grad()
    def td_gradient(self, obs: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor,
                    weights: torch.Tensor | None, huber_delta: float,
                    head: tuple[torch.Tensor, torch.Tensor] | None = None) -> TDStep:
        """Set every parameter's ``.grad`` to the gradient of ``mean_i w_i * L(Q(s_i, a_i) - y_i)``,
        L the Huber loss with threshold ``huber_delta`` (``<= 0``: ``0.5 * d^2``), ``w_i`` = 1 without
        ``weights``. ``obs [B, *obs_shape]``, ``actions [B]`` (integers), ``targets [B]``."""
        hs = self.torso.forward(flat(obs), "train")
        w, b = head or self.head()
        q = torch.addmm(b, hs[-1], w.t())
        a = actions.long().unsqueeze(1)
        q_sa = q.gather(1, a).squeeze(1)
        d = q_sa - targets
        g = d.clamp(-huber_delta, huber_delta) if huber_delta > 0 else d  # dL/dd
        # L = g * (d - g / 2): 0.5 d^2 inside the threshold, delta * (|d| - delta / 2) outside
        gw = g * weights if weights is not None else g
        loss = torch.dot(gw, torch.add(d, g, alpha=-0.5)).div_(len(d))
        dq = torch.zeros_like(q).scatter_(1, a, torch.mul(gw, 1.0 / len(d)).unsqueeze(1))
        self._backward(hs, w, dq)
        return TDStep(loss, d, q_sa)

    def _backward(self, hs: list[torch.Tensor], w: torch.Tensor, dq: torch.Tensor) -> None:
        """Back-propagate ``dq = dLoss/dQ [B, A]`` through the head and the torso into ``.grad``."""
        if self.v is None:
            torch.mm(dq.t(), hs[-1], out=grad_buffer(self.adv.weight))
            torch.sum(dq, 0, out=grad_buffer(self.adv.bias))
        else:  # the dueling head's two layers from the one linear map's gradient
            dw, db = dq.t().mm(hs[-1]), dq.sum(0)
            torch.sub(dw, dw.mean(0, keepdim=True), out=grad_buffer(self.adv.weight))
            torch.sub(db, db.mean(), out=grad_buffer(self.adv.bias))
            torch.sum(dw, 0, keepdim=True, out=grad_buffer(self.v.weight))
            torch.sum(db, 0, keepdim=True, out=grad_buffer(self.v.bias))
        self.torso.backward(hs, dq, w, "train")
