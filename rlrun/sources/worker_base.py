"""What every rollout worker shares: the policy factory, the worker spec, episode statistics, the
worker interface (``WorkerBase``) and the end of every fragment (bootstrap values, postprocessing,
flattening the time-major buffer of valid rows).

A worker's buffer is time-major, ``[T, slots]``: a single-agent worker's slots are its sub-envs, a
multi-agent worker's are (agent, env copy) pairs per policy; rows marked invalid (autoreset steps,
agents not acting, dropped tails) never enter a batch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rlrun.algos.algorithm import get_algorithm
from rlrun.config.multi_agent import policy_configs, policy_sections
from rlrun.config.schemas import EnvConfig, RolloutConfig, RunConfig
from rlrun.core.registry import HEURISTICS, LOSSES
from rlrun.data.batch import SampleBatch
from rlrun.envs.filters import NoFilter
from rlrun.policy.policy import DEFAULT_POLICY_ID, Policy, PolicyMap, PolicySpec
from rlrun.policy.policy_map import run_spaces
from rlrun.sources.callbacks import CallbackList, EpisodeTracker
from rlrun.sources.plugins import load_plugins

SB = SampleBatch
NO_FILTER = NoFilter()  # heuristic policies have no observation filter
VALID = "valid"  # time-major fragments only: False on dummy autoreset rows and dropped tails


@dataclass
class PolicyFactory:
    """Builds a run's policy map from names: plain data, so it travels to Ray actors, where it
    imports the run's plugins before reading the registries."""

    cfg: RunConfig
    launch_dir: str

    def __call__(self, obs_space: gym.Space, action_space: gym.Space) -> PolicyMap:
        """A single-agent run's policy map, from its env's spaces."""
        return self.policies({DEFAULT_POLICY_ID: (obs_space, action_space)})

    def build(self) -> tuple[PolicyMap, dict[str, tuple[gym.Space, gym.Space]]]:
        """The run's policies, with their spaces declared or read from one env copy (outside a worker:
        exports, resume checks). Returns the policy map and ``{policy_id: (obs space, action space)}``."""
        spaces = run_spaces(self.cfg)
        return self.policies(spaces), spaces

    def filter_settings(self) -> tuple[str, float]:
        r = self.cfg.rollout
        return r.observation_filter, r.observation_filter_clip

    def policies(self, spaces: Mapping[str, tuple[gym.Space, gym.Space]]) -> PolicyMap:
        """``{policy_id: (obs space, action space)}`` -> the run's policy map: each learned policy with
        its own config (``multiagent.policies.<id>``; the run's own for ``default_policy``) and seed;
        heuristics by name."""
        c = self.cfg
        load_plugins(c.plugins, search_dirs=[self.launch_dir])
        algo = get_algorithm(c.algo.name)
        out: PolicyMap = {}
        for i, (pid, pc) in enumerate(policy_configs(c).items()):
            obs_space, action_space = spaces[pid]
            seed = c.seed + 7919 * i  # each policy its own initial weights and action noise
            if pc.heuristic is not None:
                out[pid] = HEURISTICS.get(pc.heuristic)(pid, obs_space, action_space, seed, **pc.heuristic_kwargs)
                continue
            pcfg = policy_sections(c, pid)
            spec = PolicySpec(obs_space, action_space, pcfg.algo, pcfg.loss, pcfg.model, seed, *self.filter_settings())
            out[pid] = Policy(spec, algo, LOSSES.get(pcfg.loss.name, "loss.name"), pid)
        return out


def make_policy_factory(cfg: RunConfig, launch_dir: str | Path | None = None) -> PolicyFactory:
    return PolicyFactory(cfg, str(Path(launch_dir or os.getcwd()).resolve()))


class EpisodeStats(NamedTuple):
    """What a worker reports besides its samples: the episodes finished since its last report, and
    what its observation filters saw meanwhile."""

    returns: list[float]  # per finished episode (multi-agent: summed over its agents)
    lengths: list[int]
    policy_returns: dict[str, list[float]] | None = None  # multi-agent: policy id -> its agents' episode returns
    custom: dict[str, list[float]] | None = None  # callbacks' custom metrics: name -> one value per episode
    filter_deltas: dict[str, Any] | None = None  # policy id -> observation-filter statistics since the last report


@dataclass
class WorkerSpec:
    """Plain data from which a worker (local or remote) builds its env."""

    env: EnvConfig
    rollout: RolloutConfig
    seed: int
    worker_index: int = 0  # 0 = the local worker
    plugins: tuple[str, ...] = ()  # imported first, so plugin envs/models/losses exist in a remote worker
    launch_dir: str | None = None  # where plugin modules are looked up
    callbacks: tuple[str, ...] = ()  # registered Callbacks names, called in order
    record_next_obs: bool = False  # add NEXT_OBS even if the algorithm does not need it (``output`` records it)
    server_token: str | None = field(default=None, repr=False)  # rollout=server on Ray workers: the driver's token
    server_port: int | None = None  # a restarted Ray worker's policy server: the port its clients know


