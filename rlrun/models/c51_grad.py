"""The built-in ``q_mlp`` with C51's atoms (Rainbow's Q-network: distributional, dueling or not, noisy
heads or plain) without autograd: its atom probabilities, and the gradient of C51's cross-entropy
against a projected target distribution, derived by hand.

Why: one update of ``rainbow_cartpole`` by autograd was three passes (the online net at s' for double
Q, at s, the target net at s'), each noisy head two linear maps and a dozen elementwise operations,
plus their autograd nodes: ~4.5 ms on one thread, 1.30x this module's ~3.4 ms (experiments/dqn_learner,
3 processes each, and 8 interleaved pairs in one process). The online net's passes at s and s' are now
one pass of 2B rows under one noise draw (as in Kaixhin's Rainbow; autograd's ``dqn_td_loss`` reuses the
draw for its pass at s', ``shared_noise``): about the same cost an update (1.00-1.05x the updates/s in 3
interleaved pairs, experiments/dqn_learner), one noisy head formed fewer. Here each pass's heads are one
linear map: a noisy layer's weight ``mu + sigma * (e_out e_in^T)`` is formed once a pass (a [A*N, F]
matrix, small next to the [B, F] activations), and the dueling combination V + A - mean_a A is folded into it, as in
``q_mlp_grad``. Noise is drawn as ``NoisyLinear`` draws it, in the order ``dqn_td`` draws it, so the
numbers equal autograd's to float rounding (tests/test_c51_grad.py); ``algo.hand_gradient: false``
gives autograd back.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard, cast

import torch
from torch import nn

from rlrun.models.mlp_grad import HAND_ACTIVATIONS, Torso, flat, grad_buffer
from rlrun.models.noisy import NoisyLinear, scaled_noise
from rlrun.models.q_networks import QMLPModel


class Noise(NamedTuple):
    """One noisy layer's factorised noise for one pass: ``f(e_in) [in]``, ``f(e_out) [out]`` and their
    outer product ``[out, in]``."""

    e_in: torch.Tensor
    e_out: torch.Tensor
    outer: torch.Tensor


class Head(NamedTuple):
    """One pass's heads as one linear map to the atoms' logits, ``weight [A*N, F]``, ``bias [A*N]``, and
    the noise each head drew (None: a plain head, or a noisy one in eval mode)."""

    weight: torch.Tensor
    bias: torch.Tensor
    adv_noise: Noise | None
    v_noise: Noise | None


class CEStep(NamedTuple):
    """What one hand-derived C51 step computed: the loss, each row's cross-entropy ``[B]`` (the
    priority update's TD error) and the expected Q(s, a) ``[B]``."""

    loss: torch.Tensor
    per_row: torch.Tensor
    q_sa: torch.Tensor


def _layer(layer: nn.Linear | NoisyLinear) -> tuple[torch.Tensor, torch.Tensor, Noise | None]:
    """A head layer's weight and bias for one pass, with fresh noise if it is noisy and training."""
    if not isinstance(layer, NoisyLinear) or not layer.training:
        return layer.weight, layer.bias, None
    e_in = scaled_noise(layer.in_features, layer.generator)
    e_out = scaled_noise(layer.out_features, layer.generator)
    noise = Noise(e_in, e_out, torch.outer(e_out, e_in))
    w = torch.addcmul(layer.weight, layer.weight_sigma, noise.outer)
    return w, torch.addcmul(layer.bias, layer.bias_sigma, e_out), noise


def _set_grads(layer: nn.Linear | NoisyLinear, dw: torch.Tensor, db: torch.Tensor, noise: Noise | None) -> None:
    """Write a head layer's gradients from those of its weight and bias in this pass: the means get
    them as they are, the noise scales times the noise."""
    grad_buffer(layer.weight).copy_(dw)
    grad_buffer(layer.bias).copy_(db)
    if isinstance(layer, NoisyLinear):
        if noise is None:  # eval mode: the noise scales did not take part
            grad_buffer(layer.weight_sigma).zero_()
            grad_buffer(layer.bias_sigma).zero_()
        else:
            torch.mul(dw, noise.outer, out=grad_buffer(layer.weight_sigma))
            torch.mul(db, noise.e_out, out=grad_buffer(layer.bias_sigma))


