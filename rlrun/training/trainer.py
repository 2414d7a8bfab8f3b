"""Trainer: coordinates one training iteration, the same for every algorithm.

    experience (workers, other sources) until train_batch_size rows -> for each policy to train:
    algorithm.learn(policy, batch) -> sync weights -> result dict (counters + metrics) -> hooks
    (evaluation, off-policy estimates, callbacks: rlrun/training/hooks.py)

An algorithm changes what happens through its ``Algorithm`` hooks (rlrun/algos/algorithm.py), never by
subclassing the Trainer. The Trainer owns the counters and the episode window; each Policy owns its
weights, optimizer and learner state.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlrun.algos.algorithm import LearnContext, get_algorithm
from rlrun.config.multi_agent import policies_to_train
from rlrun.config.schemas import RunConfig
from rlrun.core.metrics import DEFAULT_POLICY_ID, mean_min_max, per_policy
from rlrun.policy.policy import Policy, PolicyMap, average_stats
from rlrun.sources.callbacks import CallbackList, custom_metric_summary
from rlrun.sources.offline_input import Experience
from rlrun.sources.worker_base import make_policy_factory
from rlrun.sources.worker_set import WorkerSet
from rlrun.training import ope  # noqa: F401  (registers its hook)
from rlrun.training.evaluation import EvalResult
from rlrun.training.evaluator import Evaluator
from rlrun.training.hooks import IterationHook, build_hooks


def resume_seed(seed: int, timesteps: int) -> int:
    """The workers' seed in a run resumed at ``timesteps`` env steps: fresh (its envs do not replay the
    initial states they started the run with), still determined by the run's seed and where it resumed."""
    return int(np.random.SeedSequence([seed % 2**63, timesteps]).generate_state(1)[0])


