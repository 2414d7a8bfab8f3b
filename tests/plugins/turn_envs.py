"""A turn-based test game written on PettingZoo's AEC API (``pettingzoo.AECEnv``): registered as a
multi-agent factory, so rlrun plays it through ``TurnBasedEnv``.

``nim``: a pile of ``pile`` sticks; ``players`` players (``player_1``, ``player_2``, ...) take turns taking 1
or 2 (action 0 or 1; taking more than is left is illegal, masked, and raises); whoever takes the last stick
gets +1 and every other player still in the game -1. With ``resign=True`` action 2 resigns: the player gets
-1 and is out (PettingZoo's dead step comes next), and the last player left wins +1. ``max_moves``
truncates the game (every player in it) after that many moves. The observation is the pile one-hot
(``pile + 1`` entries) and the action mask.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv

from rlrun import ENVS


class IllegalMove(RuntimeError):
    pass


class Nim(AECEnv):
    metadata = {"name": "nim", "render_modes": ["rgb_array"], "is_parallelizable": False}

    def __init__(self, pile: int = 7, max_moves: int | None = None, players: int = 2, resign: bool = False,
                 render_mode: str | None = None) -> None:
        super().__init__()
        self.start, self.max_moves, self.resign, self.render_mode = pile, max_moves, resign, render_mode
        self.possible_agents = [f"player_{i + 1}" for i in range(players)]
        n = 3 if resign else 2
        self._obs_space = gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (pile + 1,), np.int8),
                                           "action_mask": gym.spaces.Box(0, 1, (n,), np.int8)})
        self._action_space = gym.spaces.Discrete(n)

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._action_space

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        board = np.zeros(self.start + 1, np.int8)
        board[self.pile] = 1
        mask = [self.pile >= 1, self.pile >= 2] + [True] * self.resign
        return {"observation": board, "action_mask": np.array(mask, np.int8)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.pile, self.moves = self.start, 0
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]

    def _live(self) -> list[str]:
        return [a for a in self.agents if not (self.terminations[a] or self.truncations[a])]

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        live = self._live()
        others = [a for a in live if a != agent]
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.moves += 1
        if action == 2 and self.resign:
            self.rewards[agent], self.terminations[agent] = -1.0, True
            if len(others) == 1:
                self.rewards[others[0]], self.terminations[others[0]] = 1.0, True
        else:
            take = int(action) + 1  # type: ignore[arg-type]
            if take > self.pile or action not in (0, 1):
                raise IllegalMove(f"{agent} took {take} of {self.pile}")
            self.pile -= take
            if self.pile == 0:
                self.rewards[agent] = 1.0
                for a in others:
                    self.rewards[a] = -1.0
                for a in live:
                    self.terminations[a] = True
        if self.max_moves is not None and self.moves >= self.max_moves:
            for a in self._live():
                self.truncations[a] = True
        self.agent_selection = live[(live.index(agent) + 1) % len(live)]
        self._accumulate_rewards()
        self._deads_step_first()  # a player that is out takes its dead step next

    def render(self) -> np.ndarray:
        frame = np.zeros((8, 8 * (self.start + 1), 3), np.uint8)
        frame[:, : 8 * self.pile] = 255
        return frame

    def close(self) -> None:
        pass


ENVS.add("nim", Nim, multi_agent=True)
