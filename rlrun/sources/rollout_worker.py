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

from rlrun.data.batch import MultiAgentBatch, SampleBatch
from rlrun.data.postprocessing import fragment_ends as fragment_ends  # re-exported
from rlrun.envs.copies import env_copies
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


class Slots:
    """One policy's share of the worker: its slots (agent-major over env copies), what each slot sees
    now, whether its agent acts, a recurrent policy's state, and (a learning policy) its time-major
    fragment buffer ``[T, slots]``."""

    def __init__(self, pid: str, policy: Any, agents: list[int], num_envs: int, spaces: tuple[gym.Space, gym.Space],
                 names: list[str]) -> None:
        self.pid, self.policy, self.spaces = pid, policy, spaces
        self.agents = agents  # indices into the env's possible_agents
        self.one = names[agents[0]] if len(agents) == 1 else None  # the policy's one agent, if it has one
        self.names = names
        self.copy = np.tile(np.arange(num_envs), len(agents))  # slot j: agent j // n of the policy's, copy j % n
        self.agent = np.repeat(agents, num_envs).astype(np.int64)
        self.whole = agents == [0] and len(names) == 1  # the one agent of a single-agent env: slots are the copies
        self.n_agents = len(names)
        self.learns = getattr(policy, "learns", True)
        action_space = spaces[1]
        self.box = isinstance(action_space, gym.spaces.Box)
        self.low, self.high = getattr(action_space, "low", None), getattr(action_space, "high", None)
        self.filtered = bool(getattr(getattr(policy, "obs_filter", None), "active", False))
        self.recurrent = bool(getattr(policy, "recurrent", False))
        self.initial_state: list[np.ndarray] = policy.initial_state(len(self.copy)) if self.recurrent else []
        self.state = [s.copy() for s in self.initial_state]
        self.obs: np.ndarray = np.zeros(0)
        self.acting: np.ndarray = np.zeros(0, dtype=bool)  # the agent acts in the next step
        self.acted: np.ndarray = np.zeros(0, dtype=bool)  # ... acted in the last one (its rows are valid)
        self.buf: dict[str, np.ndarray] = {}
        self.out: ActionOutput = None  # type: ignore[assignment]  # the last forward pass (act() sets it)

    def gather(self, per_agent: Mapping[str, np.ndarray]) -> np.ndarray:
        """``{agent: [C, ...]}`` -> ``[slots, ...]`` (one agent: its array as it is)."""
        if self.one is not None:
            return per_agent[self.one]
        return np.concatenate([per_agent[self.names[a]] for a in self.agents])

    def see(self, obs: Mapping[str, np.ndarray], acting: Mapping[str, np.ndarray]) -> None:
        one = self.one  # the common case inline: this runs every vector step
        raw, self.acting = (obs[one], acting[one]) if one is not None else (self.gather(obs), self.gather(acting))
        self.obs = self.policy.filter_obs(raw, update=True) if self.filtered else raw

    def act(self, explore: bool, num_envs: int, into: dict[str, np.ndarray]) -> None:
        """One forward pass over the slots (kept in ``self.out``); the actions -> ``into[agent]: [C, ...]``
        (Box actions clipped)."""
        out = self.policy.compute_actions(self.obs, explore, self.state) if self.recurrent else \
            self.policy.compute_actions(self.obs, explore)
        self.out = out
        acts = np.clip(out.actions, self.low, self.high) if self.box else out.actions
        if self.one is not None:
            into[self.one] = acts
        else:
            into.update({self.names[a]: acts[k * num_envs:(k + 1) * num_envs] for k, a in enumerate(self.agents)})

    def after_step(self, step: int, st: Any, eps_id: np.ndarray, ep_len: np.ndarray) -> None:
        """One vector step: its row into the buffer (``eps_id``/``ep_len``: the copies' before the step),
        the recurrent state carried, and the next observations seen."""
        out = self.out
        self.acted = self.acting
        if self.learns:
            self._record(step, out, st, eps_id, ep_len)
        if self.recurrent:
            self._advance_state(out, ~st.stepped[self.copy])
        self.see(st.obs, st.acting)

    def _record(self, step: int, out: ActionOutput, st: Any, eps_id: np.ndarray, ep_len: np.ndarray) -> None:
        buf = self.buf
        buf[SB.OBS][step] = self.obs
        buf[SB.ACTIONS][step] = out.actions
        one = self.one
        if one is not None:  # inline: this runs every vector step
            buf[SB.REWARDS][step], buf[SB.TERMINATEDS][step] = st.rewards[one], st.terminateds[one]
            buf[SB.TRUNCATEDS][step] = st.truncateds[one]
        else:
            buf[SB.REWARDS][step] = self.gather(st.rewards)
            buf[SB.TERMINATEDS][step] = self.gather(st.terminateds)
            buf[SB.TRUNCATEDS][step] = self.gather(st.truncateds)
        buf[SB.ACTION_LOGP][step] = out.logp
        buf[SB.VF_PREDS][step] = out.values
        buf[SB.ACTION_DIST_INPUTS][step] = out.dist_inputs
        if self.whole:
            buf[SB.EPS_ID][step] = eps_id
            buf[SB.T][step] = ep_len
        else:  # one trajectory id per (episode, agent); t: the env step's index in the episode
            buf[SB.EPS_ID][step] = eps_id[self.copy] * self.n_agents + self.agent
            buf[SB.T][step] = ep_len[self.copy]
        buf[VALID][step] = self.acting
        for k, s in enumerate(self.state):
            buf[f"{STATE_IN}{k}"][step] = s

    def _advance_state(self, out: ActionOutput, reset: np.ndarray) -> None:
        """Carry the state after the step where the agent acted; a slot whose copy was reset this step
        starts its next episode from the initial state."""
        assert out.state_out is not None
        for k, after in enumerate(out.state_out):
            after = np.where(self.acting.reshape(-1, *[1] * (after.ndim - 1)), after, self.state[k])
            after[reset] = self.initial_state[k][reset]
            self.state[k] = after

    def restart(self) -> None:
        self.state = [s.copy() for s in self.initial_state]

    def alloc(self, cap: int) -> None:
        b = len(self.copy)
        obs_space, act_space = self.spaces
        obs_shape, act_shape = tuple(obs_space.shape or ()), tuple(act_space.shape or ())
        k = self.policy.dist_class.required_inputs(act_space)
        states = {f"{STATE_IN}{i}": np.zeros((cap, *s.shape), s.dtype) for i, s in enumerate(self.initial_state)}
        self.buf = {**states,
            SB.OBS: np.zeros((cap, b, *obs_shape), dtype=np.float32 if self.filtered else obs_space.dtype),
            SB.ACTIONS: np.zeros((cap, b, *act_shape), dtype=np.float32 if self.box else np.int64),
            SB.REWARDS: np.zeros((cap, b), dtype=np.float32),
            SB.TERMINATEDS: np.zeros((cap, b), dtype=bool),
            SB.TRUNCATEDS: np.zeros((cap, b), dtype=bool),
            SB.ACTION_LOGP: np.zeros((cap, b), dtype=np.float32),
            SB.VF_PREDS: np.zeros((cap, b), dtype=np.float32),
            SB.ACTION_DIST_INPUTS: np.zeros((cap, b, k), dtype=np.float32),
            SB.EPS_ID: np.zeros((cap, b), dtype=np.int64),
            SB.T: np.zeros((cap, b), dtype=np.int64),
            VALID: np.zeros((cap, b), dtype=bool),
        }

    def grow(self) -> None:
        self.buf = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in self.buf.items()}

    def fragment(self, steps: int, last_end: np.ndarray | None, record_next_obs: bool) -> SampleBatch:
        """The first ``steps`` rows, postprocessed; ``last_end`` (complete_episodes): each copy's last
        step that ended an episode, rows after it dropped."""
        frag = SampleBatch({k: v[:steps] for k, v in self.buf.items()})
        self.buf = {}
        if last_end is not None:
            frag[VALID] &= np.arange(steps)[:, None] <= last_end[self.copy][None, :]
        return finish_fragment(self.policy, frag, self.obs, self.state or None, record_next_obs)


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
        self.complete_episodes = r.batch_mode == "complete_episodes"
        cfg = getattr(policy_factory, "cfg", None)
        self._count_agent_steps = cfg is not None and cfg.multiagent.count_steps_by == "agent_steps"
        self.env = env_copies(spec.env, n)
        self.agent_names: list[str] = list(self.env.possible_agents)
        self.agent_policy, self.spaces, self.policy_map = self._policies(policy_factory, cfg)
        self.policy: Policy | None = self.policy_map.get(DEFAULT_POLICY_ID)  # a single-agent run's policy
        self.obs_space, self.action_space = self.spaces.get(DEFAULT_POLICY_ID, (None, None))
        self._per_agent = self.policy is None or len(self.agent_names) > 1
        self.slots = [Slots(pid, p, [i for i, a in enumerate(self.agent_names) if self.agent_policy[a] == pid],
                            n, self.spaces[pid], self.agent_names) for pid, p in self.policy_map.items()]
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
        # copy c of worker w is seeded with seed + 1000 * w + c
        self._see(*self.env.reset(seed=spec.seed + 1000 * spec.worker_index))

    def _policies(self, factory: Any, cfg: Any) -> tuple[dict[str, str], dict[str, tuple], PolicyMap]:
        """Agent -> policy id, policy id -> (obs space, action space), and the policy map. The single
        place the worker asks whether the env is single-agent: its one agent acts for default_policy."""
        if getattr(self.env, "one_agent", False):
            agent = self.agent_names[0]
            spaces = {DEFAULT_POLICY_ID: (self.env.observation_space(agent), self.env.action_space(agent))}
            return {agent: DEFAULT_POLICY_ID}, spaces, factory(*spaces[DEFAULT_POLICY_ID])
        mapping, _, spaces = policy_spaces(cfg, self.env)
        return mapping, spaces, factory.policies(spaces)

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
                self._end_episodes(ended)
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
        result = batches[DEFAULT_POLICY_ID] if self.policy is not None else MultiAgentBatch(batches, env_steps)
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

    def _end_episodes(self, ended: np.ndarray) -> None:
        """The copies ``ended`` finished their episodes: statistics out, counters and ids anew."""
        self._episodes.returns.extend(self._ep_return[ended].tolist())
        self._episodes.lengths.extend(self._ep_len[ended].tolist())
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

    def _restart_episodes(self) -> None:
        """complete_episodes: unfinished episodes were dropped, so every copy starts afresh."""
        self._agent_return[:] = 0.0
        self._took_part[:] = False
        self._ep_return[:] = 0.0
        self._ep_len[:] = 0
        self._eps_id = self._new_ids(self.num_envs)
        for g in self.slots:
            g.restart()
        self._see(*self.env.reset())

    def stop(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        # Ray shows a worker whose constructor failed too: no num_envs then
        n = getattr(self, "num_envs", "?")
        return f"RolloutWorker(index={self.spec.worker_index}, env={self.spec.env.id}, num_envs={n})"



