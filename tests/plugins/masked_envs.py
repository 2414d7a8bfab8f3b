"""Envs whose observations carry an action mask (``plugins=[masked_envs]``), each of which raises on an
illegal action, so a run that finishes never took one.

``masked_pick``: a single-agent env. Each step a random half of ``n`` actions is legal (at least one);
the observation is the mask (as floats) under ``observation``. Picking the highest legal action earns
1, any other legal one 0; an episode is 10 steps (truncated). A policy that learned the rule earns 10,
one that picks uniformly among the legal actions about 4.

``masked_pair``: the same game for two agents (PettingZoo's Parallel API), each with its own mask.
"""

import gymnasium as gym
import numpy as np

from rlrun import ENVS

LENGTH = 10


class IllegalAction(RuntimeError):
    pass


def _mask(rng: np.random.Generator, n: int) -> np.ndarray:
    mask = (rng.random(n) < 0.5).astype(np.int8)
    mask[rng.integers(n)] = 1
    return mask


def _reward(mask: np.ndarray, action: int) -> float:
    if not mask[int(action)]:
        raise IllegalAction(f"action {int(action)} is illegal under mask {mask.tolist()}")
    return float(int(action) == int(np.flatnonzero(mask).max()))


def _space(n: int) -> gym.spaces.Dict:
    return gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (n,), np.int8),
                            "observation": gym.spaces.Box(0.0, 1.0, (n,), np.float32)})


class MaskedPick(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, n: int = 6, render_mode: str | None = None) -> None:
        self.n = n
        self.render_mode = render_mode
        self.observation_space = _space(n)
        self.action_space = gym.spaces.Discrete(n)
        self.rng = np.random.default_rng(0)

    def _obs(self) -> dict:
        return {"action_mask": self.mask, "observation": self.mask.astype(np.float32)}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.mask = _mask(self.rng, self.n)
        return self._obs(), {}

    def step(self, action):
        reward = _reward(self.mask, action)
        self.t += 1
        self.mask = _mask(self.rng, self.n)
        return self._obs(), reward, False, self.t >= LENGTH, {}

    def render(self):
        """The mask as a row of white (legal) and black squares."""
        return np.repeat(np.repeat(self.mask.astype(np.uint8)[None, :, None] * 255, 8, 0), 8, 1).repeat(3, 2)


class MaskedPair:
    possible_agents = ["a", "b"]

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return _space(self.n)

    def action_space(self, agent):
        return gym.spaces.Discrete(self.n)

    def _obs(self):
        return {a: {"action_mask": m, "observation": m.astype(np.float32)} for a, m in self.masks.items()}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        self.masks = {a: _mask(self.rng, self.n) for a in self.agents}
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {a: _reward(self.masks[a], actions[a]) for a in self.agents}
        self.t += 1
        self.masks = {a: _mask(self.rng, self.n) for a in self.agents}
        done = self.t >= LENGTH
        obs = self._obs()
        if done:
            self.agents = []
        return obs, rewards, dict.fromkeys(obs, False), dict.fromkeys(obs, done), {a: {} for a in obs}

    def close(self):
        pass


ENVS.add("masked_pick", MaskedPick, vector=False)
ENVS.add("masked_pair", MaskedPair, multi_agent=True)
