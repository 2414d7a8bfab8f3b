"""Greedy evaluation on separate envs: ``explore=False`` actions, whole episodes, fixed count.

Each of the ``num_envs`` sub-envs runs its share of ``num_episodes`` (so long episodes are not
under-counted), on seeds disjoint from the training envs'.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np

from rlrun.config.schemas import EnvConfig
from rlrun.core.metrics import mean_min_max
from rlrun.envs.make import env_from_config
from rlrun.policy.policy import Policy

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
