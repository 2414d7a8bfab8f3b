"""Greedy episodes of a multi-agent env: every agent acts with its policy's deterministic action.

Episodes run one after another on one env copy (seeds disjoint from training's), so that the same
loop also records frames for ``rlrun-eval render=true``. Returns the episode returns summed over
agents and, per policy, the returns of the agents it acts for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlrun.envs.multi_agent import make_multi_agent_env
from rlrun.policy.policy_map import policy_spaces
from rlrun.training.evaluation import EVAL_SEED_OFFSET, EvalResult


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
            totals: dict[str, float] = {}
            length = 0
            while env.agents:
                if frames is not None and t % frame_skip == 0 and len(frames) < max_frames:
                    frames.append(np.asarray(env.render()))
                t += 1
                actions = _actions(policies, agent_policy, adapters, spaces, obs, env.agents, explore)
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
             spaces: Mapping[str, tuple], obs: Mapping[str, Any], agents: list[str], explore: bool) -> dict[str, Any]:
    """One forward pass per policy over the agents it acts for."""
    groups: dict[str, list[str]] = {}
    for agent in agents:
        groups.setdefault(agent_policy[agent], []).append(agent)
    actions: dict[str, Any] = {}
    for pid, members in groups.items():
        batch = np.stack([adapters[a](obs[a]) for a in members])
        out = policies[pid].compute_actions(policies[pid].filter_obs(batch), explore=explore).actions
        space = spaces[pid][1]
        if hasattr(space, "low") and space.shape != ():
            out = np.clip(out, space.low, space.high)
        actions.update(zip(members, out, strict=True))
    return actions
