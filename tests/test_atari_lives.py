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


def _policy(obs_space, act_space):
    return {DEFAULT_POLICY_ID: make_policy("dqn", obs_space, act_space, algo_config=DQNConfig(n_step=1),
                                           model_config=QCNNConfig(name="q_cnn"))}


ENV = EnvConfig(id="ALE/Breakout-v5", kwargs={"frameskip": 1, "repeat_action_probability": 0.0},
                wrappers=[*LIVES, {"name": "frame_stack", "stack_size": 2}])


def test_training_statistics_count_whole_games_while_the_learner_sees_one_episode_a_life():
    worker = RolloutWorker(WorkerSpec(env=ENV, rollout=RolloutConfig(num_envs_per_worker=1,
                                                                    rollout_fragment_length=250), seed=0), _policy)
    try:
        terminated, rewards, eps_ids = [], [], []
        returns: list[float] = []
        lengths: list[int] = []
        while len(returns) < 2:
            batch = worker.sample()
            terminated += batch[SB.TERMINATEDS].tolist()
            rewards += batch[SB.REWARDS].tolist()
            eps_ids += batch[SB.EPS_ID].tolist()
            stats = worker.get_metrics()
            returns += stats.returns
            lengths += stats.lengths
            assert len(terminated) < 20_000
        # one copy: its rows in order; every lost life ends a learning episode (an eps_id of its own), and
        # each fifth one is a game's end: the statistics' episode is the five lives together
        ends = np.flatnonzero(terminated)
        assert len(ends) >= 10 and len(np.unique(eps_ids[: ends[9] + 1])) == 10
        game_ends = ends[4::5][:2]
        assert lengths[:2] == [game_ends[0] + 1, game_ends[1] - game_ends[0]]
        assert returns[:2] == pytest.approx([sum(rewards[: game_ends[0] + 1]),
                                             sum(rewards[game_ends[0] + 1: game_ends[1] + 1])])
    finally:
        worker.stop()


def test_greedy_evaluation_plays_whole_games():
    vec = env_from_config(ENV, 1)
    try:
        obs_space, act_space = vec.single_observation_space, vec.single_action_space
        policy = _policy(obs_space, act_space)[DEFAULT_POLICY_ID]
        result = evaluate(policy, ENV, num_episodes=1, num_envs=1, seed=0, env=vec, explore=True)
        assert len(result.returns) == 1
        # the copy played its game to the end (no life left), not just its first life
        assert vec.envs[0].unwrapped.ale.lives() == 0
    finally:
        vec.close()
