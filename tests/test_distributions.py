import gymnasium as gym
import numpy as np
import torch

from rlrun.models.distributions import Categorical, DiagGaussian, default_distribution


def test_categorical_matches_torch():
    logits = torch.randn(5, 3)
    ours, ref = Categorical(logits), torch.distributions.Categorical(logits=logits)
    a = torch.tensor([0, 1, 2, 1, 0])
    torch.testing.assert_close(ours.logp(a), ref.log_prob(a))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    other = torch.randn(5, 3)
    torch.testing.assert_close(
        ours.kl(Categorical(other)),
        torch.distributions.kl_divergence(ref, torch.distributions.Categorical(logits=other)),
    )


def test_categorical_sampling_frequencies():
    logits = torch.log(torch.tensor([[0.2, 0.8]])).expand(20000, 2)
    g = torch.Generator().manual_seed(0)
    s = Categorical(logits).sample(g)
    assert abs(s.float().mean().item() - 0.8) < 0.02


def test_diag_gaussian_matches_torch():
    mean, log_std = torch.randn(4, 2), torch.randn(4, 2) * 0.3
    d = DiagGaussian(torch.cat([mean, log_std], -1))
    ref = torch.distributions.Independent(torch.distributions.Normal(mean, log_std.exp()), 1)
    a = torch.randn(4, 2)
    torch.testing.assert_close(d.logp(a), ref.log_prob(a))
    torch.testing.assert_close(d.entropy(), ref.entropy())
    m2, s2 = torch.randn(4, 2), torch.randn(4, 2) * 0.3
    ref2 = torch.distributions.Independent(torch.distributions.Normal(m2, s2.exp()), 1)
    torch.testing.assert_close(d.kl(DiagGaussian(torch.cat([m2, s2], -1))),
                               torch.distributions.kl_divergence(ref, ref2))


def test_defaults_and_required_inputs():
    assert default_distribution(gym.spaces.Discrete(3)) == "categorical"
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    assert default_distribution(box) == "diag_gaussian"
    assert DiagGaussian.required_inputs(box) == 4
