"""rlrun: a small, typed, fast reinforcement-learning experiment runner.

This package is rlrun's public surface: everything a user script or a plugin needs is imported from
``rlrun`` itself (``from rlrun import LOSSES, LossOutput, SampleBatch``); the modules under it are
internals that may move (ARCHITECTURE.md draws them). Names are imported lazily, so ``import rlrun``
costs nothing and ``from rlrun import PolicyClient`` does not import torch.

Module paths of the flat layout before 2026-11-25 (``rlrun.trainer``, ``rlrun.workers``,
``rlrun.config``, ``rlrun.cli``, ``rlrun.client``, ``rlrun.offline``, ...) still import for one
release, with a ``DeprecationWarning`` naming the public import to use instead.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlrun.core.moved import install_moved_paths
from rlrun.core.version import __version__ as __version__

_EXPORTS = {
    # data: batches and their column names, return math
    "SampleBatch": "rlrun.data.batch", "MultiAgentBatch": "rlrun.data.batch", "concat_samples": "rlrun.data.batch",
    "attempt_count_timesteps": "rlrun.data.batch",
    "compute_gae": "rlrun.data.postprocessing", "discounted_returns": "rlrun.data.postprocessing",
    "compute_nstep": "rlrun.data.postprocessing", "vtrace": "rlrun.data.postprocessing",
    "fragment_ends": "rlrun.data.postprocessing", "add_gae": "rlrun.data.postprocessing",
    "normalize_advantages": "rlrun.data.postprocessing", "explained_variance": "rlrun.data.postprocessing",
    "postprocess_episodes": "rlrun.data.postprocessing", "EpisodeWriter": "rlrun.data.episodes",
    # registries: what YAML names resolve to; plugins add entries
    "ALGOS": "rlrun.core.registry", "CALLBACKS": "rlrun.core.registry", "DISTRIBUTIONS": "rlrun.core.registry",
    "ENVS": "rlrun.core.registry", "HEURISTICS": "rlrun.core.registry", "LOSSES": "rlrun.core.registry",
    "MODELS": "rlrun.core.registry", "OPTIMIZERS": "rlrun.core.registry", "POLICY_MAPPINGS": "rlrun.core.registry",
    "WRAPPERS": "rlrun.core.registry", "SOURCES": "rlrun.core.registry", "HOOKS": "rlrun.core.registry",
    "WORKERS": "rlrun.core.registry",
    # config schemas a plugin extends
    "AlgoConfig": "rlrun.config.schemas", "LossConfig": "rlrun.config.schemas", "ModelConfig": "rlrun.config.schemas",
    "RunConfig": "rlrun.config.schemas", "ConfigError": "rlrun.config.typed",
    # models and action distributions
    "ModelOutput": "rlrun.models.base", "ActionDistribution": "rlrun.models.distributions",
    # policies, losses, algorithms
    "Policy": "rlrun.policy.policy", "PolicySpec": "rlrun.policy.policy", "LossOutput": "rlrun.policy.policy",
    "TorchBatch": "rlrun.policy.policy", "LearnerState": "rlrun.policy.policy", "ActionOutput": "rlrun.policy.policy",
    "DEFAULT_POLICY_ID": "rlrun.policy.policy", "HeuristicPolicy": "rlrun.policy.policy_map",
    "Stage": "rlrun.policy.loss", "StagedLoss": "rlrun.policy.loss",
    "Algorithm": "rlrun.algos.algorithm", "register_algorithm": "rlrun.algos.algorithm",
    "make_policy": "rlrun.algos.algorithm", "COLLECTED_COLUMNS": "rlrun.algos.algorithm",
    # RLlib's classic functional API: a loss (and postprocess/stats/optimizer functions) -> a policy
    # class -> a registered algorithm and trainer class
    "build_policy": "rlrun.algos.classic", "build_torch_policy": "rlrun.algos.classic",
    "build_tf_policy": "rlrun.algos.classic", "build_trainer": "rlrun.app.rllib",
    "compute_advantages": "rlrun.data.postprocessing", "Postprocessing": "rlrun.data.postprocessing",
    # Ray Tune: rlrun algorithms as Tune Trainables (RLlib's trainer classes' names)
    "trainable": "rlrun.app.tune_trainable", "RLrunTrainable": "rlrun.app.tune_trainable",
    **{f"{a}Trainer": "rlrun.app.tune_trainable" for a in ("PG", "A2C", "PPO", "APPO", "DQN", "SAC", "TD3", "DDPG")},
    # experience sources and callbacks
    "ExperienceSource": "rlrun.sources.source", "SourceContext": "rlrun.sources.source",
    "Callbacks": "rlrun.sources.callbacks", "IterationHook": "rlrun.training.hooks",
    "RolloutWorker": "rlrun.sources.rollout_worker", "WorkerBase": "rlrun.sources.worker_base",
    "WorkerSpec": "rlrun.sources.worker_base",
    # running: from a script, and the external-application client
    "run": "rlrun.app.runner", "make_trainer": "rlrun.app.runner", "compose": "rlrun.app.compose",
    "PolicyClient": "rlrun.app.client", "RunFinished": "rlrun.app.client",
}
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlrun' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


install_moved_paths()