class Trainer:
    """One run's training loop state: workers, the learner's policy map, counters."""

    def __init__(self, cfg: RunConfig, launch_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.config = cfg.algo
        self.algorithm = get_algorithm(cfg.algo.name)
        self.policy_factory = make_policy_factory(cfg, launch_dir)
        self.workers = WorkerSet(cfg, self.policy_factory)
        local = self.workers.local_worker
        self.policies: PolicyMap = local.policy_map  # the learner's policies
        self.policies_to_train: list[str] = policies_to_train(cfg)  # [default_policy] in a single-agent run
        self.callbacks: CallbackList = local.callbacks  # one instance with the local worker
        self.experience = Experience(cfg, self._sample, self.policies)
        self.evaluator = Evaluator(cfg, self.policies)
        self.iteration = 0
        self.timesteps_total = 0
        self.episodes_total = 0
        self.time_total_s = 0.0
        self.window = cfg.metrics_num_episodes_for_smoothing  # rollout/episode_* are over this many episodes
        self._returns: deque[float] = deque(maxlen=self.window)
        self._lengths: deque[int] = deque(maxlen=self.window)
        # per named policy (the default policy's episodes are the run's own rollout/episode_*)
        self._policy_returns: dict[str, deque[float]] = {pid: deque(maxlen=self.window) for pid in self.policies
                                                         if pid != DEFAULT_POLICY_ID}
        self.hooks: list[IterationHook] = build_hooks(self)  # evaluation, off-policy estimates, callbacks, ...

    @property
    def policy(self) -> Policy:
        """The default policy (the only one in a single-agent run)."""
        return self.policies[DEFAULT_POLICY_ID]

    # ------------------------------------------------------------------ the iteration
    def sample_batch(self) -> Any:
        """``train_batch_size`` rows from the run's ``input`` (rlrun/sources/offline_input.py):
        fragments from all workers (multi-agent: env or agent steps, ``multiagent.count_steps_by``;
        each fragment may hold up to num_envs - 1 extra rows, and exact counts are reported), rows of
        other experience sources, or both. A SampleBatch, or a MultiAgentBatch in a multi-agent run."""
        return self.experience.next_batch(self.config.train_batch_size)[0]

    def _sample(self, rows: int) -> list[Any]:
        """Fragments from the workers until they hold at least ``rows`` steps."""
        interval = self.algorithm.async_broadcast_interval
        batches: list[Any] = []
        n = 0
        by_agents = self.cfg.multiagent.count_steps_by == "agent_steps"
        while n < rows:
            got: list[Any] = self.workers.sample() if interval is None else \
                self.workers.sample_async(interval(self.config))
            for b in got:
                batches.append(b)
                n += b.agent_steps() if by_agents else b.env_steps()
        return batches

    def learn(self, batch: Any) -> dict[str, float]:
        """Each trainable policy learns on its rows with its algorithm's learn hook (learner metrics of
        a named policy: ``train/<policy>/...``). A SampleBatch is the default policy's rows."""
        ctx = LearnContext(self.timesteps_total, self.iteration)
        stats: dict[str, float] = {}
        by_policy = batch.as_multi_agent().policy_batches
        for policy in self.policies.values():  # every policy acts at the run's step count (exploration
            policy.global_timestep = self.timesteps_total  # schedules), trained or not, as Ray workers set it
        for pid in self.policies_to_train:
            policy = self.policies[pid]
            if pid in by_policy and len(by_policy[pid]):
                got = self.algorithm.learn(policy, by_policy[pid], ctx)
                stats.update({per_policy(k, pid) if k.startswith("train/") else k: v for k, v in got.items()})
        return stats

    def train(self) -> dict[str, float]:
        """Run one iteration; return counters and metrics. An iteration is one round of sampling
        ``train_batch_size`` rows and learning on them, repeated until it has sampled
        ``min_sample_timesteps_per_iteration`` env steps and run ``min_time_s_per_iteration`` seconds
        (RLlib's keys; 0 and 0: one round): an off-policy run can take one update per env step (SB3's
        ``train_freq=1``) and still report, evaluate and record per thousand env steps, or per second."""
        t0 = time.perf_counter()
        env_steps = agent_steps = rows = 0
        sample_s = learn_s = sync_s = 0.0
        rounds: list[dict[str, float]] = []
        while True:
            a = time.perf_counter()
            batch = self.sample_batch()
            b = time.perf_counter()
            env_steps += batch.env_steps()
            agent_steps += batch.agent_steps()
            self.timesteps_total += batch.env_steps()
            rows_before = sum(p.num_rows_trained for p in self.policies.values())
            rounds.append(self.learn(batch))
            rows += sum(p.num_rows_trained for p in self.policies.values()) - rows_before
            c = time.perf_counter()
            self.workers.sync_weights(self.timesteps_total,
                                      broadcast=self.algorithm.async_broadcast_interval is None)
            d = time.perf_counter()
            sample_s, learn_s, sync_s = sample_s + b - a, learn_s + c - b, sync_s + d - c
            if (env_steps >= self.cfg.min_sample_timesteps_per_iteration
                    and d - t0 >= self.cfg.min_time_s_per_iteration):
                break
        t3 = time.perf_counter()
        stats = rounds[0] if len(rounds) == 1 else self._merge_rounds(rounds)
        self.iteration += 1
        self.time_total_s += t3 - t0
        episodes = self.workers.get_metrics()
        self._add_episodes(episodes.returns, episodes.lengths)
        for pid, returns in (episodes.policy_returns or {}).items():
            self._policy_returns[pid].extend(returns)
        result: dict[str, float] = {
            "training_iteration": self.iteration,
            "timesteps_total": self.timesteps_total,
            "episodes_total": self.episodes_total,
            "time_total_s": self.time_total_s,
            **self._episode_metrics(len(episodes.returns)),
            **self._policy_metrics(episodes.policy_returns or {}, agent_steps),
            "rollout/env_steps_this_iter": env_steps,
            "time/env_steps_per_s": env_steps / max(t3 - t0, 1e-9),
            "time/learn_throughput": rows / max(learn_s, 1e-9),
            "time/sample_s": sample_s,
            "time/learn_s": learn_s,
            "time/sync_weights_s": sync_s,
            "time/iteration_s": t3 - t0,
            **self._worker_metrics(),
            **custom_metric_summary(episodes.custom or {}),
            **self.experience.metrics(),
            **stats,
        }
        for hook in self.hooks:
            hook.after_iteration(self, result)
        return result

    def _merge_rounds(self, rounds: list[dict[str, float]]) -> dict[str, float]:
        """One iteration's learner metrics from its rounds: the mean over the rounds that reported each
        (losses, Q values, ...); the SGD steps summed; the algorithm's own gauges and counters
        (``Algorithm.metrics``: replay size, updates so far) and the learning rate as the last round left them."""
        merged = average_stats(rounds)
        last: dict[str, float] = {}
        for got in rounds:
            last.update(got)
        pids = self.policies_to_train
        for name in (*self.algorithm.metrics, "train/lr"):
            for key in {name, *(per_policy(name, pid) for pid in pids)}:
                if key in last:
                    merged[key] = last[key]
        for key in {per_policy("train/num_sgd_steps", pid) for pid in pids} | {"train/num_sgd_steps"}:
            if key in merged:
                merged[key] = sum(got.get(key, 0.0) for got in rounds)
        return merged

    def _policy_metrics(self, new: dict[str, list[float]], agent_steps: int) -> dict[str, float]:
        """``rollout/<policy>/...``: the episode returns of the agents each named policy acts for."""
        if not self._policy_returns:
            return {}
        out: dict[str, float] = {"rollout/agent_steps_this_iter": float(agent_steps)}
        for pid, window in self._policy_returns.items():
            out.update({**mean_min_max(f"rollout/{pid}/episode_return", window),
                        f"rollout/{pid}/episodes_this_iter": float(len(new.get(pid, ())))})
        return out

    def _worker_metrics(self) -> dict[str, float]:
        """Worker health; only with remote workers (in-process sampling has none to report), and what
        the local worker reports itself (the policy server's requests and abandoned episodes)."""
        w = self.workers
        if not w.num_workers:
            return w.extra_metrics()
        return {"workers/num_healthy": w.num_healthy_workers, "workers/num_restarts": w.num_worker_restarts,
                "workers/num_dropped_fragments": w.num_dropped_fragments, **w.extra_metrics()}

    def evaluate(self) -> EvalResult:
        """Greedy episodes with the current policies on separate, reused envs."""
        return self.evaluator.evaluate()

    def _add_episodes(self, returns: Iterable[float], lengths: Iterable[int]) -> None:
        for r, n in zip(returns, lengths, strict=True):
            self._returns.append(r)
            self._lengths.append(n)
            self.episodes_total += 1

    def _episode_metrics(self, num_new: int) -> dict[str, float]:
        return {
            **mean_min_max("rollout/episode_return", self._returns),
            "rollout/episode_len_mean": float(np.mean(self._lengths)) if self._lengths else math.nan,
            "rollout/episodes_this_iter": float(num_new),
        }

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue: every policy (weights, optimizer, RNGs, learner state),
        counters, the episode window and torch's global RNG. Tensors, numbers, strings and
        containers only (``weights_only`` safe)."""
        include = self.cfg.checkpoint.include_replay
        return {
            "policies": {pid: p.get_state(include_buffers=include) for pid, p in self.policies.items()},
            "counters": {
                "training_iteration": self.iteration,
                "timesteps_total": self.timesteps_total,
                "episodes_total": self.episodes_total,
                "time_total_s": self.time_total_s,
            },
            "episodes": {"returns": list(self._returns), "lengths": list(self._lengths),
                         "policy_returns": {pid: list(w) for pid, w in self._policy_returns.items()}},
            "rng": {"torch": torch.get_rng_state()},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Inverse of ``get_state``; remote workers get the restored weights at once."""
        for pid, policy_state in state["policies"].items():
            self.policies[pid].set_state(policy_state)
        c = state["counters"]
        self.iteration = int(c["training_iteration"])
        self.timesteps_total = int(c["timesteps_total"])
        self.episodes_total = int(c["episodes_total"])
        self.time_total_s = float(c["time_total_s"])
        self._returns = deque(state["episodes"]["returns"], maxlen=self.window)
        self._lengths = deque(state["episodes"]["lengths"], maxlen=self.window)
        for pid, returns in state["episodes"].get("policy_returns", {}).items():
            if pid in self._policy_returns:  # earlier checkpoints kept the default policy's too
                self._policy_returns[pid] = deque(returns, maxlen=self.window)
        torch.set_rng_state(state["rng"]["torch"])
        if self.timesteps_total:  # the envs were seeded as at the run's start: a resume starts them afresh
            self.workers.reseed(resume_seed(self.cfg.seed, self.timesteps_total))
        for hook in self.hooks:  # e.g. a snapshot policy the checkpoint does not hold
            restored = getattr(hook, "restored", None)
            if restored is not None:
                restored(self, state)
        self.workers.sync_weights(self.timesteps_total)

    def stop(self, finished: bool = True) -> None:
        """Close the envs and workers; the ``output`` writers write what they hold (running episodes too).
        ``finished=False``: the run was interrupted or failed (a policy server tells its clients to retry,
        not that the run is over)."""
        if not finished:
            self.workers.mark_interrupted()
        self.experience.close()
        for hook in self.hooks:
            hook.close()
        self.evaluator.close()
        self.workers.stop()
