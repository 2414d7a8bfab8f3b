"""TD3's update on the built-in ``twin_q_mlp`` without autograd: the gradients of the ``td3`` loss's two
stages (``rlrun.algos.td3``), derived by hand as SAC's are (``twin_q_grad.py``, whose forward and backward
passes through the critic stack and the actor this reuses), into buffers kept between updates.

The stages (B rows, C critics, a deterministic tanh actor; the Policy steps the critics between them):
  critic: sum_c mean_b (Q_c(s, a) - y)^2,  y = R_n + gamma^n min_c Q'_c(s', clip(tanh(pi'(s')) + clip(noise), -1, 1))
  actor:  -mean_b Q_1(s, tanh(pi(s))), the critics' weights held fixed; every ``policy_delay``-th update
so d critic / d Q_c = 2 (Q_c - y) / B, and the actor's gradient is -1/B back through critic 1 to its action
inputs, then through tanh (1 - a^2) into the actor. The gradients equal autograd's to float rounding
(tests/test_td3_grad.py); ``algo.hand_gradient: false`` gives autograd back, as do the Huber critic and
``l2_reg`` (RLlib DDPG's options), which this does not derive.
"""

from __future__ import annotations

from typing import Any

import torch

from rlrun.models import gemm
from rlrun.models.mlp_grad import Torso, flat
from rlrun.models.twin_q_grad import ActorCriticGrad, CriticStep


class TD3Grad(ActorCriticGrad):
    """The TD3 update's forward passes and gradients for one ``TwinQModel`` and its target copy, reading
    their parameters in place (optimizer steps and the Polyak step write them in place)."""

    def __init__(self, model: Any, target: Any) -> None:
        super().__init__(model, target)
        self.target_actor = Torso(target._layers, self.relu)
        self.target_head = target.head

    @torch.no_grad()
    def critic_gradient(self, batch: dict[str, torch.Tensor], columns: tuple[str, str, str, str, str],
                        noise: float, noise_clip: float, generator: torch.Generator) -> CriticStep:
        """The critic stage: set the critics' ``.grad`` to the gradient of ``td3_critic_loss`` on ``batch``
        (``noise``, ``noise_clip``: the target policy's smoothing, its draw ``td3_critic_loss``'s)."""
        obs_k, act_k, next_k, rew_k, disc_k = columns
        obs, next_obs = batch[obs_k], batch[next_k]
        hs = self.target_actor.forward(flat(next_obs), "target_actor")
        a2 = torch.addmm(self.target_head.bias, hs[-1], self.target_head.weight.t()).tanh_()
        if noise > 0:
            eps = torch.randn(a2.shape, generator=generator) * noise
            a2 = (a2 + eps.clamp_(-noise_clip, noise_clip)).clamp_(-1.0, 1.0)
        _, q_target = self._critic(self.target_critics, self._sa(next_obs, a2), "target")
        target = torch.addcmul(batch[rew_k], batch[disc_k], q_target.amin(0))
        gs, q = self._critic(self.critics, self._sa(obs, self.model.to_unit(batch[act_k])), "critic")
        err = q - target
        critic = err.pow(2).mean(-1).sum()
        self._critic_backward(gs, err.mul_(2.0 / len(obs)))
        return CriticStep(critic, q.mean(), target.mean())

    @torch.no_grad()
    def actor_gradient(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor stage, after the critics' step: set the actor's ``.grad`` to the gradient of
        ``td3_actor_loss`` (critic 1 only: the others' Q-values do not enter it); returns the loss."""
        n, stack = len(obs), self.critics
        hs, out = self._actor(obs, "actor")
        a = out.tanh()
        shapes = [(n, int(w.shape[-1])) for w in stack.weights]
        gs = [self._sa(obs, a)]
        for w, b, buf in zip(stack.weights, stack.biases, self._bufs.get("q1", shapes), strict=True):
            gs.append(gemm.addmm_act(b[0], gs[-1], w[0], self.relu, out=buf))
        actor = -((gs[-1] @ stack.out_weight[0, 0]) + stack.out_bias[0]).mean()
        da = self._one_critic_backward(0, gs[1:], stack.out_weight[0] * (-1.0 / n), self._bufs.get("q1/dz", shapes))
        self._actor_backward(hs, torch.ops.aten.tanh_backward(da, a))
        return actor
