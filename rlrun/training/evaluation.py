"""Greedy evaluation on separate envs: ``explore=False`` actions, whole episodes, fixed count.

``evaluate_run`` evaluates a run's policy map. A single-agent env: each of the ``num_envs`` sub-envs
runs its share of ``num_episodes`` (so long episodes are not under-counted). A multi-agent env: the
episodes run one after another on one env copy, every agent acting with its policy, so that the same
loop records frames for ``rlrun-eval render=true``; the returns are summed over agents and, per
policy, kept for the agents it acts for. Seeds are disjoint from the training envs'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rlrun.config.schemas import EnvConfig
from rlrun.core.metrics import DEFAULT_POLICY_ID, mean_min_max
from rlrun.core.registry import ENVS, RegistryError
from rlrun.envs.make import check_env_id, env_from_config
from rlrun.envs.multi_agent import make_multi_agent_env
from rlrun.envs.wrappers import parse_wrappers, wrap_env
from rlrun.policy.policy import Policy
from rlrun.policy.policy_map import policy_spaces

EVAL_SEED_OFFSET = 10_000_019


class EvalResult(NamedTuple):
    returns: list[float]  # per episode (multi-agent: summed over its agents)
    lengths: list[int]
    policy_returns: dict[str, list[float]] | None = None  # multi-agent: policy id -> its agents' returns

    def metrics(self) -> dict[str, float]:
        out = {**mean_min_max("eval/episode_return", self.returns),
               "eval/episode_len_mean": float(np.mean(self.lengths)), "eval/num_episodes": float(len(self.returns))}
        for pid, returns in (self.policy_returns or {}).items():
            out[f"eval/{pid}/episode_return_mean"] = float(np.mean(returns))
        return out


def evaluate(policy: Policy, env_cfg: EnvConfig, num_episodes: int, num_envs: int, seed: int,
             env: gym.vector.VectorEnv | None = None, explore: bool = False) -> EvalResult:
    """Run ``num_episodes`` greedy episodes (``explore``: actions sampled as in training); ``env``
    (optional) is reused across calls."""
    n = max(1, min(num_envs, num_episodes))
    own = env is None
    env = env or env_from_config(env_cfg, n)
    n = env.num_envs
    quota = np.array([num_episodes // n + (i < num_episodes % n) for i in range(n)])
    box = isinstance(env.single_action_space, gym.spaces.Box)
    low, high = getattr(env.single_action_space, "low", None), getattr(env.single_action_space, "high", None)
    obs, _ = env.reset(seed=seed + EVAL_SEED_OFFSET)
    ret = np.zeros(n)
    length = np.zeros(n, dtype=np.int64)
    done_count = np.zeros(n, dtype=np.int64)
    prev_done = np.zeros(n, dtype=bool)
    returns: list[float] = []
    lengths: list[int] = []
    recurrent = getattr(policy, "recurrent", False)  # duck-typed policies (no state) are evaluated too
    state = policy.initial_state(n) if recurrent else None
    try:
        while (done_count < quota).any():
            out = policy.compute_actions(policy.filter_obs(obs), explore=explore, state=state) if recurrent else \
                policy.compute_actions(policy.filter_obs(obs), explore=explore)  # frozen filter
            actions = out.actions
            obs, rew, term, trunc, _ = env.step(np.clip(actions, low, high) if box else actions)
            if recurrent:  # sub-envs that took their autoreset step start the next episode afresh
                state = [np.where(prev_done.reshape(-1, *([1] * (a.ndim - 1))), i, a)
                         for a, i in zip(out.state_out or [], policy.initial_state(n), strict=True)]
            live = ~prev_done & (done_count < quota)  # skip autoreset steps and finished sub-envs
            ret += np.where(live, rew, 0.0)
            length += live
            ended = (term | trunc) & live
            for i in np.flatnonzero(ended):
                returns.append(float(ret[i]))
                lengths.append(int(length[i]))
                done_count[i] += 1
            ret[ended] = 0.0
            length[ended] = 0
            prev_done = term | trunc
    finally:
        if own:
            env.close()
    return EvalResult(returns, lengths)


def evaluate_run(policies: Mapping[str, Any], cfg: Any, num_episodes: int, num_envs: int, seed: int,
                 env: Any = None, explore: bool = False) -> EvalResult:
    """A run's evaluation episodes with its policy map (``env``, optional, is reused across calls)."""
    if cfg.multiagent.policies:  # agents act with their policies on a multi-agent env
        return evaluate_multi_agent(policies, cfg, num_episodes, seed, env, explore=explore)
    return evaluate(policies[DEFAULT_POLICY_ID], cfg.env, num_episodes, num_envs, seed, env, explore)


