"""rlrun: a small, typed, fast reinforcement-learning experiment runner."""

from rlrun.batch import MultiAgentBatch, SampleBatch, concat_samples
from rlrun.policy import LossOutput, Policy, build_policy
from rlrun.registry import ALGOS, DISTRIBUTIONS, ENVS, LOSSES, MODELS

__version__ = "0.1.0"

__all__ = [
    "ALGOS", "DISTRIBUTIONS", "ENVS", "LOSSES", "MODELS", "LossOutput", "MultiAgentBatch", "Policy",
    "SampleBatch", "build_policy", "concat_samples", "run",
]


def __getattr__(name: str):  # lazy: `import rlrun` stays cheap
    if name == "run":
        from rlrun.run import run

        return run
    raise AttributeError(name)
