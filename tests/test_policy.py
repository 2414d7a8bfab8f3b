"""Policy's learner step: a NaN/inf loss stops learning before the optimizer step; gradient clipping as torch's."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import make_policy
from rlrun.algos.pg import PGConfig
from rlrun.data.batch import SampleBatch
from rlrun.policy.policy import LossOutput, NonFiniteLossError
from rlrun.sources.plugins import load_builtins


def nan_loss(policy, model, dist_class, batch):
    out = model(batch[SampleBatch.OBS])
    return LossOutput(out.values.sum() * float("nan"))


def test_nan_loss_raises_and_leaves_the_weights_alone():
    load_builtins()
    policy = make_policy("pg", gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2),
                         algo_config=PGConfig(lr=0.01), loss_fn=nan_loss)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    batch = SampleBatch({SampleBatch.OBS: np.zeros((8, 4), np.float32)})
    with pytest.raises(NonFiniteLossError, match=r"train/loss/total is nan at env step 0 \(algo.lr 0.01\)"):
        policy.learn_on_batch(batch)
    for k, v in policy.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def _ppo_batch(policy, n=256, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    out = policy.compute_actions(obs)
    return SampleBatch({SampleBatch.OBS: obs, SampleBatch.ACTIONS: out.actions, SampleBatch.ACTION_LOGP: out.logp,
                        SampleBatch.ACTION_DIST_INPUTS: out.dist_inputs, SampleBatch.VF_PREDS: out.values,
                        SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
                        SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32)})


@pytest.mark.parametrize(("activation", "n_actions"), [("tanh", 3), ("relu", 3), ("tanh", 2)])
def test_the_numpy_actor_follows_the_torch_model_through_learning_and_set_weights(activation, n_actions):
    """The built-in MLP + categorical acts in numpy on views of the torch weights: after SGD steps and
    after set_weights its logits, values, logp and greedy actions are the torch model's."""
    from rlrun.models.base import MLPConfig

    load_builtins()
    policy = make_policy("ppo", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(n_actions),
                         model_config=MLPConfig(activation=activation), seed=3)
    other = make_policy("ppo", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(n_actions),
                        model_config=MLPConfig(activation=activation), seed=4)
    assert policy._numpy is not None
    obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    for step in ("initial", "learned", "set_weights"):
        if step == "learned":
            policy.learn_on_batch(_ppo_batch(policy))
        if step == "set_weights":
            policy.set_weights(other.get_weights())
        with torch.inference_mode():
            ref = policy.model(torch.as_tensor(obs))
        greedy = policy.compute_actions(obs, explore=False)
        np.testing.assert_allclose(greedy.dist_inputs, ref.dist_inputs.numpy(), rtol=1e-5, atol=1e-6, err_msg=step)
        np.testing.assert_allclose(greedy.values, ref.values.numpy(), rtol=1e-5, atol=1e-6, err_msg=step)
        np.testing.assert_allclose(policy.compute_values(obs), ref.values.numpy(), rtol=1e-5, atol=1e-6)
        assert np.array_equal(greedy.actions, ref.dist_inputs.argmax(-1).numpy()), step
        logp_all = torch.log_softmax(ref.dist_inputs, -1).numpy()
        sampled = policy.compute_actions(obs)
        np.testing.assert_allclose(sampled.logp, logp_all[np.arange(64), sampled.actions], rtol=1e-5, atol=1e-6)
    assert not np.allclose(policy.get_weights()["pi_head.weight"], 0)


@pytest.mark.parametrize("bias", [[0.0, 1.0, 2.0], [0.0, 1.0]])  # two actions take their own path
def test_the_numpy_actor_samples_actions_with_their_probabilities(bias):
    load_builtins()
    policy = make_policy("pg", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(len(bias)), seed=0)
    with torch.no_grad():
        policy.model.pi_head.bias.copy_(torch.tensor(bias))  # probabilities ~ 0.09 / 0.24 / 0.67 or 0.27 / 0.73
    obs = np.zeros((20_000, 4), np.float32)
    out = policy.compute_actions(obs)
    probs = torch.softmax(policy.model(torch.as_tensor(obs[:1])).dist_inputs, -1)[0].detach().numpy()
    freq = np.bincount(out.actions, minlength=len(bias)) / len(obs)
    np.testing.assert_allclose(freq, probs, atol=0.015)
    np.testing.assert_allclose(out.logp, np.log(probs)[out.actions], rtol=1e-5)
    assert out.actions.dtype == np.int64 and out.logp.dtype == np.float32