def evaluation_env(cfg: Any, num_episodes: int, num_envs: int) -> Any:
    """The env ``evaluate_run`` plays on, made once and reused."""
    if cfg.multiagent.policies:
        return make_multi_agent_env(cfg.env.id, cfg.env.kwargs)
    return env_from_config(cfg.env, max(1, min(num_envs, num_episodes)))


def evaluate_multi_agent(policies: Mapping[str, Any], cfg: Any, num_episodes: int, seed: int, env: Any = None,
                         frames: list[np.ndarray] | None = None, max_frames: int = 0,
                         frame_skip: int = 1, explore: bool = False) -> EvalResult:
    """``num_episodes`` greedy episodes (``explore``: sampled actions); ``frames`` (a list) collects
    every ``frame_skip``-th rendered frame up to ``max_frames`` (the env must have been made with
    ``render_mode='rgb_array'``)."""
    own = env is None
    env = env if env is not None else make_multi_agent_env(cfg.env.id, cfg.env.kwargs)
    agent_policy, adapters, spaces = policy_spaces(cfg, env)
    returns: list[float] = []
    lengths: list[int] = []
    per_policy: dict[str, list[float]] = {pid: [] for pid in policies}
    t = 0
    try:
        for ep in range(num_episodes):
            obs, _ = env.reset(seed=seed + EVAL_SEED_OFFSET + ep)
            states: dict[str, list[np.ndarray]] = {}  # recurrent policies: each agent's state, from its first step
            totals: dict[str, float] = {}
            length = 0
            while env.agents:
                if frames is not None and t % frame_skip == 0 and len(frames) < max_frames:
                    frames.append(np.asarray(env.render()))
                t += 1
                actions = _actions(policies, agent_policy, adapters, spaces, obs, env.agents, explore, states)
                obs, rew, _, _, _ = env.step(actions)
                for agent, r in rew.items():
                    totals[agent] = totals.get(agent, 0.0) + float(r)
                length += 1
            returns.append(sum(totals.values()))
            lengths.append(length)
            for agent, total in totals.items():
                per_policy[agent_policy[agent]].append(total)
    finally:
        if own:
            env.close()
    return EvalResult(returns, lengths, {pid: r for pid, r in per_policy.items() if r})


def _actions(policies: Mapping[str, Any], agent_policy: Mapping[str, str], adapters: Mapping[str, Any],
             spaces: Mapping[str, tuple], obs: Mapping[str, Any], agents: list[str], explore: bool,
             states: dict[str, list[np.ndarray]]) -> dict[str, Any]:
    """One forward pass per policy over the agents it acts for; a recurrent policy's agents each carry
    their state in ``states`` (an agent's first step starts from the initial state)."""
    groups: dict[str, list[str]] = {}
    for agent in agents:
        groups.setdefault(agent_policy[agent], []).append(agent)
    actions: dict[str, Any] = {}
    for pid, members in groups.items():
        policy = policies[pid]
        batch = policy.filter_obs(np.stack([adapters[a](obs[a]) for a in members]))
        if getattr(policy, "recurrent", False):
            first = policy.initial_state(1)
            state = [np.concatenate([states.get(a, first)[k] for a in members]) for k in range(len(first))]
            result = policy.compute_actions(batch, explore, state)
            for i, a in enumerate(members):
                states[a] = [s[i:i + 1] for s in result.state_out]
            out = result.actions
        else:
            out = policy.compute_actions(batch, explore=explore).actions
        space = spaces[pid][1]
        if hasattr(space, "low") and space.shape != ():
            out = np.clip(out, space.low, space.high)
        actions.update(zip(members, out, strict=True))
    return actions


