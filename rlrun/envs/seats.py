"""Seat shuffling (``env.shuffle_seats``): each episode of a multi-agent env, its agents take the env's
seats in a new random order, so a policy mapped to ``player_1`` plays every seat of a game in turn, not
only the first mover's (RLlib's ``policy_mapping_fn(agent_id, episode)`` alternating sides by episode).

``SeatShuffle`` wraps one Parallel-API env (``TurnBasedEnv`` included). The agents it presents keep the
env's names (the names ``multiagent.policy_mapping`` maps); at each reset it draws a permutation of the
seats from its own generator (seeded by the reset's seed, then drawing on), and agent ``possible_agents[i]``
plays seat ``possible_agents[perm[i]]`` for that episode: its actions go to that seat, and that seat's
observations, rewards, flags and infos come back under its name. Every seat must have the same spaces,
checked when it is built. Evaluation copies rotate instead (``rotate_from``): copy c's k-th episode since its
last seeded reset shifts the agents ``c + k`` seats along, so every agent plays every seat equally often and
repeated evaluations play the same seats.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.typed import ConfigError

SEAT_STREAM = 0x5EA75  # mixed into the reset's seed for the seats' generator


def check_seats(env: Any, name: str) -> None:
    """``env``'s seats can be shuffled: two or more, all of the same spaces; else one ``ConfigError``."""
    agents = list(env.possible_agents)
    if len(agents) < 2:
        raise ConfigError(f"env.shuffle_seats: {name} has {len(agents)} agent(s) ({', '.join(agents) or 'none'}): "
                          "there are no seats to swap")
    first = agents[0]
    obs_space, act_space = env.observation_space(first), env.action_space(first)
    for a in agents[1:]:
        if env.observation_space(a) != obs_space or env.action_space(a) != act_space:
            raise ConfigError(
                f"env.shuffle_seats: {name}'s seats '{first}' and '{a}' differ ({obs_space}, {act_space} vs "
                f"{env.observation_space(a)}, {env.action_space(a)}); agents can only swap seats that are alike")


class SeatShuffle:
    """A Parallel-API multi-agent env whose agents change seats at every reset (the module docstring)."""

    def __init__(self, env: Any, name: str = "env", rotate_from: int | None = None) -> None:
        check_seats(env, name)
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.metadata = getattr(env, "metadata", {})
        self.render_mode = getattr(env, "render_mode", None)
        self.turn_based = bool(getattr(env, "turn_based", False))
        self._rng = np.random.default_rng()
        self._rotate_from, self._episode = rotate_from, 0
        self.seat_of = {a: a for a in self.possible_agents}  # agent -> the seat it plays this episode
        self._agent_at = dict(self.seat_of)  # seat -> agent

    def observation_space(self, agent: str) -> gym.Space:
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space(agent)

    @property
    def agents(self) -> list[str]:
        return [self._agent_at[s] for s in self.env.agents]

    @property
    def live_agents(self) -> list[str]:
        return [self._agent_at[s] for s in self.env.live_agents]

    def _named(self, by_seat: dict[str, Any]) -> dict[str, Any]:
        return {self._agent_at[s]: v for s, v in by_seat.items()}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        n = len(self.possible_agents)
        if seed is not None:  # a stream of its own: not the one the env's np_random(seed) draws from
            self._rng, self._episode = np.random.default_rng([seed, SEAT_STREAM]), 0
        if self._rotate_from is None:
            order = self._rng.permutation(n)
        else:
            order = (np.arange(n) + self._rotate_from + self._episode) % n
            self._episode += 1
        seats = [self.possible_agents[i] for i in order]
        self.seat_of = dict(zip(self.possible_agents, seats, strict=True))
        self._agent_at = {s: a for a, s in self.seat_of.items()}
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._named(obs), self._named(infos)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terms, truncs, infos = self.env.step({self.seat_of[a]: act for a, act in actions.items()})
        return self._named(obs), self._named(rewards), self._named(terms), self._named(truncs), self._named(infos)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
