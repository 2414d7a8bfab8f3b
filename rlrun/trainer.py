"""Trainer: coordinates one training iteration.

    sample from every worker until train_batch_size env steps -> concat -> learn -> sync weights
    -> result dict (counters + ``namespace/name`` metrics)

An algorithm subclasses ``Trainer`` once, sets its config schema, default loss, postprocess
function and the columns it produces, and overrides at most a hook (``learn``, ``after_learn``).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from rlrun.batch import SampleBatch, concat_samples
from rlrun.config import AlgoConfig, RunConfig
from rlrun.envs import make_vector_env
from rlrun.evaluation import EVAL_METRICS, EvalResult, evaluate
from rlrun.policy import ActionFn, InitFn, Policy, PolicySpec, PostprocessFn, build_policy
from rlrun.registry import ALGOS, LOSSES, Entry, load_plugins
from rlrun.worker_set import WorkerSet

ROLLOUT_METRICS = (
    "rollout/episode_return_mean", "rollout/episode_return_min", "rollout/episode_return_max",
    "rollout/episode_len_mean", "rollout/episodes_this_iter", "rollout/env_steps_this_iter",
)
TIME_METRICS = ("time/env_steps_per_s", "time/env_steps_trained_per_s", "time/sample_s", "time/learn_s",
                "time/sync_weights_s", "time/iteration_s", "time/num_healthy_workers", "time/num_worker_restarts",
                "time/num_dropped_fragments")
POLICY_METRICS = ("loss/total", "train/grad_norm", "train/lr", "train/num_sgd_steps",
                  "train/explained_variance")
COLLECTED_COLUMNS = (SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.TERMINATEDS,
                     SampleBatch.TRUNCATEDS, SampleBatch.EPS_ID, SampleBatch.ACTION_LOGP,
                     SampleBatch.VF_PREDS, SampleBatch.ACTION_DIST_INPUTS)
EPISODE_WINDOW = 100  # episode metrics are means over the last 100 completed episodes


def reported_metrics(algo_cls: type[Trainer], loss: Entry[Any]) -> list[str]:
    """Every metric name a run of ``algo_cls`` with ``loss`` reports (valid ``stop`` keys)."""
    names = [*ROLLOUT_METRICS, *TIME_METRICS, *POLICY_METRICS, *EVAL_METRICS, *algo_cls.metrics]
    names += [f"loss/{t}" for t in loss.info.get("terms", ())]
    names += [f"train/{s}" for s in loss.info.get("stats", ())]
    return sorted(set(names))


@dataclass
class PolicyFactory:
    """Builds this run's Policy from names: plain data, so it travels to Ray actors, where it
    imports the run's plugins before reading the registries."""

    cfg: RunConfig
    launch_dir: str

    def __call__(self, obs_space: Any, action_space: Any) -> Policy:
        c = self.cfg
        load_plugins(c.plugins, search_dirs=[self.launch_dir])
        algo_cls = ALGOS.get(c.algo.name)
        policy_cls = build_policy(
            c.algo.name, loss_fn=LOSSES.get(c.loss.name), postprocess_fn=algo_cls.postprocess_fn,
            action_fn=algo_cls.action_fn, init_fn=algo_cls.init_fn, needs_next_obs=algo_cls.needs_next_obs,
        )
        return policy_cls(PolicySpec(obs_space, action_space, c.algo, c.loss, c.model, c.seed))