class C51Grad:
    """Forward passes and C51's cross-entropy gradient of one ``QMLPModel`` with atoms, reading its
    parameters in place (optimizer steps and ``load_state_dict`` write them in place)."""

    def __init__(self, model: QMLPModel) -> None:
        self.torso = Torso(model._layers, model._act is torch.relu)
        self.adv = cast(nn.Linear | NoisyLinear, model.adv_head)  # supports() checked both heads' types
        self.v = cast(nn.Linear | NoisyLinear | None, model.v_head)
        self.num_actions, self.num_atoms = model.num_actions, model.num_atoms
        self.support = model.support

    @staticmethod
    def supports(model: Any, trains: bool = True) -> TypeGuard[QMLPModel]:
        """The built-in ``q_mlp`` exactly (not a subclass) with atoms (``num_atoms > 1``), ReLU or tanh,
        heads that are ``nn.Linear`` or ``NoisyLinear`` exactly, float32 parameters that all train
        (``trains``; a target net's do not)."""
        if type(model) is not QMLPModel or model._act not in HAND_ACTIVATIONS or model.num_atoms < 2:
            return False
        heads = [model.adv_head] + ([model.v_head] if model.v_head is not None else [])
        params = list(model.parameters())
        return all(type(h) in (nn.Linear, NoisyLinear) for h in heads) and all(
            p.dtype == torch.float32 and (p.requires_grad or not trains) for p in params)

    @torch.no_grad()
    def head(self) -> Head:
        """This pass's heads as one linear map; a noisy head draws its noise here (the advantage head's,
        then the value head's, each ``e_in`` then ``e_out``, as a forward pass of the model does). A
        dueling head V(h) + A(h) - mean_a A(h) is linear in the features h, atom by atom."""
        w, b, adv_noise = _layer(self.adv)
        if self.v is None:
            return Head(w, b, adv_noise, None)
        wv, bv, v_noise = _layer(self.v)
        a, n = self.num_actions, self.num_atoms
        w3, b2 = w.view(a, n, -1), b.view(a, n)
        w = (w3 - w3.mean(0, keepdim=True) + wv).view(a * n, -1)
        return Head(w, (b2 - b2.mean(0, keepdim=True) + bv).view(-1), adv_noise, v_noise)

    @torch.no_grad()
    def logits(self, obs: torch.Tensor, head: Head, key: str = "eval") -> tuple[list[torch.Tensor], torch.Tensor]:
        """The torso's activations and the atoms' logits ``[N, A, num_atoms]`` of observations ``[N, ...]``."""
        hs = self.torso.forward(flat(obs), key)
        z = torch.addmm(head.bias, hs[-1], head.weight.t())
        return hs, z.view(len(obs), self.num_actions, self.num_atoms)

    @torch.no_grad()
    def probs(self, obs: torch.Tensor, head: Head) -> torch.Tensor:
        """The atoms' probabilities ``[N, A, num_atoms]`` (a new tensor)."""
        return torch.softmax(self.logits(obs, head)[1], dim=-1)

    @torch.no_grad()
    def q_values(self, obs: torch.Tensor, head: Head) -> torch.Tensor:
        """Expected Q-values ``[N, A]`` of observations ``[N, ...]``."""
        return self.expected_q(self.logits(obs, head)[1])

    @torch.no_grad()
    def expected_q(self, z: torch.Tensor) -> torch.Tensor:
        """Expected Q-values ``[N, A]`` from the atoms' logits ``z [N, A, num_atoms]``: their probabilities
        times the support."""
        return torch.matmul(torch.softmax(z, dim=-1), self.support)

    @torch.no_grad()
    def ce_gradient(self, hs: list[torch.Tensor], z: torch.Tensor, actions: torch.Tensor, target_p: torch.Tensor,
                    weights: torch.Tensor | None, head: Head) -> CEStep:
        """Set every parameter's ``.grad`` to the gradient of ``mean_i w_i * CE_i``, ``CE_i = -sum_j
        target_p[i, j] log p(s_i, a_i)_j`` (``w_i`` = 1 without ``weights``), from a forward pass's first
        ``len(actions)`` rows (``logits(..., key="train")``: its activations ``hs`` and logits ``z``; rows
        after them, such as the s' of the same pass, take no part): the gradient at the chosen action's
        logits is ``w_i / B * (p(s_i, a_i) * sum_j target_p[i, j] - target_p[i])``."""
        rows, a, n = len(actions), self.num_actions, self.num_atoms
        hs, z = [h[:rows] for h in hs], z[:rows]
        idx = actions.long().view(rows, 1, 1).expand(rows, 1, n)
        log_p_sa = torch.log_softmax(z.gather(1, idx).squeeze(1), dim=-1)
        per_row = torch.mul(target_p, log_p_sa).sum(-1).neg_()
        loss = (per_row * weights).mean() if weights is not None else per_row.mean()
        p_sa = log_p_sa.exp()
        coef = weights / rows if weights is not None else torch.full((rows,), 1.0 / rows)
        dz_sa = torch.mul(p_sa, target_p.sum(-1, keepdim=True)).sub_(target_p).mul_(coef.unsqueeze(1))
        dz = torch.zeros(rows, a, n).scatter_(1, idx, dz_sa.unsqueeze(1)).view(rows, a * n)
        self._backward(hs, head, dz)
        return CEStep(loss, per_row, torch.matmul(p_sa, self.support))

    def _backward(self, hs: list[torch.Tensor], head: Head, dz: torch.Tensor) -> None:
        """Back-propagate ``dz = dLoss/dlogits [B, A*N]`` through the heads and the torso into ``.grad``."""
        dw, db = dz.t().mm(hs[-1]), dz.sum(0)
        if self.v is None:
            _set_grads(self.adv, dw, db, head.adv_noise)
        else:  # the dueling heads' two layers from the one linear map's gradient
            a, n = self.num_actions, self.num_atoms
            dw3, db2 = dw.view(a, n, -1), db.view(a, n)
            _set_grads(self.adv, (dw3 - dw3.mean(0, keepdim=True)).view(a * n, -1),
                       (db2 - db2.mean(0, keepdim=True)).view(-1), head.adv_noise)
            _set_grads(self.v, dw3.sum(0), db2.sum(0), head.v_noise)
        self.torso.backward(hs, dz, head.weight, "train")
