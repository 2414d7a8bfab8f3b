"""Policy.learn_on_batch guards: a NaN/inf loss stops learning before the optimizer step."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algorithm import make_policy
from rlrun.algos.pg import PGConfig
from rlrun.batch import SampleBatch
from rlrun.plugins import load_builtins
from rlrun.policy import LossOutput, NonFiniteLossError


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