# --------------------------------------------------------------------------- rendered episodes
def render_run(policies: Mapping[str, Any], cfg: Any, episodes: int, seed: int, max_frames: int, frame_skip: int,
               explore: bool = False) -> tuple[list[np.ndarray], list[float], float]:
    """Episodes on one env that renders ``rgb_array`` frames: every ``frame_skip``-th frame (up to
    ``max_frames``), the episodes' returns and the frame rate (``rlrun-eval render=true``)."""
    multi_agent = bool(cfg.multiagent.policies)
    env = make_render_env(cfg.env.id, cfg.env.kwargs, multi_agent, cfg.env.wrappers)
    try:
        if multi_agent:  # every agent acts with its policy, episodes one after another
            frames: list[np.ndarray] = []
            returns = evaluate_multi_agent(policies, cfg, episodes, seed, env, frames, max_frames, frame_skip,
                                           explore).returns
        else:
            frames, returns = record_episodes(policies[DEFAULT_POLICY_ID], env, episodes, seed, max_frames, frame_skip,
                                              explore)
        return frames, returns, float(env.metadata.get("render_fps") or 30) / frame_skip
    finally:
        env.close()


def make_render_env(env_id: str, kwargs: dict[str, Any], multi_agent: bool = False,
                    wrappers: Sequence[Any] = ()) -> Any:
    """One env that renders ``rgb_array`` frames (a gymnasium id, a plain rlrun env entry, or a
    multi-agent env that takes ``render_mode``), with the run's ``env.wrappers``."""
    if multi_agent:
        return make_multi_agent_env(env_id, {**kwargs, "render_mode": "rgb_array"})
    if env_id in ENVS:
        entry = ENVS.entry(env_id)
        if entry.info.get("vector", True):
            raise RegistryError(f"env.id: rlrun env '{env_id}' is a vector env; render needs a gymnasium id "
                                "or an env registered with vector=False that accepts render_mode")
        return wrap_env(entry.obj(render_mode="rgb_array", **kwargs), parse_wrappers(wrappers))
    check_env_id(env_id)  # imports the package of a MiniGrid id
    return wrap_env(gym.make(env_id, render_mode="rgb_array", **kwargs), parse_wrappers(wrappers))


def record_episodes(policy: Any, env: gym.Env, episodes: int, seed: int, max_frames: int,
                    frame_skip: int, explore: bool = False) -> tuple[list[np.ndarray], list[float]]:
    """Play greedy episodes (``explore``: sampled actions); return every ``frame_skip``-th frame (up to
    ``max_frames``) and the returns."""
    frames: list[np.ndarray] = []
    returns: list[float] = []
    box = isinstance(env.action_space, gym.spaces.Box)
    t = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        state = policy.initial_state(1)  # [] unless the model is recurrent
        while not done:
            if t % frame_skip == 0 and len(frames) < max_frames:
                frames.append(np.asarray(env.render()))
            x = policy.filter_obs(np.asarray(obs)[None])
            out = policy.compute_actions(x, explore=explore, state=state)
            action, state = out.actions[0], out.state_out
            if box:
                action = np.clip(action, env.action_space.low, env.action_space.high)  # type: ignore[attr-defined]
            obs, reward, term, trunc, _ = env.step(action)
            total += float(reward)
            done = bool(term or trunc)
            t += 1
        returns.append(total)
    return frames, returns
