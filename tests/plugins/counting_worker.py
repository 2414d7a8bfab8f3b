"""A plugin worker kind, written against rlrun's public surface only, as a simulator that needs its own
worker would bring one: it registers an env, ``CountingCartPole``, and a worker kind that takes the runs
on it (ahead of the built-in ``env`` kind): the env worker, counting the fragments it samples."""

import gymnasium as gym

from rlrun import ENVS, WORKERS, RolloutWorker

SAMPLED: list[int] = []  # fragments sampled by each CountingWorker made in this process


@ENVS.register("CountingCartPole", vector=False)
def counting_cartpole(**kwargs):
    return gym.make("CartPole-v1", **kwargs)


class CountingWorker(RolloutWorker):
    def __init__(self, spec, policy_factory):
        super().__init__(spec, policy_factory)
        self.index = len(SAMPLED)
        SAMPLED.append(0)

    def sample(self):
        SAMPLED[self.index] += 1
        return super().sample()


@WORKERS.register("counting", order=50, when=lambda cfg, local: cfg.env.id == "CountingCartPole")
def counting():
    return CountingWorker
