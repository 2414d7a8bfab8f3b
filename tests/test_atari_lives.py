"""Atari's lives: ``episodic_life`` ends the learning episode at a lost life and plays the same game on,
``fire_reset`` presses FIRE at each start; the episode statistics (training and evaluation) still count
whole games. All on ale-py's real Breakout."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlrun.algos.algorithm import make_policy
from rlrun.algos.dqn import DQNConfig
from rlrun.config.schemas import EnvConfig, RolloutConfig
from rlrun.core.errors import PluginError
from rlrun.core.registry import WRAPPERS, RegistryError
from rlrun.data.batch import SampleBatch as SB
from rlrun.envs.make import env_from_config
from rlrun.envs.wrappers import parse_wrappers, wrap_env
from rlrun.models.q_networks import QCNNConfig
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.sources.plugins import load_builtins
from rlrun.sources.rollout_worker import RolloutWorker, WorkerSpec
from rlrun.training.evaluation import evaluate

ale_py = pytest.importorskip("ale_py")  # the atari extra is part of the test install: this never skips there
gym.register_envs(ale_py)
load_builtins()

PREPROCESS = {"name": "atari_preprocessing", "noop_max": 0, "screen_size": 42}
LIVES = [PREPROCESS, "episodic_life", "fire_reset"]
GAMES: list[tuple[float, int]] = []  # what game_truth saw: each game's score and steps
ABANDONED: list[int] = []  # games reset before their end: their steps


class GameTruth(gym.Wrapper):
    """Below episodic_life, as SB3's Monitor: every step of every game counted, hidden ones too."""

    def reset(self, **kwargs):
        if getattr(self, "_game", [0.0, 0])[1]:
            ABANDONED.append(self._game[1])
        self._game = [0.0, 0]
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game[0] += float(reward)
        self._game[1] += 1
        if terminated or truncated:
            GAMES.append((self._game[0], self._game[1]))
            self._game = [0.0, 0]
        return obs, reward, terminated, truncated, info


WRAPPERS.add("game_truth", GameTruth, override=True)


def breakout(wrappers):
    return wrap_env(gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0),
                    parse_wrappers(wrappers))


def test_a_lost_life_ends_the_episode_and_the_next_reset_plays_the_same_game_on():
    env = breakout([PREPROCESS, "episodic_life"])
    rng = np.random.default_rng(0)
    try:
        _, info = env.reset(seed=0)
        assert info["lives"] == 5 and "game_over" not in info
        episodes = []  # (lives after the episode, game over, frame number at the next reset)
        for _ in range(20_000):
            _, _, terminated, truncated, info = env.step(int(rng.integers(4)))
            if terminated or truncated:
                game_over = info["game_over"]
                if game_over:  # every step of the game counted, the resets' no-ops too: 4 frames each, the
                    # last cut short where the game ended
                    assert (info["game_length"] - 1) * 4 < info["episode_frame_number"] <= info["game_length"] * 4
                lives = info["lives"]
                frame = info["episode_frame_number"]
                _, info = env.reset()
                episodes.append((lives, game_over, info["lives"], info["episode_frame_number"] > frame))
                if game_over:
                    break
        # four lives lost, each ending an episode inside one game that goes on; then the game ends
        assert [e[:2] for e in episodes] == [(4, False), (3, False), (2, False), (1, False), (0, True)]
        assert [e[2] for e in episodes] == [4, 3, 2, 1, 5]  # the last reset starts a new game
        assert [e[3] for e in episodes] == [True, True, True, True, False]  # the frame count goes on, then restarts
    finally:
        env.close()


def test_fire_reset_launches_breakouts_ball_at_every_new_life():
    """Doing nothing, Breakout's ball never comes: no life is lost. With fire_reset (after episodic_life)
    each life starts with FIRE, so doing nothing loses all five."""
    for wrappers, games_over in (([PREPROCESS, "episodic_life"], 0), (LIVES, 1)):
        env = breakout(wrappers)
        try:
            env.reset(seed=0)
            ends = over = 0
            for _ in range(3_000):
                *_, terminated, truncated, info = env.step(0)
                if terminated or truncated:
                    ends += 1
                    over += info["game_over"]
                    if over:
                        break
                    env.reset()
            assert (ends, over) == ((5, 1) if games_over else (0, 0)), wrappers
        finally:
            env.close()


def test_the_wrappers_refuse_envs_without_lives_or_fire():
    with pytest.raises(ValueError, match="episodic_life needs an Atari env.*CartPole-v1"):
        wrap_env(gym.make("CartPole-v1"), parse_wrappers(["episodic_life"]))
    with pytest.raises(ValueError, match=r"fire_reset needs a game whose action 1 is FIRE.*\['NOOP', 'UP', 'DOWN'\]"):
        wrap_env(gym.make("ALE/Freeway-v5"), parse_wrappers(["fire_reset"]))
    # missing_ok (what rlrun-rllib gives RLlib's files, which sweep over games): such a game is left as it is
    freeway = gym.make("ALE/Freeway-v5")
    assert wrap_env(freeway, parse_wrappers([{"name": "fire_reset", "missing_ok": True}])) is freeway
    freeway.close()
    assert "FireReset" in str(breakout([{"name": "fire_reset", "missing_ok": True}]))
    with pytest.raises(RegistryError, match=r"fire_reset \(env.wrappers\[1\]\) comes before episodic_life"):
        parse_wrappers([PREPROCESS, "fire_reset", "episodic_life"])
    with pytest.raises(RegistryError, match=r"time_limit \(env.wrappers\[2\]\) comes after episodic_life"):
        parse_wrappers([PREPROCESS, "episodic_life", {"name": "time_limit", "max_episode_steps": 100}])