class WorkerBase:
    """What every rollout worker (single- or multi-agent, local or a Ray actor) answers besides
    ``sample()``: episodes finished since the last call, and its policies' weights."""

    policy_map: PolicyMap
    _episodes: EpisodeStats
    callbacks: CallbackList
    _tracker: EpisodeTracker | None = None

    def sample(self) -> Any:
        raise NotImplementedError

    def sample_with_metrics(self) -> tuple[Any, EpisodeStats]:
        """``sample()`` plus the episodes completed meanwhile: one round trip for a remote worker."""
        return self.sample(), self.get_metrics()

    def get_pid(self) -> int:
        return os.getpid()

    def mark_interrupted(self) -> None:
        """The run stops without finishing (signal, failure); called before ``stop()``."""

    def reseed(self, seed: int) -> None:
        """A resumed run: start the envs afresh from ``seed`` in place of the run's seed (as the constructor
        seeds them from it), so that they do not replay the episodes the run started with. Workers without
        envs of their own ignore it."""

    def extra_metrics(self) -> dict[str, float]:
        """Metrics of this kind of worker beyond episodes (the policy server's requests): counts, so
        the WorkerSet sums them over its workers."""
        return {}

    def node_id(self) -> str:
        """The Ray node this worker runs on (a Ray actor only)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def address(self) -> str | None:
        """Where external applications reach this worker (its policy server's URL), if anywhere."""
        return None

    def get_metrics(self) -> EpisodeStats:
        """Episodes completed since the last call (and forget them), custom metrics, filter deltas."""
        out, self._episodes = self._episodes, EpisodeStats([], [], {})
        deltas = {pid: d for pid, p in self.policy_map.items()
                  if (d := getattr(p, "obs_filter", NO_FILTER).pop_delta()) is not None}
        return out._replace(custom=self._tracker.pop_custom() if self._tracker else None, filter_deltas=deltas)

    def get_filters(self) -> dict[str, dict[str, Any]]:
        """``{policy_id: observation-filter state}`` of the policies that have an active filter."""
        return {pid: f.get_state() for pid, p in self.policy_map.items()
                if (f := getattr(p, "obs_filter", NO_FILTER)).active}

    def apply_filter_deltas(self, deltas: Mapping[str, Any]) -> None:
        """The learner: merge what a remote worker's filters saw into this (central) copy."""
        for pid, delta in deltas.items():
            self.policy_map[pid].obs_filter.apply_delta(delta)

    def get_weights(self) -> dict[str, dict[str, np.ndarray]]:
        """``{policy_id: weights}`` of every policy on this worker."""
        return {pid: p.get_weights() for pid, p in self.policy_map.items()}

    def set_weights(self, weights: Mapping[str, Mapping[str, np.ndarray]], global_timestep: int | None = None,
                    filters: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """New weights per policy id, the learner's env-step count (it drives schedules such as
        epsilon) and its merged observation-filter statistics."""
        for pid, w in weights.items():
            policy = self.policy_map[pid]
            policy.set_weights(w)
            if global_timestep is not None:
                policy.global_timestep = global_timestep
        for pid, state in (filters or {}).items():
            self.policy_map[pid].obs_filter.sync(state)


def flatten_fragment(frag: SampleBatch) -> SampleBatch:
    """Time-major ``[T, B, ...]`` fragment -> flat batch of its valid rows, sub-env by sub-env
    (so each episode's rows are contiguous and in time order)."""
    valid = frag[VALID].T  # [B, T]
    out = SampleBatch()
    for k, v in frag.items():
        if k != VALID:
            dict.__setitem__(out, k, np.swapaxes(v, 0, 1)[valid])
    return out


def finish_fragment(policy: Any, frag: SampleBatch, last_obs: np.ndarray, state: list[np.ndarray] | None,
                    record_next_obs: bool, last_values: np.ndarray | None = None) -> SampleBatch:
    """A policy's time-major fragment ``[T, slots]`` -> its postprocessed flat batch of valid rows.
    ``last_obs``/``state``: what each slot sees after the last step (the bootstrap values'
    input; a slot whose row there is invalid holds its final observation). ``last_values``: those
    values when the caller has them already (the policy server's)."""
    if policy.needs_next_obs or record_next_obs:  # the dummy row's obs is the final obs
        frag[SB.NEXT_OBS] = np.concatenate([frag[SB.OBS][1:], last_obs[None]], axis=0)
    if last_values is None:
        last_values = policy.compute_values(last_obs, state) if policy.hooks.bootstrap_values else \
            np.zeros(len(last_obs), np.float32)
    return flatten_fragment(policy.postprocess_trajectory(frag, last_values))