@pytest.mark.parametrize("free_log_std", [True, False])
def test_the_numpy_actor_samples_a_gaussian_like_the_torch_distribution(free_log_std):
    """Box actions from the built-in MLP act in numpy too: the means and log-stds are the torch
    model's (after an SGD step as well), greedy actions are the means, sampled actions have the
    distribution's moments and their logp is DiagGaussian.logp."""
    from rlrun.models.base import MLPConfig
    from rlrun.models.distributions import DiagGaussian

    load_builtins()
    space = gym.spaces.Box(-2, 2, (2,), np.float32)
    policy = make_policy("ppo", gym.spaces.Box(-5, 5, (3,), np.float32), space,
                         model_config=MLPConfig(free_log_std=free_log_std), seed=1)
    assert policy._numpy is not None and policy._numpy.gaussian
    obs = np.random.default_rng(2).normal(size=(4000, 3)).astype(np.float32)
    seen = []
    for step in ("initial", "learned"):
        if step == "learned":
            policy.learn_on_batch(_ppo_batch_box(policy, obs[:256]))
        with torch.inference_mode():
            ref = policy.model(torch.as_tensor(obs))
        greedy = policy.compute_actions(obs, explore=False)
        np.testing.assert_allclose(greedy.dist_inputs, ref.dist_inputs.numpy(), rtol=1e-5, atol=1e-6, err_msg=step)
        np.testing.assert_allclose(greedy.actions, ref.dist_inputs[:, :2].numpy(), rtol=1e-5, atol=1e-6)
        out = policy.compute_actions(obs)
        dist = DiagGaussian(ref.dist_inputs)
        expected = dist.logp(torch.as_tensor(out.actions)).numpy()
        np.testing.assert_allclose(out.logp, expected, rtol=1e-4, atol=1e-5, err_msg=step)
        np.testing.assert_allclose(policy.logp_of(out.dist_inputs, out.actions), expected, rtol=1e-4, atol=1e-5)
        z = (out.actions - dist.mean.numpy()) / dist.std.numpy()
        assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05, (z.mean(), z.std())
        assert out.actions.dtype == np.float32 and out.logp.dtype == np.float32
        seen.append(greedy.dist_inputs)
    assert not np.allclose(seen[0], seen[1])  # the SGD step moved the means and log-stds the numpy actor reads


def _ppo_batch_box(policy, obs):
    rng = np.random.default_rng(0)
    out = policy.compute_actions(obs)
    n = len(obs)
    return SampleBatch({SampleBatch.OBS: obs, SampleBatch.ACTIONS: out.actions, SampleBatch.ACTION_LOGP: out.logp,
                        SampleBatch.ACTION_DIST_INPUTS: out.dist_inputs, SampleBatch.VF_PREDS: out.values,
                        SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
                        SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32)})


def _big_loss(policy, model, dist_class, batch):
    return LossOutput((model(batch[SampleBatch.OBS]).values * 100.0).pow(2).mean())


@pytest.mark.parametrize("clip", [None, 0.5, 1e9])
def test_apply_gradients_steps_as_torch_clip_grad_norm_does(clip):
    """Policy.apply_gradients skips clip_grad_norm_'s multiply by 1 when nothing is clipped: the
    returned norm, the gradients and the weights after the step are exactly torch's."""
    load_builtins()
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    made = [make_policy("pg", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(2),
                        algo_config=PGConfig(lr=0.01, grad_clip=clip), loss_fn=_big_loss, seed=1) for _ in range(2)]
    ours, ref = made
    norm = ours.apply_gradients(_big_loss(ours, ours.model, None, {SampleBatch.OBS: torch.from_numpy(obs)}).total)
    ref.optimizer.zero_grad()
    _big_loss(ref, ref.model, None, {SampleBatch.OBS: torch.from_numpy(obs)}).total.backward()
    want = torch.nn.utils.clip_grad_norm_(list(ref.model.parameters()), clip if clip is not None else float("inf"))
    ref.optimizer.step()
    assert norm == float(want) and norm > 1.0
    for (k, a), b in zip(ours.model.state_dict().items(), ref.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    grads = [(a.grad, b.grad) for a, b in zip(ours.model.parameters(), ref.model.parameters(), strict=True)]
    assert all((a is None) == (b is None) for a, b in grads) and any(a is not None for a, _ in grads)
    assert all(torch.equal(a, b) for a, b in grads if a is not None)
