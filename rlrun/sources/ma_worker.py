"""MultiAgentRolloutWorker: ``num_envs_per_worker`` copies of a multi-agent env, one policy map.

The copies are one vector env (rlrun/envs/ma_vector.py: arrays over copies per agent). Each policy owns
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

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlrun.data.batch import MultiAgentBatch, SampleBatch
from rlrun.envs.ma_vector import make_vector_multi_agent_env
from rlrun.policy.policy_map import policy_spaces
from rlrun.sources.callbacks import CallbackList
from rlrun.sources.plugins import load_plugins
from rlrun.sources.rollout_worker import VALID, EpisodeStats, WorkerBase, WorkerSpec, flatten_fragment

SB = SampleBatch


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
        self.policy_map = policy_factory.multi_agent(spaces)
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
        policy = self.policy_map[pid]
        frag = SampleBatch({k: np.stack(v) for k, v in buf.items()})
        if policy.needs_next_obs or self.spec.record_next_obs:
            frag[SB.NEXT_OBS] = np.concatenate([frag[SB.OBS][1:], self.obs[pid][None]], axis=0)
        frag = policy.postprocess_trajectory(frag, policy.compute_values(self.obs[pid]))
        return flatten_fragment(frag)

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
