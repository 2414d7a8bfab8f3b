"""RolloutWorker: ``num_envs_per_worker`` env copies and the run's policy map; in-process or a Ray actor.

One sampling loop for single- and multi-agent runs. The worker samples a multi-agent vector env
(``rlrun/envs/copies.py``); a single-agent env is the case of one agent, acting for ``default_policy``.
Each policy owns *slots*, one per (agent mapped to it, env copy), agent-major, and a time-major buffer
``[T, slots]`` (a single-agent run's slots are its sub-envs). Every vector step does one forward pass per
policy over all its slots and one step of the env copies. A slot's row is valid where its agent acted:
rows of agents that were not acting, and of copies being reset, never enter a batch.

Like gymnasium 1.x vector envs, a copy whose episode ended is reset on the *next* step (no agent acts
in it), and until then a slot keeps its final observation: the value computed on it in that step is
exactly the bootstrap value a truncated episode needs. A recurrent policy's slot keeps its state while
its agent waits and starts from the initial state when its copy is reset. GAE and the other
postprocessing then run per policy on its own fragment, and each agent's trajectory is one column of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlrun.config.resources import FRACTION, gib, machine_memory
from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError
from rlrun.data.batch import MultiAgentBatch, SampleBatch
from rlrun.data.postprocessing import fragment_ends as fragment_ends  # re-exported
from rlrun.envs.copies import env_copies
from rlrun.envs.multi_agent import Games
from rlrun.policy.policy import DEFAULT_POLICY_ID, Policy, PolicyMap
from rlrun.policy.policy_map import copy_spaces
from rlrun.sources.callbacks import CallbackList, EpisodeTracker
from rlrun.sources.plugins import load_plugins
from rlrun.sources.slots import Slots
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
    """Samples fragments of ``rollout_fragment_length`` env steps (or agent steps, with
    ``multiagent.count_steps_by: agent_steps``) per env copy, postprocessed per policy: a SampleBatch
    in a single-agent run, a MultiAgentBatch otherwise. At least ``rollout_fragment_length x num_envs``
    steps, fewer than one vector step extra; rows of each trajectory contiguous and in time order."""

    def __init__(self, spec: WorkerSpec, policy_factory: Callable[[gym.Space, gym.Space], PolicyMap]) -> None:
        self.spec = spec
        if spec.plugins or spec.worker_index > 0:
            load_plugins(list(spec.plugins), search_dirs=[spec.launch_dir] if spec.launch_dir else [])
        r = spec.rollout
        n = self.num_envs = int(r.num_envs_per_worker)
        self.fragment_length = int(r.rollout_fragment_length)
        cfg = getattr(policy_factory, "cfg", None) or RunConfig()  # a bare callable: a single-agent policy map
        self._count_agent_steps = cfg.multiagent.count_steps_by == "agent_steps"
        self.env = env_copies(spec.env, n)
        # a turn-based game is sampled in whole games: a player's reward can come after the fragment's last step
        turns = bool(getattr(self.env, "turn_based", False))
        self.complete_episodes = r.batch_mode == "complete_episodes" or turns
        self.agent_names: list[str] = list(self.env.possible_agents)
        self.agent_policy, self.spaces, self.policy_map = self._policies(policy_factory, cfg)
        self.policy: Policy | None = self.policy_map.get(DEFAULT_POLICY_ID)  # a single-agent run's policy
        self.obs_space, self.action_space = self.spaces.get(DEFAULT_POLICY_ID, (None, None))
        self._per_agent = self.policy is None or len(self.agent_names) > 1
        self.slots = [Slots(pid, p, [i for i, a in enumerate(self.agent_names) if self.agent_policy[a] == pid],
                            n, self.spaces[pid], self.agent_names, turns=turns) for pid, p in self.policy_map.items()]
        self.callbacks = CallbackList(spec.callbacks)  # episode hooks: single-agent runs (the config says so)
        self._tracker = EpisodeTracker(self.callbacks, self) if self.callbacks else None
        if spec.worker_index > 0:  # a remote worker: its own action noise, one thread (small MLPs)
            torch.set_num_threads(1)
            for policy in self.policy_map.values():
                policy.reseed(spec.seed + 1000 * spec.worker_index)
        self._ep_return = np.zeros(n, np.float64)  # per copy, summed over its agents
        self._ep_len = np.zeros(n, np.int64)  # env steps of the copy's episode
        self._agent_return = np.zeros((len(self.agent_names), n), np.float64)
        self._took_part = np.zeros((len(self.agent_names), n), bool)
        self._id_base = spec.worker_index << 40
        self._next_eps = 0
        self._eps_id = self._new_ids(n)
        self._episodes = EpisodeStats([], [], {})
        self._started = False
        self.explore = True  # False: greedy actions (rlrun-eval ... explore=false output=<dir>)
        self.env_steps_sampled = 0
        # copy c of worker w is seeded with seed + 1000 * w + c (reseed: a resumed run's seed in its place)
        self._see(*self.env.reset(seed=spec.seed + 1000 * spec.worker_index))

    def _policies(self, factory: Any, cfg: Any) -> tuple[dict[str, str], dict[str, tuple], PolicyMap]:
        """Agent -> policy id, policy id -> (obs space, action space), and the policy map (a
        ``PolicyFactory``, or a callable ``(obs_space, action_space) -> PolicyMap`` of one policy)."""
        mapping, spaces = copy_spaces(cfg, self.env)
        if hasattr(factory, "policies"):
            return mapping, spaces, factory.policies(spaces)
        return mapping, spaces, factory(*spaces[DEFAULT_POLICY_ID])

    def _see(self, obs: Mapping[str, np.ndarray], acting: Mapping[str, np.ndarray]) -> None:
        for g in self.slots:
            g.see(obs, acting)
        if self._tracker:
            self._tracker.reset(obs[self.agent_names[0]], getattr(self.env, "infos", {}), self._eps_id)

    def _new_ids(self, k: int) -> np.ndarray:
        ids = self._id_base + self._next_eps + np.arange(k, dtype=np.int64)
        self._next_eps += k
        return ids

    # ------------------------------------------------------------------ sampling
    def sample(self) -> SampleBatch | MultiAgentBatch:
        n, complete, slots, explore = self.num_envs, self.complete_episodes, self.slots, self.explore
        if complete and self._started:
            self._restart_episodes()
        self._started = True
        target = self.fragment_length * n
        cap = self.fragment_length + self.fragment_length // 4 + 4
        learners = [g for g in slots if g.learns]
        for g in learners:
            g.alloc(cap)
        # truncate_episodes counts every step; complete_episodes only those of episodes that ended, per copy
        count = env_steps = 0
        counted, stepped = np.zeros(n, np.int64), np.zeros(n, np.int64)
        counted_at_end, stepped_at_end = np.zeros(n, np.int64), np.zeros(n, np.int64)
        last_end = np.full(n, -1, dtype=np.int64)  # complete_episodes: last step that ended the copy's episode
        step = 0
        while True:
            if step == cap:
                if complete:  # truncate_episodes stops at its row count: its growth is bounded
                    self._check_growth(learners, step)
                for g in learners:
                    g.grow()
                cap *= 2
            actions: dict[str, np.ndarray] = {}
            for g in slots:
                g.act(explore, n, actions)
            st = self.env.step(actions)
            for g in slots:
                g.after_step(step, st, self._eps_id, self._ep_len)
            agent_steps = self._count(st)  # None: the fragment counts env steps
            if complete:
                counted += st.stepped if agent_steps is None else agent_steps
                stepped += st.stepped
            else:
                k = int(np.count_nonzero(st.stepped))
                env_steps += k
                count += k if agent_steps is None else int(agent_steps.sum())
            ended = st.episode_end.nonzero()[0]  # one call where .any() and flatnonzero() were two
            if len(ended):
                self._end_episodes(ended, st.game)
                if complete:
                    last_end[ended] = step
                    counted_at_end[ended] = counted[ended]
                    stepped_at_end[ended] = stepped[ended]
                    count, env_steps = int(counted_at_end.sum()), int(stepped_at_end.sum())
            if self._tracker:
                a = self.agent_names[0]
                self._tracker.step(slots[0].out.actions, st.obs[a], st.rewards[a], st.episode_end, st.stepped,
                                   getattr(self.env, "infos", {}), self._eps_id)
            step += 1
            if count >= target:
                break
        return self._finish(learners, step, last_end if complete else None, env_steps)

    def _check_growth(self, learners: list[Slots], steps: int) -> None:
        """One line before the fragment's buffers double past what this machine can hold (``FRACTION`` of its
        memory): under ``complete_episodes`` a fragment takes rows of ended episodes only, and episodes that never
        end (an env without a time limit, a game that loops) grew them until the machine ran out."""
        ram = machine_memory()
        need = 2 * sum(g.nbytes for g in learners)
        if ram is None or need <= FRACTION * ram:
            return
        env = self.spec.env.id
        if getattr(self.env, "turn_based", False):
            fix = "a turn-based game is sampled in whole games: give the game an end (a move limit in its kwargs)"
        else:
            fix = ("give its episodes a limit (env.wrappers: [{time_limit: {max_episode_steps: N}}]) or use "
                   "rollout.batch_mode=truncate_episodes")
        raise ConfigError(f"rollout.batch_mode: complete_episodes: {env}'s episodes ran {steps:,} steps without all "
                          f"ending, and the fragment that waits for them would need {gib(need)} (this machine has "
                          f"{gib(ram)}); {fix}")

    def _finish(self, learners: list[Slots], steps: int, last_end: np.ndarray | None,
                env_steps: int) -> SampleBatch | MultiAgentBatch:
        """Each learning policy's fragment, postprocessed, through the callbacks: a single-agent run's
        one batch, or a MultiAgentBatch of ``env_steps``."""
        batches = {g.pid: g.fragment(steps, last_end, self.spec.record_next_obs) for g in learners}
        self.env_steps_sampled += env_steps
        if self.callbacks:
            for pid, batch in batches.items():
                self.callbacks.call("on_postprocess_trajectory", worker=self, policy_id=pid,
                                    policy=self.policy_map[pid], postprocessed_batch=batch)
        result = MultiAgentBatch.wrap_as_needed(batches, env_steps)
        if self.callbacks:
            self.callbacks.call("on_sample_end", worker=self, samples=result)
        return result

    def _count(self, st: Any) -> np.ndarray | None:
        """Episode returns per copy (summed over agents) and, for named policies, per agent (a copy being
        reset earns nothing); returns the agent steps per copy with ``count_steps_by: agent_steps``."""
        if self._per_agent:
            for i, a in enumerate(self.agent_names):
                r = st.rewards[a]
                self._ep_return += r
                self._agent_return[i] += r
            for g in self.slots:
                self._took_part[g.agent, g.copy] |= g.acted
        else:
            np.add(self._ep_return, st.rewards[self.agent_names[0]], out=self._ep_return, where=st.stepped)
        self._ep_len += st.stepped
        if not self._count_agent_steps:
            return None
        steps = np.zeros(self.num_envs, np.int64)
        for g in self.slots:
            np.add.at(steps, g.copy, g.acted)
        return steps

    def _end_episodes(self, ended: np.ndarray, games: Games | None) -> None:
        """The copies ``ended`` finished their episodes: statistics out, counters and ids anew. With
        ``games`` (episodic_life: an episode a life) the statistics are the games that ended, as the env
        counted them."""
        if games is None:
            self._episodes.returns.extend(self._ep_return[ended].tolist())
            self._episodes.lengths.extend(self._ep_len[ended].tolist())
        else:
            self._episodes.returns.extend(games.returns[games.end].tolist())
            self._episodes.lengths.extend(games.lengths[games.end].tolist())
        if self._per_agent:  # named policies: their agents' returns (default_policy's are the run's own)
            per_policy = self._episodes.policy_returns
            assert per_policy is not None
            for c in ended.tolist():
                for i, a in enumerate(self.agent_names):
                    if self._took_part[i, c]:
                        per_policy.setdefault(self.agent_policy[a], []).append(float(self._agent_return[i, c]))
            self._agent_return[:, ended] = 0.0
            self._took_part[:, ended] = False
        self._ep_return[ended] = 0.0
        self._ep_len[ended] = 0
        k = len(ended)
        self._eps_id[ended] = self._id_base + self._next_eps + np.arange(k)
        self._next_eps += k

    def reseed(self, seed: int) -> None:
        w = self.spec.worker_index
        if w > 0:  # a remote worker's action noise too (the local worker's policies are the learner's, restored)
            for policy in self.policy_map.values():
                policy.reseed(seed + 1000 * w)
        self._restart_episodes(seed + 1000 * w)

    def _restart_episodes(self, seed: int | None = None) -> None:
        """complete_episodes: unfinished episodes were dropped, so every copy starts afresh (``seed``: the
        copies seeded from it, as in the constructor)."""
        self._agent_return[:] = 0.0
        self._took_part[:] = False
        self._ep_return[:] = 0.0
        self._ep_len[:] = 0
        self._eps_id = self._new_ids(self.num_envs)
        for g in self.slots:
            g.restart()
        self._see(*self.env.reset(seed=seed))

    def stop(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        # Ray shows a worker whose constructor failed too: no num_envs then
        n = getattr(self, "num_envs", "?")
        return f"RolloutWorker(index={self.spec.worker_index}, env={self.spec.env.id}, num_envs={n})"



