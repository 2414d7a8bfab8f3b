"""RolloutWorker: one vector env + a copy of the policy; runs in-process or as a Ray actor.

Gymnasium 1.x vector envs autoreset on the *next* step: after a sub-env reports terminated or
truncated, the following ``step`` ignores its action, resets it and returns reward 0. That dummy
step is recorded as an invalid row and never enters a batch. Its value prediction, computed on the
episode's final observation, is exactly the bootstrap value a truncated episode needs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from rlrun.algos.algorithm import get_algorithm
from rlrun.config.schemas import EnvConfig, RolloutConfig, RunConfig
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch
from rlrun.data.postprocessing import fragment_ends as fragment_ends  # re-exported
from rlrun.envs.filters import NoFilter
from rlrun.envs.make import env_from_config, env_spaces
from rlrun.models.sequences import STATE_IN
from rlrun.policy.policy import DEFAULT_POLICY_ID, ActionOutput, Policy, PolicyMap, PolicySpec
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
        c = self.cfg
        load_plugins(c.plugins, search_dirs=[self.launch_dir])
        algo = get_algorithm(c.algo.name)
        spec = PolicySpec(obs_space, action_space, c.algo, c.loss, c.model, c.seed, *self.filter_settings())
        return {DEFAULT_POLICY_ID: Policy(spec, algo, LOSSES.get(c.loss.name, "loss.name"), DEFAULT_POLICY_ID)}

    def build(self) -> tuple[PolicyMap, dict[str, tuple[gym.Space, gym.Space]]]:
        """The run's policies, with their spaces declared or read from one env copy (outside a worker:
        exports, resume checks). Returns the policy map and ``{policy_id: (obs space, action space)}``."""
        c = self.cfg
        if c.multiagent.policies:
            from rlrun.envs.multi_agent import make_multi_agent_env
            from rlrun.policy.policy_map import policy_spaces

            ma_env = make_multi_agent_env(c.env.id, c.env.kwargs)
            try:
                spaces = policy_spaces(c, ma_env)[2]
            finally:
                ma_env.close()
            return self.multi_agent(spaces), spaces
        spaces = {DEFAULT_POLICY_ID: env_spaces(c.env)}
        return self(*spaces[DEFAULT_POLICY_ID]), spaces

    def filter_settings(self) -> tuple[str, float]:
        r = self.cfg.rollout
        return r.observation_filter, r.observation_filter_clip

    def multi_agent(self, spaces: Mapping[str, tuple[gym.Space, gym.Space]]) -> PolicyMap:
        """A multi-agent run's policies, ``{policy_id: (obs space, action space)}`` -> policy map: learned
        policies with their own config (``multiagent.policies.<id>``) and seed; heuristics by name."""
        from rlrun.config.multi_agent import policy_sections
        from rlrun.core.registry import HEURISTICS

        c = self.cfg
        load_plugins(c.plugins, search_dirs=[self.launch_dir])
        algo = get_algorithm(c.algo.name)
        out: PolicyMap = {}
        for i, (pid, pc) in enumerate(c.multiagent.policies.items()):
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


class RolloutWorker(WorkerBase):
    """Samples fragments of ``rollout_fragment_length`` steps per sub-env with batched inference."""

    def __init__(self, spec: WorkerSpec, policy_factory: Callable[[gym.Space, gym.Space], PolicyMap]) -> None:
        self.spec = spec
        if spec.plugins or spec.worker_index > 0:
            load_plugins(list(spec.plugins), search_dirs=[spec.launch_dir] if spec.launch_dir else [])
        r = spec.rollout
        self.num_envs = int(r.num_envs_per_worker)
        self.fragment_length = int(r.rollout_fragment_length)
        self.complete_episodes = r.batch_mode == "complete_episodes"
        self.env = env_from_config(spec.env, self.num_envs)
        self.obs_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self._box = isinstance(self.action_space, gym.spaces.Box)
        self._low = getattr(self.action_space, "low", None)
        self._high = getattr(self.action_space, "high", None)
        self.policy_map: PolicyMap = policy_factory(self.obs_space, self.action_space)
        self.policy: Policy = self.policy_map[DEFAULT_POLICY_ID]
        self._filtered = self.policy.obs_filter.active
        self._recurrent = self.policy.recurrent
        self._initial_state = self.policy.initial_state(self.num_envs)  # [] unless the model is recurrent
        self._state = [s.copy() for s in self._initial_state]
        self.callbacks = CallbackList(spec.callbacks)
        self._tracker = EpisodeTracker(self.callbacks, self) if self.callbacks else None
        if spec.worker_index > 0:  # a remote worker: its own action noise, one thread (small MLPs)
            torch.set_num_threads(1)
            for policy in self.policy_map.values():
                policy.reseed(spec.seed + 1000 * spec.worker_index)
        # sub-env j of worker w is seeded with seed + 1000 * w + j (gymnasium adds j itself)
        raw, infos = self.env.reset(seed=spec.seed + 1000 * spec.worker_index)
        self.obs = self.policy.filter_obs(raw, update=True)
        n = self.num_envs
        self._prev_done = np.zeros(n, dtype=bool)  # these sub-envs take a dummy reset step next
        self._ep_return = np.zeros(n, dtype=np.float64)
        self._ep_len = np.zeros(n, dtype=np.int64)
        self._next_eps = n
        self._id_base = spec.worker_index << 40
        self._eps_id = self._id_base + np.arange(n, dtype=np.int64)
        self._episodes = EpisodeStats([], [])
        self._started = False
        self.explore = True  # False: greedy actions (rlrun-eval ... explore=false output=<dir>)
        if self._tracker:
            self._tracker.reset(raw, infos, self._eps_id)
        self.env_steps_sampled = 0

    # ------------------------------------------------------------------ sampling
    def sample(self) -> SampleBatch:
        """One fragment: at least ``rollout_fragment_length x num_envs`` rows (fewer than
        ``num_envs`` extra), postprocessed, rows of each episode contiguous and in time order."""
        n, target, complete = self.num_envs, self.fragment_length * self.num_envs, self.complete_episodes
        if complete and self._started:
            self._restart_episodes()
        self._started = True
        cap = self.fragment_length + self.fragment_length // 4 + 4
        buf = self._alloc(cap)
        last_end = np.full(n, -1, dtype=np.int64)  # complete_episodes: last step that ended an episode
        rows_at_end = np.zeros(n, dtype=np.int64)
        rows_per_env = np.zeros(n, dtype=np.int64)
        step = rows = 0
        while True:
            if step == cap:
                buf = self._grow(buf, cap)
                cap *= 2
            out = self.policy.compute_actions(self.obs, self.explore, self._state)  # the state: [] unless recurrent
            actions = out.actions
            env_actions = np.clip(actions, self._low, self._high) if self._box else actions
            raw_next, rew, term, trunc, infos = self.env.step(env_actions)
            next_obs = self.policy.filter_obs(raw_next, update=True) if self._filtered else raw_next
            valid = ~self._prev_done
            self._record(buf, step, out, rew, term, trunc, valid)
            np.add(self._ep_return, rew, out=self._ep_return, where=valid)
            self._ep_len += valid
            done = np.logical_or(term, trunc)
            done &= valid
            if complete:
                rows_per_env += valid
            if done.any():
                self._end_episodes(done)
                if complete:
                    last_end[done] = step
                    rows_at_end[done] = rows_per_env[done]
            if self._tracker:
                self._tracker.step(actions, raw_next, rew, done, valid, infos, self._eps_id)
            self._prev_done = done
            self.obs = next_obs
            step += 1
            rows = int(rows_at_end.sum()) if complete else rows + int(np.count_nonzero(valid))
            if rows >= target:
                break
        frag = SampleBatch({k: v[:step] for k, v in buf.items()})
        if complete:  # drop each sub-env's unfinished tail
            frag[VALID] &= np.arange(step)[:, None] <= last_end[None, :]
        if self.policy.needs_next_obs or self.spec.record_next_obs:  # the dummy row's obs is the final obs
            frag[SB.NEXT_OBS] = np.concatenate([frag[SB.OBS][1:], self.obs[None]], axis=0)
        last_values = self.policy.compute_values(self.obs, self._state)
        frag = self.policy.postprocess_trajectory(frag, last_values)
        batch = flatten_fragment(frag)
        self.env_steps_sampled += len(batch)
        if self.callbacks:
            self.callbacks.call("on_postprocess_trajectory", worker=self, policy_id=DEFAULT_POLICY_ID,
                                policy=self.policy, postprocessed_batch=batch)
            self.callbacks.call("on_sample_end", worker=self, samples=batch)
        return batch

    def _record(self, buf: dict[str, np.ndarray], step: int, out: ActionOutput, rew: np.ndarray, term: np.ndarray,
                trunc: np.ndarray, valid: np.ndarray) -> None:
        """One vector step into the time-major buffer (before ``self.obs`` moves on)."""
        buf[SB.OBS][step] = self.obs
        buf[SB.ACTIONS][step] = out.actions
        buf[SB.REWARDS][step] = rew
        buf[SB.TERMINATEDS][step] = term
        buf[SB.TRUNCATEDS][step] = trunc
        buf[SB.ACTION_LOGP][step] = out.logp
        buf[SB.VF_PREDS][step] = out.values
        buf[SB.ACTION_DIST_INPUTS][step] = out.dist_inputs
        buf[SB.EPS_ID][step] = self._eps_id
        buf[SB.T][step] = self._ep_len  # the step's index within its episode
        buf[VALID][step] = valid
        if self._recurrent:
            self._advance_state(out.state_out, valid, buf, step)

    def _advance_state(self, state_out: list[np.ndarray] | None, valid: np.ndarray, buf: dict[str, np.ndarray],
                       step: int) -> None:
        """Record the state each sub-env acted from, then carry the new one; a sub-env that just took
        its dummy autoreset step starts its next episode from the initial state. (The dummy step
        itself acts on the final observation with the episode's state: its value is the bootstrap.)"""
        assert state_out is not None
        for k, (before, after) in enumerate(zip(self._state, state_out, strict=True)):
            buf[f"{STATE_IN}{k}"][step] = before
            after = np.array(after)
            after[~valid] = self._initial_state[k][~valid]
            self._state[k] = after

    def _alloc(self, cap: int) -> dict[str, np.ndarray]:
        n = self.num_envs
        obs_space, act_space = self.obs_space, self.action_space
        obs_shape, act_shape = tuple(obs_space.shape or ()), tuple(act_space.shape or ())
        k = self.policy.dist_class.required_inputs(act_space)
        states = {f"{STATE_IN}{i}": np.zeros((cap, *s.shape), s.dtype) for i, s in enumerate(self._initial_state)}
        return {**states,
            SB.OBS: np.zeros((cap, n, *obs_shape), dtype=np.float32 if self._filtered else obs_space.dtype),
            SB.ACTIONS: np.zeros((cap, n, *act_shape), dtype=np.float32 if self._box else np.int64),
            SB.REWARDS: np.zeros((cap, n), dtype=np.float32),
            SB.TERMINATEDS: np.zeros((cap, n), dtype=bool),
            SB.TRUNCATEDS: np.zeros((cap, n), dtype=bool),
            SB.ACTION_LOGP: np.zeros((cap, n), dtype=np.float32),
            SB.VF_PREDS: np.zeros((cap, n), dtype=np.float32),
            SB.ACTION_DIST_INPUTS: np.zeros((cap, n, k), dtype=np.float32),
            SB.EPS_ID: np.zeros((cap, n), dtype=np.int64),
            SB.T: np.zeros((cap, n), dtype=np.int64),
            VALID: np.zeros((cap, n), dtype=bool),
        }

    @staticmethod
    def _grow(buf: dict[str, np.ndarray], cap: int) -> dict[str, np.ndarray]:
        return {k: np.concatenate([v, np.zeros_like(v)]) for k, v in buf.items()}

    def _end_episodes(self, done: np.ndarray) -> None:
        ended = np.flatnonzero(done)  # indices once: boolean masks cost a scan per use
        self._episodes.returns.extend(self._ep_return[ended].tolist())
        self._episodes.lengths.extend(self._ep_len[ended].tolist())
        self._ep_return[ended] = 0.0
        self._ep_len[ended] = 0
        k = len(ended)
        self._eps_id[ended] = self._id_base + self._next_eps + np.arange(k)
        self._next_eps += k

    def _restart_episodes(self) -> None:
        """complete_episodes: unfinished episodes were dropped, so every sub-env starts afresh."""
        raw, infos = self.env.reset()
        self.obs = self.policy.filter_obs(raw, update=True)
        self._state = [s.copy() for s in self._initial_state]
        self._prev_done[:] = False
        self._ep_return[:] = 0.0
        self._ep_len[:] = 0
        self._end_episodes(np.zeros(self.num_envs, dtype=bool))
        n = self.num_envs
        self._eps_id = self._id_base + self._next_eps + np.arange(n, dtype=np.int64)
        self._next_eps += n
        if self._tracker:
            self._tracker.reset(raw, infos, self._eps_id)

    def stop(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        # Ray shows a worker whose constructor failed too: no num_envs then
        n = getattr(self, "num_envs", "?")
        return f"RolloutWorker(index={self.spec.worker_index}, env={self.spec.env.id}, num_envs={n})"


def flatten_fragment(frag: SampleBatch) -> SampleBatch:
    """Time-major ``[T, B, ...]`` fragment -> flat batch of its valid rows, sub-env by sub-env
    (so each episode's rows are contiguous and in time order)."""
    valid = frag[VALID].T  # [B, T]
    out = SampleBatch()
    for k, v in frag.items():
        if k != VALID:
            dict.__setitem__(out, k, np.swapaxes(v, 0, 1)[valid])
    return out
