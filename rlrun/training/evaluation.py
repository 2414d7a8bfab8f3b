"""Greedy evaluation on separate env copies: ``explore=False`` actions, whole episodes, fixed count.

One loop (``play``) for single- and multi-agent runs, over the env copies of ``rlrun/envs/copies.py``
and the policies' slots (``rlrun/sources/slots.py``): every policy acts for the agents mapped to it, one
forward pass per policy and step; each copy plays its share of ``num_episodes`` (so long episodes are
not under-counted); a recurrent policy's slots carry their state and start afresh when their copy is
reset; observation filters are frozen. An episode's return is summed over its agents and, per named
policy, kept for each agent it acts for. ``rlrun-eval render=true`` plays the same loop on one copy
that renders frames. Seeds are disjoint from the training envs'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rlrun.config.schemas import EnvConfig, RunConfig
from rlrun.core.metrics import DEFAULT_POLICY_ID, mean_min_max, seat_metric_name
from rlrun.envs.copies import OneAgentEnv, env_copies, render_copy
from rlrun.envs.make import env_from_config
from rlrun.policy.policy import Policy
from rlrun.policy.policy_map import copy_spaces
from rlrun.sources.slots import Slots

EVAL_SEED_OFFSET = 10_000_019


class EvalResult(NamedTuple):
    returns: list[float]  # per episode (multi-agent: summed over its agents)
    lengths: list[int]
    policy_returns: dict[str, list[float]] | None = None  # named policies: policy id -> its agents' returns
    # env.shuffle_seats: policy id -> seat (the env's agent its agents played) -> their returns there
    seat_returns: dict[str, dict[str, list[float]]] | None = None

    def metrics(self) -> dict[str, float]:
        out = {**mean_min_max("eval/episode_return", self.returns),
               "eval/episode_len_mean": float(np.mean(self.lengths)), "eval/num_episodes": float(len(self.returns))}
        for pid, returns in (self.policy_returns or {}).items():
            out[f"eval/{pid}/episode_return_mean"] = float(np.mean(returns))
        for pid, seats in (self.seat_returns or {}).items():
            for seat, returns in seats.items():
                out[seat_metric_name(pid, seat)] = float(np.mean(returns))
        return out


class Frames(NamedTuple):
    """Where ``play`` keeps rendered frames: every ``skip``-th step of the copy, up to ``limit``."""

    frames: list[np.ndarray]
    limit: int
    skip: int = 1


def play(policies: Mapping[str, Any], mapping: Mapping[str, str], spaces: Mapping[str, tuple], env: Any,
         num_episodes: int, seed: int | None, explore: bool = False, frames: Frames | None = None) -> EvalResult:
    """``num_episodes`` whole episodes on the env copies ``env`` (``mapping``: agent -> policy id;
    ``spaces``: policy id -> its spaces); ``explore``: actions sampled as in training."""
    n, names = env.num_envs, list(env.possible_agents)
    quota = np.array([num_episodes // n + (i < num_episodes % n) for i in range(n)])
    slots = [Slots(pid, policies[pid], [i for i, a in enumerate(names) if mapping[a] == pid], n, spaces[pid], names,
                   record=False) for pid in spaces]
    ret, length, done = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64)
    agent_ret, took_part = np.zeros((len(names), n)), np.zeros((len(names), n), bool)
    returns: list[float] = []
    lengths: list[int] = []
    per_policy: dict[str, list[float]] = {pid: [] for pid in spaces}
    per_seat: dict[str, dict[str, list[float]]] = {}
    seats_of = getattr(env, "seats", None)  # ParallelEnvs: a copy's seats this episode (env.shuffle_seats)
    obs, acting = env.reset(seed=seed)
    for g in slots:
        g.see(obs, acting)
    pending = np.zeros(n, bool)  # the copy takes its autoreset step next: nothing to see or count
    t = 0
    while (done < quota).any():
        if frames is not None and not pending[0]:
            if t % frames.skip == 0 and len(frames.frames) < frames.limit:
                frames.frames.append(np.asarray(env.render()))
            t += 1
        actions: dict[str, np.ndarray] = {}
        for g in slots:
            g.act(explore, n, actions)
            took_part[g.agent, g.copy] |= g.acting
        st = env.step(actions)
        for g in slots:
            g.after_step(0, st, None, None)  # type: ignore[arg-type]  # record=False: no buffer row
        live = st.stepped & (done < quota)  # skip autoreset steps and copies that have played their share
        for i, a in enumerate(names):
            r = np.where(live, st.rewards[a], 0.0)
            ret += r
            agent_ret[i] += r
        length += live
        ended = st.episode_end & live
        if frames is not None and ended[0] and len(frames.frames) < frames.limit:  # the episode's last state
            frames.frames.append(np.asarray(env.render()))  # (the copy resets on its next step)
        if st.game is None:
            finished, rets, lens = ended, ret, length
        else:  # episodic_life: an episode a life; the statistics are whole games, as the env counted them
            finished, rets, lens = st.game.end & live, st.game.returns, st.game.lengths
        for c in np.flatnonzero(finished):
            returns.append(float(rets[c]))
            lengths.append(int(lens[c]))
            done[c] += 1
            seats = seats_of(c) if seats_of is not None else None
            for k in np.flatnonzero(took_part[:, c]):
                per_policy[mapping[names[k]]].append(float(agent_ret[k, c]))
                if seats is not None:
                    per_seat.setdefault(mapping[names[k]], {}).setdefault(seats[names[k]], []).append(
                        float(agent_ret[k, c]))
        ret[ended], length[ended], agent_ret[:, ended], took_part[:, ended] = 0.0, 0, 0.0, False
        pending = st.episode_end
    named = {pid: r for pid, r in per_policy.items() if r and pid != DEFAULT_POLICY_ID}  # default: the run's own
    return EvalResult(returns, lengths, named or None, {pid: dict(sorted(by.items())) for pid, by in per_seat.items()
                                                        if pid in named} or None)


def evaluate(policy: Policy, env_cfg: EnvConfig, num_episodes: int, num_envs: int, seed: int,
             env: gym.vector.VectorEnv | None = None, explore: bool = False) -> EvalResult:
    """One policy's ``num_episodes`` greedy episodes on a single-agent env (``env``, a gymnasium vector
    env, optional; ``explore``: actions sampled as in training)."""
    own = env is None
    vec = env if env is not None else env_from_config(env_cfg, max(1, min(num_envs, num_episodes)))
    copies = OneAgentEnv(vec)
    mapping, spaces = copy_spaces(RunConfig(), copies)  # a run without multiagent.policies: default_policy
    try:
        return play({DEFAULT_POLICY_ID: policy}, mapping, spaces, copies, num_episodes, seed + EVAL_SEED_OFFSET,
                    explore)
    finally:
        if own:
            vec.close()


def evaluate_run(policies: Mapping[str, Any], cfg: Any, num_episodes: int, num_envs: int, seed: int,
                 env: Any = None, explore: bool = False) -> EvalResult:
    """A run's evaluation episodes with its policy map (``env``: copies from ``evaluation_env``, reused
    across calls; optional)."""
    copies = env if env is not None else evaluation_env(cfg, num_episodes, num_envs)
    try:
        mapping, spaces = copy_spaces(cfg, copies)
        return play(policies, mapping, spaces, copies, num_episodes, seed + EVAL_SEED_OFFSET, explore)
    finally:
        if env is None:
            copies.close()


def evaluation_env(cfg: Any, num_episodes: int, num_envs: int) -> Any:
    """The env copies ``evaluate_run`` plays on, made once and reused."""
    return env_copies(cfg.env, max(1, min(num_envs, num_episodes)), rotate_seats=True)


def render_run(policies: Mapping[str, Any], cfg: Any, episodes: int, seed: int, max_frames: int, frame_skip: int,
               explore: bool = False) -> tuple[list[np.ndarray], list[float], float]:
    """Episodes on one copy that renders ``rgb_array`` frames: every ``frame_skip``-th frame (up to
    ``max_frames``), the episodes' returns and the frame rate (``rlrun-eval render=true``)."""
    env = render_copy(cfg.env)
    try:
        mapping, spaces = copy_spaces(cfg, env)
        frames = Frames([], max_frames, frame_skip)
        result = play(policies, mapping, spaces, env, episodes, seed, explore, frames)
        return frames.frames, result.returns, float(env.metadata.get("render_fps") or 30) / frame_skip
    finally:
        env.close()
