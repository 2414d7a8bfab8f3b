"""Built-in models: output shapes, shared vs separate value torso, the Gaussian log-std, Q heads."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.models.base import MLPConfig, MLPModel
from rlrun.models.q_networks import QMLPConfig, QMLPModel

OBS = gym.spaces.Box(-1, 1, (3, 2), np.float32)  # non-flat observations are flattened


def test_mlp_discrete_shapes_and_separate_value_torso():
    m = MLPModel(OBS, gym.spaces.Discrete(4), 4, MLPConfig(hiddens=[16, 8]))
    out = m(torch.zeros(5, 3, 2))
    assert out.dist_inputs.shape == (5, 4) and out.values.shape == (5,)
    assert m.vf_torso is not None
    m.pi_head.weight.data.zero_()
    m.pi_head.bias.data.zero_()
    # the policy head no longer depends on the input, the value net still does
    x = torch.randn(5, 3, 2)
    assert torch.equal(m(x).dist_inputs, torch.zeros(5, 4)) and m(x).values.std() > 0


def test_mlp_shared_torso_and_free_log_std_for_boxes():
    act = gym.spaces.Box(-1, 1, (2,), np.float32)
    m = MLPModel(OBS, act, 4, MLPConfig(vf_share_layers=True, free_log_std=True, init_log_std=-0.5))
    out = m(torch.randn(7, 3, 2))
    assert m.vf_torso is None and out.dist_inputs.shape == (7, 4)
    assert torch.allclose(out.dist_inputs[:, 2:], torch.full((7, 2), -0.5))  # state-independent log-std


def test_mlp_rejects_an_unknown_activation():
    with pytest.raises(ValueError, match="model.activation: unknown 'sigmoidx'"):
        MLPModel(OBS, gym.spaces.Discrete(2), 2, MLPConfig(activation="sigmoidx"))


@pytest.mark.parametrize("dueling", [False, True])
def test_q_model_values_are_the_max_q(dueling):
    m = QMLPModel(OBS, gym.spaces.Discrete(3), 3, QMLPConfig(hiddens=[8], dueling=dueling))
    out = m(torch.randn(6, 3, 2))
    assert out.dist_inputs.shape == (6, 3)
    assert torch.equal(out.values, out.dist_inputs.max(-1).values)


@pytest.mark.parametrize(("dueling", "atoms", "noisy"), [(False, 1, False), (True, 1, False), (True, 11, True),
                                                      (False, 11, False), (True, 1, True)])
def test_dqn_acts_in_numpy_with_the_q_networks_own_values_through_learning(dueling, atoms, noisy):
    """The built-in q_mlp acts in numpy on views of its weights, Rainbow's heads (C51's atoms, noisy
    heads' means) included: the greedy actions and Q-values dqn_actions returns are the torch
    model's, before and after an optimizer step."""
    from rlrun.algos.algorithm import make_policy
    from rlrun.algos.dqn import DQNState, dqn_actions
    from rlrun.sources.plugins import load_builtins

    load_builtins()
    policy = make_policy("dqn", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(3),
                         model_config=QMLPConfig(hiddens=[16, 16], dueling=dueling, num_atoms=atoms, v_min=-3,
                                                 v_max=3, noisy=noisy), seed=0)
    assert isinstance(policy.state, DQNState) and policy.state.actor is not None
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    for step in ("initial", "after an Adam step"):
        if step != "initial":
            loss = policy.model(torch.as_tensor(obs)).dist_inputs.pow(2).mean()
            policy.optimizer.zero_grad()
            loss.backward()
            policy.optimizer.step()
        with torch.inference_mode():
            ref = policy.model.eval()(torch.as_tensor(obs))
            policy.model.train()
        out = dqn_actions(policy, obs, explore=False)
        np.testing.assert_allclose(out.dist_inputs, ref.dist_inputs.numpy(), rtol=1e-5, atol=1e-6, err_msg=step)
        np.testing.assert_allclose(out.values, ref.values.numpy(), rtol=1e-5, atol=1e-6, err_msg=step)
        assert np.array_equal(out.actions, ref.dist_inputs.argmax(-1).numpy()), step