class Trainer:
    """Base trainer for synchronous on-policy algorithms (PG, PPO)."""

    config_cls: ClassVar[type[AlgoConfig]] = AlgoConfig
    default_loss: ClassVar[str] = "pg"
    postprocess_fn: ClassVar[PostprocessFn | None] = None
    action_fn: ClassVar[ActionFn | None] = None  # None: sample from the action distribution
    init_fn: ClassVar[InitFn | None] = None
    needs_next_obs: ClassVar[bool] = False
    async_sampling: ClassVar[bool] = False  # learn on whatever fragments arrived (APPO)
    provides_columns: ClassVar[tuple[str, ...]] = COLLECTED_COLUMNS
    metrics: ClassVar[tuple[str, ...]] = ()  # extra metric names this algo reports

    def __init__(self, cfg: RunConfig, launch_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.config = cfg.algo
        self.policy_factory = PolicyFactory(cfg, str(Path(launch_dir or os.getcwd()).resolve()))
        self.workers = WorkerSet(cfg, self.policy_factory)
        self.policy: Policy = self.workers.local_worker.policy
        self.iteration = 0
        self.timesteps_total = 0
        self.episodes_total = 0
        self.time_total_s = 0.0
        self._returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self._lengths: deque[int] = deque(maxlen=EPISODE_WINDOW)
        self._eval_env: Any = None
        self.setup()

    # ------------------------------------------------------------------ hooks
    def setup(self) -> None:
        """Called once after workers and policy exist."""

    def learn(self, batch: SampleBatch) -> dict[str, float]:
        return self.policy.learn_on_batch(batch)

    def after_learn(self, stats: dict[str, float]) -> None:
        """Called after every learn step with its stats (e.g. adapt a KL coefficient)."""

    # ------------------------------------------------------------------ the iteration
    def sample_batch(self) -> SampleBatch:
        """Fragments from all workers until ``train_batch_size`` env steps (exact counts are
        reported: each fragment may hold up to num_envs - 1 extra rows)."""
        batches: list[SampleBatch] = []
        n = 0
        while n < self.config.train_batch_size:
            if self.async_sampling:
                got = self.workers.sample_async(getattr(self.config, "broadcast_interval", 1))
            else:
                got = self.workers.sample()
            for b in got:
                batches.append(b)
                n += len(b)
        return concat_samples(batches)

    def train(self) -> dict[str, float]:
        """Run one iteration; return counters and metrics."""
        t0 = time.perf_counter()
        batch = self.sample_batch()
        t1 = time.perf_counter()
        steps = len(batch)
        self.timesteps_total += steps
        self.policy.global_timestep = self.timesteps_total
        stats = self.learn(batch)
        self.after_learn(stats)
        t2 = time.perf_counter()
        self.workers.sync_weights(broadcast=not self.async_sampling)
        t3 = time.perf_counter()
        self.iteration += 1
        self.time_total_s += t3 - t0
        episodes = self.workers.get_metrics()
        self._add_episodes(episodes.returns, episodes.lengths)
        result: dict[str, float] = {
            "training_iteration": self.iteration,
            "timesteps_total": self.timesteps_total,
            "episodes_total": self.episodes_total,
            "time_total_s": self.time_total_s,
            **self._episode_metrics(len(episodes.returns)),
            "rollout/env_steps_this_iter": steps,
            "time/env_steps_per_s": steps / max(t3 - t0, 1e-9),
            "time/env_steps_trained_per_s": steps / max(t3 - t0, 1e-9),  # the learner's throughput
            "time/sample_s": t1 - t0,
            "time/learn_s": t2 - t1,
            "time/sync_weights_s": t3 - t2,
            "time/iteration_s": t3 - t0,
            "time/num_healthy_workers": self.workers.num_healthy_workers,
            "time/num_worker_restarts": self.workers.num_worker_restarts,
            "time/num_dropped_fragments": self.workers.num_dropped_fragments,
            **stats,
        }
        ev = self.cfg.evaluation
        if ev.interval and self.iteration % ev.interval == 0:
            result.update(self.evaluate().metrics())
        return result

    def evaluate(self) -> EvalResult:
        """Greedy episodes with the current policy on separate, reused envs."""
        ev = self.cfg.evaluation
        if self._eval_env is None:
            n = max(1, min(ev.num_envs, ev.num_episodes))
            e = self.cfg.env
            self._eval_env = make_vector_env(e.id, n, e.kwargs, e.vectorize)
        return evaluate(self.policy, self.cfg.env, ev.num_episodes, ev.num_envs, self.cfg.seed, self._eval_env)

    def _add_episodes(self, returns: Iterable[float], lengths: Iterable[int]) -> None:
        for r, n in zip(returns, lengths, strict=True):
            self._returns.append(r)
            self._lengths.append(n)
            self.episodes_total += 1

    def _episode_metrics(self, num_new: int) -> dict[str, float]:
        nan = math.nan
        r = np.asarray(self._returns, dtype=np.float64)
        return {
            "rollout/episode_return_mean": float(r.mean()) if len(r) else nan,
            "rollout/episode_return_min": float(r.min()) if len(r) else nan,
            "rollout/episode_return_max": float(r.max()) if len(r) else nan,
            "rollout/episode_len_mean": float(np.mean(self._lengths)) if len(r) else nan,
            "rollout/episodes_this_iter": float(num_new),
        }

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue: policy (weights, optimizer), counters, RNG states and the
        algorithm's own state. Tensors, numbers, strings and containers only (``weights_only`` safe)."""
        return {
            "policy": self.policy.get_state(),
            "counters": {
                "training_iteration": self.iteration,
                "timesteps_total": self.timesteps_total,
                "episodes_total": self.episodes_total,
                "time_total_s": self.time_total_s,
            },
            "episodes": {"returns": list(self._returns), "lengths": list(self._lengths)},
            "rng": {
                "torch": torch.get_rng_state(),
                "policy_torch": self.policy.generator.get_state(),
                "policy_numpy": self.policy.np_rng.bit_generator.state,
            },
            "algo": self.extra_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Inverse of ``get_state``; remote workers get the restored weights at once."""
        self.policy.set_state(state["policy"])
        c = state["counters"]
        self.iteration = int(c["training_iteration"])
        self.timesteps_total = int(c["timesteps_total"])
        self.episodes_total = int(c["episodes_total"])
        self.time_total_s = float(c["time_total_s"])
        self._returns = deque(state["episodes"]["returns"], maxlen=EPISODE_WINDOW)
        self._lengths = deque(state["episodes"]["lengths"], maxlen=EPISODE_WINDOW)
        torch.set_rng_state(state["rng"]["torch"])
        self.policy.generator.set_state(state["rng"]["policy_torch"])
        self.policy.np_rng.bit_generator.state = state["rng"]["policy_numpy"]
        self.set_extra_state(state.get("algo") or {})
        self.workers.sync_weights()

    def extra_state(self) -> dict[str, Any]:
        """Algorithm-specific state to checkpoint (hook; e.g. a target network, a KL coefficient)."""
        return {}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` returned (hook)."""

    def stop(self) -> None:
        if self._eval_env is not None:
            self._eval_env.close()
        self.workers.stop()