def _policy(obs_space, act_space):
    return {DEFAULT_POLICY_ID: make_policy("dqn", obs_space, act_space, algo_config=DQNConfig(n_step=1),
                                           model_config=QCNNConfig(name="q_cnn"))}


ENV = EnvConfig(id="ALE/Breakout-v5", kwargs={"frameskip": 1, "repeat_action_probability": 0.0},
                wrappers=[*LIVES, {"name": "frame_stack", "stack_size": 2}])


@pytest.mark.parametrize(("batch_mode", "copies"), [("truncate_episodes", 1), ("complete_episodes", 2)])
def test_training_statistics_count_whole_games_while_the_learner_sees_one_episode_a_life(batch_mode, copies):
    env = EnvConfig(id=ENV.id, kwargs=ENV.kwargs, wrappers=[PREPROCESS, "game_truth", *ENV.wrappers[1:]])
    rollout = RolloutConfig(num_envs_per_worker=copies, rollout_fragment_length=100, batch_mode=batch_mode)
    GAMES.clear()
    ABANDONED.clear()
    worker = RolloutWorker(WorkerSpec(env=env, rollout=rollout, seed=0), _policy)
    try:
        terminated, eps_ids, t = [], [], []
        returns: list[float] = []
        lengths: list[int] = []
        while len(returns) < 3:
            batch = worker.sample()
            terminated += batch[SB.TERMINATEDS].tolist()
            eps_ids += batch[SB.EPS_ID].tolist()
            t += batch[SB.T].tolist()
            stats = worker.get_metrics()
            returns += stats.returns
            lengths += stats.lengths
            assert len(terminated) < 20_000
        # the statistics are the games as a monitor below the wrappers saw them, hidden steps included; no
        # game is cut short (complete_episodes starts its episodes afresh at each sample, a copy in the middle
        # of a life too: its game plays on)
        assert list(zip(returns, lengths, strict=True)) == GAMES[: len(returns)]
        assert ABANDONED == []
        # the learner's rows: an episode (its own eps_id, t from 0) for each life
        ends = np.flatnonzero(terminated)
        assert copies > 1 or (len(ends) >= 10 and len(np.unique(eps_ids[: ends[9] + 1])) == 10)
        starts = np.flatnonzero(np.r_[True, np.diff(eps_ids) != 0])
        assert all(t[k] == 0 for k in starts) and all(t[k] == t[k - 1] + 1 for k in range(1, len(t)) if k not in starts)
    finally:
        worker.stop()


def test_greedy_evaluation_plays_whole_games():
    env = EnvConfig(id=ENV.id, kwargs=ENV.kwargs, wrappers=[PREPROCESS, "game_truth", *ENV.wrappers[1:]])
    vec = env_from_config(env, 1)
    try:
        obs_space, act_space = vec.single_observation_space, vec.single_action_space
        policy = _policy(obs_space, act_space)[DEFAULT_POLICY_ID]
        GAMES.clear()
        result = evaluate(policy, env, num_episodes=2, num_envs=1, seed=0, env=vec, explore=True)
        assert list(zip(result.returns, result.lengths, strict=True)) == GAMES[:2]
        # the copy played its game to the end (no life left), not just its first life
        assert vec.envs[0].unwrapped.ale.lives() == 0
    finally:
        vec.close()


def test_games_reported_with_numpy_scalars_reach_the_statistics():
    """An env of the user's may report game_over as np.bool_ (gymnasium batches it into an object array)."""
    from rlrun.envs.copies import AGENT, OneAgentEnv

    class NumpyGame(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            info["game_over"] = np.bool_(terminated or truncated)
            if info["game_over"]:
                info["game_return"], info["game_length"] = np.float32(1.5), np.int32(3)
            return obs, reward, terminated, truncated, info

    copies = OneAgentEnv(gym.vector.SyncVectorEnv([lambda: NumpyGame(gym.make("CartPole-v1"))] * 2))
    try:
        copies.reset(seed=0)
        for _ in range(500):
            st = copies.step({AGENT: np.zeros(2, np.int64)})
            assert st.game is not None and st.game.end.dtype == bool
            if st.game.end.any():
                break
        assert st.game.end.tolist() == st.episode_end.tolist()
        assert st.game.returns[st.game.end].tolist() == [1.5] * int(st.game.end.sum())
        assert st.game.lengths[st.game.end].tolist() == [3] * int(st.game.end.sum())
    finally:
        copies.close()

    class NoScore(gym.Wrapper):  # says game_over but not the game's score and steps
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, reward, terminated, truncated, {**info, "game_over": terminated or truncated}

    copies = OneAgentEnv(gym.vector.SyncVectorEnv([lambda: NoScore(gym.make("CartPole-v1"))]))
    try:
        copies.reset(seed=0)
        with pytest.raises(PluginError, match="game_over without game_return and game_length"):
            for _ in range(500):
                copies.step({AGENT: np.zeros(1, np.int64)})
    finally:
        copies.close()
