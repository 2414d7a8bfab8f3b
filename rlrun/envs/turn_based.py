"""Turn-based games: a PettingZoo AEC env (players move one at a time) behind the Parallel API rlrun samples.

PettingZoo's classic board games (tic-tac-toe, connect four, chess, go, ...) are AEC envs that cannot be
turned into Parallel ones with ``aec_to_parallel``: one player moves, the others wait. ``TurnBasedEnv``
presents one as a Parallel env whose ``agents`` is the one player to move now (so the rollout worker's
slots act for that player only), and adds ``live_agents``, every player still in the game, waiting or not:

- ``step({mover: action})`` plays the move and returns the rewards of *every* player (AEC's ``rewards``
  after the move: the loser's -1 arrives while it waits), the termination and truncation flags of every
  player the move ended, the next mover's observation, and the final observation of every player whose
  game ended. Players that are done then take PettingZoo's dead step (``step(None)``) here, so ``agents``
  is empty exactly when the game is over.
- The rollout worker credits a reward or a flag that reaches a waiting player to that player's last
  move (``rlrun/sources/slots.py``), lays each player's moves out as one contiguous trajectory and
  samples whole games (``batch_mode: complete_episodes``): a player's reward for a move is everything
  it receives until it moves again, as in PettingZoo's ``last()``.

The same wrapper takes an AEC env from a registered multi-agent factory (a parallelizable one goes through
``aec_to_parallel``, as a ``pettingzoo:`` id's does).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlrun.core.errors import PluginError


def is_turn_based(env: Any) -> bool:
    """An AEC env (PettingZoo's ``agent_iter``, ``last`` and ``observe``) rather than a Parallel one."""
    return all(callable(getattr(env, k, None)) for k in ("agent_iter", "last", "observe"))


class TurnBasedEnv:
    """One AEC env as a Parallel-API env: ``agents`` = the player to move (none once the game is over),
    ``live_agents`` = the players still in the game."""

    turn_based = True

    def __init__(self, aec: Any) -> None:
        self.aec = aec
        self.possible_agents = list(aec.possible_agents)
        self.metadata = getattr(aec, "metadata", {})
        self.render_mode = getattr(aec, "render_mode", None)
        self.agents: list[str] = []
        self.live_agents: list[str] = []

    def observation_space(self, agent: str) -> gym.Space:
        return self.aec.observation_space(agent)

    def action_space(self, agent: str) -> gym.Space:
        return self.aec.action_space(agent)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        self.aec.reset(seed=seed, options=options)
        obs = self._next({})
        return obs, {a: dict(self.aec.infos.get(a, {})) for a in obs}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        aec, playing = self.aec, set(self.live_agents)
        aec.step(actions[aec.agent_selection])
        rewards = {a: float(r) for a, r in aec.rewards.items()}
        terms = {a: bool(aec.terminations.get(a, False)) for a in aec.agents}
        truncs = {a: bool(aec.truncations.get(a, False)) for a in aec.agents}
        infos = {a: dict(aec.infos.get(a, {})) for a in aec.agents}
        final = {a: aec.observe(a) for a in aec.agents if a in playing and (terms[a] or truncs[a])}
        return self._next(final), rewards, terms, truncs, infos

    def _next(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Dead steps for the players that are done, then the next mover's observation into ``obs``."""
        aec = self.aec
        while aec.agents and self._done(aec.agent_selection):
            who, before = aec.agent_selection, len(aec.agents)
            aec.step(None)  # PettingZoo's dead step: removes the player
            if len(aec.agents) >= before:
                raise PluginError(f"env: {aec}'s dead step (step(None) for {who}, which is done) "
                                  "did not remove the player, as PettingZoo's AEC API has it")
        # the players still in the game: one that is done but not removed yet (its turn has not come) is out
        self.live_agents = [a for a in aec.agents if not self._done(a)]
        self.agents = [aec.agent_selection] if aec.agents else []
        for a in self.agents:
            obs[a] = aec.observe(a)
        return obs

    def _done(self, agent: str) -> bool:
        aec = self.aec
        if agent not in aec.terminations:
            raise PluginError(f"env: {aec}'s agent_selection {agent!r} is not one of its agents {list(aec.agents)}")
        return bool(aec.terminations[agent] or aec.truncations[agent])

    def render(self) -> Any:
        return self.aec.render()

    def close(self) -> None:
        self.aec.close()
