"""MultiAgentRolloutWorker: ``num_envs_per_worker`` copies of a multi-agent env, one policy map.

Each policy owns a set of *slots*, one per (env copy, agent mapped to it), and a time-major buffer
``[T, slots]`` exactly like a single-agent worker's ``[T, sub-envs]``. Every vector step does one
forward pass per policy over all its slots (agents that are not acting just keep their last
observation and their row is marked invalid), then steps every copy with its agents' actions.
After an agent's episode ends its slot keeps the final observation, so the value of the slot's next
(invalid) row is the bootstrap value a truncated agent needs - the single-agent autoreset rule. An
env copy whose episode ended is reset one step later (that step's rows are all invalid), for the
same reason. GAE and the other postprocessing then run per policy on its own fragment, and each
agent's trajectory is one column of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlrun.batch import MultiAgentBatch, SampleBatch
from rlrun.multi_agent import make_multi_agent_env, policy_spaces
from rlrun.plugins import load_plugins
from rlrun.workers import VALID, EpisodeStats, WorkerSpec, flatten_fragment

SB = SampleBatch


class MultiAgentRolloutWorker:
    """Samples fragments of ``rollout_fragment_length`` env steps (or agent steps, with
    ``multiagent.count_steps_by: agent_steps``) per env copy; returns a MultiAgentBatch."""

    def __init__(self, spec: WorkerSpec, policy_factory: Any) -> None:
        self.spec = spec
        if spec.plugins or spec.worker_index > 0:
            load_plugins(list(spec.plugins), search_dirs=[spec.launch_dir] if spec.launch_dir else [])
        cfg = policy_factory.cfg
        r = spec.rollout
        self.num_envs = int(r.num_envs_per_worker)
        self.fragment_length = int(r.rollout_fragment_length)  # env steps or agent steps per copy
        self._count_agent_steps = cfg.multiagent.count_steps_by == "agent_steps"
        self.envs = [make_multi_agent_env(spec.env.id, spec.env.kwargs) for _ in range(self.num_envs)]
        self.agent_policy, self.adapters, spaces = policy_spaces(cfg, self.envs[0])
        self.policy_map = policy_factory.multi_agent(spaces)
        if spec.worker_index > 0:
            torch.set_num_threads(1)
            for policy in self.policy_map.values():
                policy.generator.manual_seed(spec.seed + 1000 * spec.worker_index)
                policy.np_rng = np.random.default_rng(spec.seed + 1000 * spec.worker_index)
        # slots: per policy, the (copy, agent) pairs it acts for, in a fixed order
        self.slots: dict[str, list[tuple[int, str]]] = {pid: [] for pid in self.policy_map}
        for c in range(self.num_envs):
            for agent in self.envs[0].possible_agents:
                self.slots[self.agent_policy[agent]].append((c, agent))
        self.slot_of = {pid: {ca: j for j, ca in enumerate(s)} for pid, s in self.slots.items()}
        agents = self.envs[0].possible_agents
        self._slot_copy = {pid: np.array([c for c, _ in s], np.int64) for pid, s in self.slots.items()}
        self._slot_agent = {pid: np.array([agents.index(a) for _, a in s], np.int64) for pid, s in self.slots.items()}
        self._copy_slots = {pid: [np.flatnonzero(self._slot_copy[pid] == c) for c in range(self.num_envs)]
                            for pid in self.slots}
        self._slots_of_copy = [[(pid, self._copy_slots[pid][c]) for pid in self.slots if len(self._copy_slots[pid][c])]
                               for c in range(self.num_envs)]
        self._where = [{a: (self.agent_policy[a], self.slot_of[self.agent_policy[a]][(c, a)]) for a in agents}
                       for c in range(self.num_envs)]  # per copy: agent -> (policy, slot)
        self.obs = {pid: np.zeros((len(s), *spaces[pid][0].shape), np.float32) for pid, s in self.slots.items()}
        self.active = {pid: np.zeros(len(s), bool) for pid, s in self.slots.items()}
        self.spaces = spaces
        self._box = {pid: hasattr(sp[1], "low") and sp[1].shape != () for pid, sp in spaces.items()}
        base = spec.seed + 1000 * spec.worker_index
        self._reset_count = 0
        self._seed_base = base
        for c in range(self.num_envs):
            self._reset(c, seed=base + c)
        self._pending_reset = np.zeros(self.num_envs, bool)
        self._ep_return = np.zeros(self.num_envs, np.float64)  # summed over agents
        self._ep_len = np.zeros(self.num_envs, np.int64)
        self._agent_return: dict[tuple[int, str], float] = {}
        self._id_base = spec.worker_index << 40
        self._eps_id = self._id_base + np.arange(self.num_envs, dtype=np.int64)
        self._next_eps = self.num_envs
        self._episodes = EpisodeStats([], [], {})
        self.env_steps_sampled = 0

    def _reset(self, c: int, seed: int | None = None) -> None:
        obs, _ = self.envs[c].reset(seed=seed)
        for pid in self.policy_map:
            self.active[pid][self._copy_slots[pid][c]] = False
        for agent, o in obs.items():
            pid = self.agent_policy[agent]
            j = self.slot_of[pid][(c, agent)]
            self.obs[pid][j] = self.adapters[agent](o)
            self.active[pid][j] = True

    # ------------------------------------------------------------------ sampling
    def sample(self) -> MultiAgentBatch:
        pids = list(self.policy_map)
        learners = [pid for pid in pids if getattr(self.policy_map[pid], "learns", True)]
        target = self.fragment_length * self.num_envs
        bufs: dict[str, dict[str, list[np.ndarray]]] = {pid: {} for pid in learners}
        env_steps = agent_steps = 0
        while (agent_steps if self._count_agent_steps else env_steps) < target:
            outs = {pid: self.policy_map[pid].compute_actions(self.obs[pid]) for pid in pids}
            step = _Step(self.active, self.slots)
            for pending in np.flatnonzero(self._pending_reset):
                for pid in pids:
                    step.valid[pid][self._copy_slots[pid][pending]] = False
            obs_before = {pid: self.obs[pid].copy() for pid in learners}
            eps_before, t_before = self._eps_id.copy(), self._ep_len.copy()
            for c in range(self.num_envs):
                env_steps += self._step_copy(c, outs, step)
            agent_steps += sum(int(v.sum()) for v in step.valid.values())
            for pid in learners:
                self._record(bufs[pid], pid, outs[pid], step, obs_before[pid], eps_before, t_before)
        batches = {pid: self._postprocess(pid, bufs[pid]) for pid in learners}
        self.env_steps_sampled += env_steps
        return MultiAgentBatch(batches, env_steps)

    def _step_copy(self, c: int, outs: Mapping[str, Any], step: _Step) -> int:
        """Step env copy ``c`` with its agents' actions (or reset it a step after its episode ended);
        fills ``step`` and the slots' next observations; returns the env steps taken (0 or 1)."""
        if self._pending_reset[c]:
            self._pending_reset[c] = False
            self._reset(c)
            return 0
        env, where = self.envs[c], self._where[c]
        actions = {}
        for agent in env.agents:
            pid, j = where[agent]
            a = outs[pid].actions[j]
            actions[agent] = np.clip(a, self.spaces[pid][1].low, self.spaces[pid][1].high) if self._box[pid] else a
        next_obs, rewards, terms, truncs, _ = env.step(actions)
        for agent, rw in rewards.items():
            pid, j = where[agent]
            step.rew[pid][j] = rw
            self._ep_return[c] += rw
            self._agent_return[(c, agent)] = self._agent_return.get((c, agent), 0.0) + float(rw)
        for agent, o in next_obs.items():
            pid, j = where[agent]
            self.obs[pid][j] = self.adapters[agent](o)
        for agent in set(terms) | set(truncs):
            pid, j = where[agent]
            step.term[pid][j] = bool(terms.get(agent, False))
            step.trunc[pid][j] = bool(truncs.get(agent, False)) and not step.term[pid][j]
        for pid, js in self._slots_of_copy[c]:  # who acts next step: the env's agents
            self.active[pid][js] = False
        for agent in env.agents:
            pid, j = where[agent]
            self.active[pid][j] = True
        for pid, js in self._slots_of_copy[c]:  # an agent that left without a done flag: truncated
            step.trunc[pid][js] |= step.valid[pid][js] & ~self.active[pid][js] & ~step.term[pid][js]
        self._ep_len[c] += 1
        if not env.agents:
            self._end_episode(c)
        return 1

    def _record(self, b: dict[str, list[np.ndarray]], pid: str, out: Any, step: _Step, obs: np.ndarray,
                eps_before: np.ndarray, t_before: np.ndarray) -> None:
        for key, value in ((SB.OBS, obs), (SB.ACTIONS, out.actions), (SB.REWARDS, step.rew[pid]),
                           (SB.TERMINATEDS, step.term[pid]), (SB.TRUNCATEDS, step.trunc[pid]),
                           (SB.ACTION_LOGP, out.logp), (SB.VF_PREDS, out.values),
                           (SB.ACTION_DIST_INPUTS, out.dist_inputs), (VALID, step.valid[pid])):
            b.setdefault(key, []).append(np.asarray(value))
        # one trajectory id per (episode, agent)
        b.setdefault(SB.EPS_ID, []).append(eps_before[self._slot_copy[pid]] * 1024 + self._slot_agent[pid])
        b.setdefault(SB.T, []).append(t_before[self._slot_copy[pid]])  # the env step's index in its episode

    def _postprocess(self, pid: str, buf: dict[str, list[np.ndarray]]) -> SampleBatch:
        """The policy's time-major fragment ``[T, slots]`` -> postprocessed flat batch of valid rows."""
        policy = self.policy_map[pid]
        frag = SampleBatch({k: np.stack(v) for k, v in buf.items()})
        if policy.needs_next_obs:
            frag[SB.NEXT_OBS] = np.concatenate([frag[SB.OBS][1:], self.obs[pid][None]], axis=0)
        frag = policy.postprocess_trajectory(frag, policy.compute_values(self.obs[pid]))
        return flatten_fragment(frag)

    def _end_episode(self, c: int) -> None:
        self._episodes.returns.append(float(self._ep_return[c]))
        self._episodes.lengths.append(int(self._ep_len[c]))
        for agent in self.envs[0].possible_agents:
            if (c, agent) in self._agent_return:
                pid = self.agent_policy[agent]
                per_policy = self._episodes.policy_returns
                assert per_policy is not None
                per_policy.setdefault(pid, []).append(self._agent_return.pop((c, agent)))
        self._ep_return[c] = 0.0
        self._ep_len[c] = 0
        self._eps_id[c] = self._id_base + self._next_eps
        self._next_eps += 1
        self._pending_reset[c] = True

    def sample_with_metrics(self) -> tuple[MultiAgentBatch, EpisodeStats]:
        return self.sample(), self.get_metrics()

    def get_pid(self) -> int:
        return os.getpid()

    def get_metrics(self) -> EpisodeStats:
        out, self._episodes = self._episodes, EpisodeStats([], [], {})
        return out

    def get_weights(self) -> dict[str, dict[str, np.ndarray]]:
        return {pid: p.get_weights() for pid, p in self.policy_map.items()}

    def set_weights(self, weights: Mapping[str, Mapping[str, np.ndarray]], global_timestep: int | None = None) -> None:
        for pid, w in weights.items():
            policy = self.policy_map[pid]
            policy.set_weights(w)
            if global_timestep is not None:
                policy.global_timestep = global_timestep

    def stop(self) -> None:
        for env in self.envs:
            env.close()

    def __repr__(self) -> str:
        return (f"MultiAgentRolloutWorker(index={self.spec.worker_index}, env={self.spec.env.id}, "
                f"copies={self.num_envs})")



class _Step:
    """One vector step's per-slot columns, per policy: valid (the agent acted), reward, ends."""

    def __init__(self, active: Mapping[str, np.ndarray], slots: Mapping[str, list[Any]]) -> None:
        self.valid = {pid: a.copy() for pid, a in active.items()}
        self.rew = {pid: np.zeros(len(s), np.float32) for pid, s in slots.items()}
        self.term = {pid: np.zeros(len(s), bool) for pid, s in slots.items()}
        self.trunc = {pid: np.zeros(len(s), bool) for pid, s in slots.items()}
