"""RolloutWorker: one vector env + a copy of the policy; runs in-process or as a Ray actor.

Gymnasium 1.x vector envs autoreset on the *next* step: after a sub-env reports terminated or
truncated, the following ``step`` ignores its action, resets it and returns reward 0. That dummy
step is recorded as an invalid row and never enters a batch. Its value prediction, computed on the
episode's final observation, is exactly the bootstrap value a truncated episode needs.

MultiAgentRolloutWorker: MultiAgentRolloutWorker: ``num_envs_per_worker`` copies of a multi-agent env, one policy map.

The copies are one vector env (rlrun/envs/multi_agent.py: arrays over copies per agent). Each policy owns
*slots*, one per (agent mapped to it, env copy), agent-major, and a time-major buffer ``[T, slots]``
exactly like a single-agent worker's ``[T, sub-envs]``. Every vector step does one forward pass per
policy over all its slots (agents that are not acting keep their last observation and their row is
marked invalid) and one step of the vector env. After an agent's episode ends its slot keeps the
final observation, so the value of the slot's next (invalid) row is the bootstrap value a truncated
agent needs - the single-agent autoreset rule; a copy whose episode ended is reset one step later
(no rows) for the same reason. GAE and the other postprocessing then run per policy on its own
fragment, and each agent's trajectory is one column of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlrun.data.batch import MultiAgentBatch, SampleBatch
from rlrun.data.postprocessing import fragment_ends as fragment_ends  # re-exported
from rlrun.envs.make import env_from_config
from rlrun.envs.multi_agent import make_vector_multi_agent_env
from rlrun.models.sequences import STATE_IN
from rlrun.policy.policy import DEFAULT_POLICY_ID, ActionOutput, Policy, PolicyMap
from rlrun.policy.policy_map import policy_spaces
from rlrun.sources.callbacks import CallbackList, EpisodeTracker
from rlrun.sources.plugins import load_plugins
from rlrun.sources.worker_base import (  # noqa: F401  (re-exported: the worker interface's old home)
    VALID,
    EpisodeStats,
    PolicyFactory,
    WorkerBase,
    WorkerSpec,
    finish_fragment,
    flatten_fragment,
    make_policy_factory,
)

SB = SampleBatch


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
        batch = finish_fragment(self.policy, frag, self.obs, self._state, self.spec.record_next_obs)
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


class MultiAgentRolloutWorker(WorkerBase):
    """Samples fragments of ``rollout_fragment_length`` env steps (or agent steps, with
    ``multiagent.count_steps_by: agent_steps``) per env copy; returns a MultiAgentBatch."""

    def __init__(self, spec: WorkerSpec, policy_factory: Any) -> None:
        self.spec = spec
        if spec.plugins or spec.worker_index > 0:
            load_plugins(list(spec.plugins), search_dirs=[spec.launch_dir] if spec.launch_dir else [])
        cfg = policy_factory.cfg
        r = spec.rollout
        n = self.num_envs = int(r.num_envs_per_worker)
        self.fragment_length = int(r.rollout_fragment_length)  # env steps or agent steps per copy
        self._count_agent_steps = cfg.multiagent.count_steps_by == "agent_steps"
        self.env = make_vector_multi_agent_env(spec.env.id, n, spec.env.kwargs, spec.env.vectorize)
        self.agent_policy, _, spaces = policy_spaces(cfg, self.env)
        self.spaces = spaces
        self.policy_map = policy_factory.policies(spaces)
        if spec.worker_index > 0:
            torch.set_num_threads(1)
            for policy in self.policy_map.values():
                policy.reseed(spec.seed + 1000 * spec.worker_index)
        agents = list(self.env.possible_agents)
        self.agents_of = {pid: [a for a in agents if self.agent_policy[a] == pid] for pid in self.policy_map}
        # slot j of a policy = agent j // n of its agents, in copy j % n
        self._slot_copy = {pid: np.tile(np.arange(n), len(a)) for pid, a in self.agents_of.items()}
        self._slot_agent = {pid: np.repeat([agents.index(x) for x in a], n).astype(np.int64)
                            for pid, a in self.agents_of.items()}
        self._box = {pid: isinstance(sp[1], gym.spaces.Box) for pid, sp in spaces.items()}
        obs, acting = self.env.reset(seed=spec.seed + 1000 * spec.worker_index)
        self.obs = self._filter(self._per_policy(obs))
        self.acting = self._per_policy(acting)
        self._ep_return = np.zeros(n, np.float64)  # summed over agents
        self._ep_len = np.zeros(n, np.int64)
        self._agent_return = {a: np.zeros(n, np.float64) for a in agents}
        self._took_part = {a: np.zeros(n, bool) for a in agents}
        self._id_base = spec.worker_index << 40
        self._eps_id = self._id_base + np.arange(n, dtype=np.int64)
        self._next_eps = n
        self._episodes = EpisodeStats([], [], {})
        self.env_steps_sampled = 0
        self.callbacks = CallbackList(spec.callbacks)  # on_train_result only (the config refuses the rest)

    def _filter(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each learned policy's observation filter (``rollout.observation_filter``), updated."""
        return {pid: self.policy_map[pid].filter_obs(o, update=True) for pid, o in obs.items()}

    def _per_policy(self, per_agent: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``{agent: [C, ...]}`` -> ``{policy: [slots, ...]}``."""
        return {pid: np.concatenate([per_agent[a] for a in agents]) for pid, agents in self.agents_of.items()}

    # ------------------------------------------------------------------ sampling
    def sample(self) -> MultiAgentBatch:
        pids = list(self.policy_map)
        learners = [pid for pid in pids if getattr(self.policy_map[pid], "learns", True)]
        target = self.fragment_length * self.num_envs
        bufs: dict[str, dict[str, list[np.ndarray]]] = {pid: {} for pid in learners}
        env_steps = agent_steps = 0
        while (agent_steps if self._count_agent_steps else env_steps) < target:
            outs = {pid: self.policy_map[pid].compute_actions(self.obs[pid]) for pid in pids}
            actions = self._env_actions(outs)
            valid = self.acting
            obs_before, eps_before, t_before = self.obs, self._eps_id.copy(), self._ep_len.copy()
            st = self.env.step(actions)
            self.obs, self.acting = self._filter(self._per_policy(st.obs)), self._per_policy(st.acting)
            env_steps += int(st.stepped.sum())
            agent_steps += sum(int(v.sum()) for v in valid.values())
            self._count_episodes(st, valid)
            rew, term, trunc = self._per_policy(st.rewards), self._per_policy(st.terminateds), \
                self._per_policy(st.truncateds)
            for pid in learners:
                out, slot_copy = outs[pid], self._slot_copy[pid]
                for key, value in ((SB.OBS, obs_before[pid]), (SB.ACTIONS, out.actions), (SB.REWARDS, rew[pid]),
                                   (SB.TERMINATEDS, term[pid]), (SB.TRUNCATEDS, trunc[pid]),
                                   (SB.ACTION_LOGP, out.logp), (SB.VF_PREDS, out.values),
                                   (SB.ACTION_DIST_INPUTS, out.dist_inputs), (VALID, valid[pid]),
                                   # one trajectory id per (episode, agent); t: the env step's index
                                   (SB.EPS_ID, eps_before[slot_copy] * 1024 + self._slot_agent[pid]),
                                   (SB.T, t_before[slot_copy])):
                    bufs[pid].setdefault(key, []).append(value)
        batches = {pid: self._postprocess(pid, bufs[pid]) for pid in learners}
        self.env_steps_sampled += env_steps
        return MultiAgentBatch(batches, env_steps)

    def _env_actions(self, outs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Each policy's actions over its slots -> ``{agent: [C, ...]}`` (Box actions clipped)."""
        n, actions = self.num_envs, {}
        for pid, agents in self.agents_of.items():
            acts = outs[pid].actions
            if self._box[pid]:
                acts = np.clip(acts, self.spaces[pid][1].low, self.spaces[pid][1].high)
            actions.update({a: acts[k * n:(k + 1) * n] for k, a in enumerate(agents)})
        return actions

    def _count_episodes(self, st: Any, valid: Mapping[str, np.ndarray]) -> None:
        """Returns per copy (summed over agents) and per agent; finished episodes to the stats."""
        for a, r in st.rewards.items():
            self._ep_return += r
            self._agent_return[a] += r
            pid = self.agent_policy[a]
            k = self.agents_of[pid].index(a)
            self._took_part[a] |= valid[pid][k * self.num_envs:(k + 1) * self.num_envs]
        self._ep_len += st.stepped
        for c in np.flatnonzero(st.episode_end):
            self._end_episode(int(c))

    def _postprocess(self, pid: str, buf: dict[str, list[np.ndarray]]) -> SampleBatch:
        """The policy's time-major fragment ``[T, slots]`` -> postprocessed flat batch of valid rows."""
        frag = SampleBatch({k: np.stack(v) for k, v in buf.items()})
        return finish_fragment(self.policy_map[pid], frag, self.obs[pid], None, self.spec.record_next_obs)

    def _end_episode(self, c: int) -> None:
        self._episodes.returns.append(float(self._ep_return[c]))
        self._episodes.lengths.append(int(self._ep_len[c]))
        per_policy = self._episodes.policy_returns
        assert per_policy is not None
        for a, took_part in self._took_part.items():
            if took_part[c]:
                per_policy.setdefault(self.agent_policy[a], []).append(float(self._agent_return[a][c]))
            self._agent_return[a][c] = 0.0
            took_part[c] = False
        self._ep_return[c] = 0.0
        self._ep_len[c] = 0
        self._eps_id[c] = self._id_base + self._next_eps
        self._next_eps += 1

    def stop(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return (f"MultiAgentRolloutWorker(index={self.spec.worker_index}, env={self.spec.env.id}, "
                f"copies={getattr(self, 'num_envs', '?')})")
