"""Slots: one policy's share of a sampling loop over env copies (``rlrun/envs/copies.py``).

A slot is one (agent mapped to the policy, env copy) pair, agent-major; a single-agent run's slots are its
sub-envs. Each vector step does one forward pass per policy over all its slots. A learning policy's
slots write a time-major buffer ``[T, slots]``; a slot's row is valid where its agent acted. A recurrent
policy's slot keeps its state while its agent waits and starts from the initial state when its copy is
reset. The rollout worker and greedy evaluation both play through slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.data.batch import SampleBatch
from rlrun.models.sequences import STATE_IN
from rlrun.policy.policy import ActionOutput
from rlrun.sources.worker_base import VALID, finish_fragment

SB = SampleBatch


class Slots:
    """One policy's share of the worker: its slots (agent-major over env copies), what each slot sees
    now, whether its agent acts, a recurrent policy's state, and (a learning policy) its time-major
    fragment buffer ``[T, slots]``."""

    def __init__(self, pid: str, policy: Any, agents: list[int], num_envs: int, spaces: tuple[gym.Space, gym.Space],
                 names: list[str], record: bool = True, turns: bool = False) -> None:
        self.pid, self.policy, self.spaces = pid, policy, spaces
        self.agents = agents  # indices into the env's possible_agents
        self.one = names[agents[0]] if len(agents) == 1 else None  # the policy's one agent, if it has one
        self.names = names
        self.copy = np.tile(np.arange(num_envs), len(agents))  # slot j: agent j // n of the policy's, copy j % n
        self.agent = np.repeat(agents, num_envs).astype(np.int64)
        self.whole = agents == [0] and len(names) == 1  # the one agent of a single-agent env: slots are the copies
        self.n_agents = len(names)
        self.record = record  # False (evaluation): no buffer, observation filters frozen
        self.learns = record and getattr(policy, "learns", True)
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
        # multi-agent: each slot's last valid row of its episode in the buffer (-1: none), where a reward or
        # a flag that arrives while its agent waits is credited; a turn-based game: its player's moves so far
        self.last = np.full(len(self.copy), -1, np.int64)
        self.t = np.zeros(len(self.copy), np.int64)
        self.turns = turns  # a turn-based game: fragments laid out per agent (compact) before postprocessing
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
        self.obs = self.policy.filter_obs(raw, update=self.record) if self.filtered else raw

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
            rew, term, trunc = st.rewards[one], st.terminateds[one], st.truncateds[one]
        else:
            rew, term, trunc = self.gather(st.rewards), self.gather(st.terminateds), self.gather(st.truncateds)
        buf[SB.REWARDS][step], buf[SB.TERMINATEDS][step], buf[SB.TRUNCATEDS][step] = rew, term, trunc
        buf[SB.ACTION_LOGP][step] = out.logp
        buf[SB.VF_PREDS][step] = out.values
        buf[SB.ACTION_DIST_INPUTS][step] = out.dist_inputs
        if self.whole:
            buf[SB.EPS_ID][step] = eps_id
            buf[SB.T][step] = ep_len
        else:  # one trajectory id per (episode, agent); t: the env step's index in the episode
            buf[SB.EPS_ID][step] = eps_id[self.copy] * self.n_agents + self.agent
            self._credit_waiting(step, rew, term, trunc, ~st.stepped[self.copy], ep_len)
        buf[VALID][step] = self.acting
        for k, s in enumerate(self.state):
            buf[f"{STATE_IN}{k}"][step] = s

    def _credit_waiting(self, step: int, rew: np.ndarray, term: np.ndarray, trunc: np.ndarray,
                        reset: np.ndarray, ep_len: np.ndarray) -> None:
        """A reward or flag that reaches an agent while it waits (a turn-based game: the loser's -1 comes
        with the winner's move) goes to the agent's last row of the episode, unless that row ended its
        trajectory (an agent that left: what it receives afterwards is not learned from, as before; nor
        is what an agent receives before its first step); this step's rows become the acting slots' last
        ones. A turn-based game's ``t`` is the player's own move number (its moves are
        one sequence for an LSTM) and its reset rows are kept (``compact``)."""
        buf, acted, last = self.buf, self.acting, self.last
        late = ~acted & (last >= 0) & ((rew != 0) | term | trunc)
        if late.any():
            j = np.flatnonzero(late)
            rows = last[j]
            still = ~(buf[SB.TERMINATEDS][rows, j] | buf[SB.TRUNCATEDS][rows, j])  # an agent that left is done
            j, rows = j[still], rows[still]
            buf[SB.REWARDS][rows, j] += rew[j]
            buf[SB.TERMINATEDS][rows, j] |= term[j]
            buf[SB.TRUNCATEDS][rows, j] |= trunc[j]
        last[acted] = step
        last[reset] = -1  # the copy starts its next episode
        if self.turns:
            buf[SB.T][step], buf[RESET][step] = self.t, reset
            self.t += acted
            self.t[reset] = 0
        else:
            buf[SB.T][step] = ep_len[self.copy]

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
        self.last[:], self.t[:] = -1, 0

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
        if self.turns:
            self.buf[RESET] = np.zeros((cap, b), dtype=bool)

    @property
    def nbytes(self) -> int:
        """The fragment buffer's size in bytes."""
        return sum(v.nbytes for v in self.buf.values())

    def grow(self) -> None:
        self.buf = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in self.buf.items()}

    def fragment(self, steps: int, last_end: np.ndarray | None, record_next_obs: bool) -> SampleBatch:
        """The first ``steps`` rows, postprocessed; ``last_end`` (complete_episodes): each copy's last
        step that ended an episode, rows after it dropped."""
        frag = SampleBatch({k: v[:steps] for k, v in self.buf.items()})
        self.buf = {}
        self.last[:] = -1  # rows of the next fragment
        if last_end is not None:
            frag[VALID] &= np.arange(steps)[:, None] <= last_end[self.copy][None, :]
        if self.turns:
            frag = compact(frag)
        return finish_fragment(self.policy, frag, self.obs, self.state or None, record_next_obs)


RESET = "_reset"  # a turn-based policy's buffer only: the row's copy was being reset (its value: the bootstrap)


def compact(frag: SampleBatch) -> SampleBatch:
    """A turn-based game's time-major fragment ``[T, slots]`` with each column's rows that matter, valid
    ones and its copy's reset rows (whose values, on the final observations, bootstrap a truncated game),
    moved to the column's end in time order, the rest (the agent waiting) before them and invalid. So each
    agent's moves are consecutive rows: GAE, n-step returns and next observations run from one move of
    the agent to its next, and its last row is next to the bootstrap values."""
    keep = frag[VALID] | frag.pop(RESET)
    order = np.argsort(keep, axis=0, kind="stable")  # per column: the others first, then the kept rows in order
    for k, v in list(frag.items()):
        frag[k] = np.take_along_axis(v, order.reshape(order.shape + (1,) * (v.ndim - 2)), axis=0)
    return frag
