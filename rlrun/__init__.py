"""rlrun: a small, typed, fast reinforcement-learning experiment runner.

Names are imported lazily, so ``import rlrun.tracking`` (e.g. in the MLflow child process) does not
pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "SampleBatch": "rlrun.batch", "MultiAgentBatch": "rlrun.batch", "concat_samples": "rlrun.batch",
    "LossOutput": "rlrun.policy", "Policy": "rlrun.policy", "PolicySpec": "rlrun.policy",
    "Algorithm": "rlrun.algorithm", "register_algorithm": "rlrun.algorithm", "make_policy": "rlrun.algorithm",
    "Callbacks": "rlrun.callbacks", "CALLBACKS": "rlrun.registry", "WRAPPERS": "rlrun.registry",
    "ALGOS": "rlrun.registry", "DISTRIBUTIONS": "rlrun.registry", "ENVS": "rlrun.registry",
    "LOSSES": "rlrun.registry", "MODELS": "rlrun.registry", "OPTIMIZERS": "rlrun.registry",
    "run": "rlrun.runner", "make_trainer": "rlrun.runner", "RunConfig": "rlrun.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlrun' has no attribute {name!r}")
