"""Policy.learn_on_batch guards: a NaN/inf loss stops learning before the optimizer step."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.batch import SampleBatch
from rlrun.config import AlgoConfig, LossConfig
from rlrun.models import MLPConfig
from rlrun.policy import LossOutput, NonFiniteLossError, PolicySpec, build_policy
from rlrun.registry import load_builtins


def nan_loss(policy, model, dist_class, batch):
    out = model(batch[SampleBatch.OBS])
    return LossOutput(out.values.sum() * float("nan"))


def test_nan_loss_raises_and_leaves_the_weights_alone():
    load_builtins()
    cls = build_policy("nan_test", loss_fn=nan_loss)
    spec = PolicySpec(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), AlgoConfig(lr=0.01),
                      LossConfig(), MLPConfig())
    policy = cls(spec)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    batch = SampleBatch({SampleBatch.OBS: np.zeros((8, 4), np.float32)})
    with pytest.raises(NonFiniteLossError, match=r"loss/total is nan at env step 0 \(algo.lr 0.01\)"):
        policy.learn_on_batch(batch)
    for k, v in policy.model.state_dict().items():
        assert torch.equal(v, before[k]), k
