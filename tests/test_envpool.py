"""``env.vectorize: envpool``: EnvPool's C++ envs behind the same sampler (rlrun/envs/envpool.py)."""

import re

import numpy as np
import pytest

from rlrun.core.registry import RegistryError
from rlrun.envs.make import make_vector_env

from .conftest import run_cli, run_summary


def test_the_pool_seeds_on_reset_and_autoresets_on_the_next_step():
    env = make_vector_env("CartPole-v1", 4, vectorize="envpool")
    try:
        assert env.num_envs == 4 and env.single_observation_space.shape == (4,) and env.single_action_space.n == 2
        first, _ = env.reset(seed=3)
        again, _ = env.reset(seed=3)
        other, _ = env.reset(seed=4)
        np.testing.assert_array_equal(first, again)
        assert not np.array_equal(first, other)
        env.reset(seed=0)
        ones = np.ones(4, dtype=np.int64)  # always push right: every episode ends within ~10 steps
        ended = None
        for _ in range(40):
            obs, rew, term, _, info = env.step(ones)
            assert rew.dtype == np.float64 and info == {}
            if ended is not None:  # the step after an episode's end: gymnasium's next-step autoreset
                assert rew[ended] == 0.0 and not term[ended] and np.abs(obs[ended]).max() <= 0.05
                break
            if term.any():
                ended = int(np.flatnonzero(term)[0])
                assert abs(obs[ended][2]) > 0.2 or abs(obs[ended][0]) > 2.4  # the pole fell
        assert ended is not None
    finally:
        env.close()


def test_ids_envpool_lacks_and_bad_kwargs_are_one_line():
    with pytest.raises(RegistryError, match=r"envpool has no env 'Taxi-v4' \(did you mean 'Taxi-v3'\?\)"):
        make_vector_env("Taxi-v4", 2, vectorize="envpool")
    with pytest.raises(RegistryError, match=r"env.kwargs: envpool's CartPole-v1 rejected \{'bogus': 1\}"):
        make_vector_env("CartPole-v1", 2, {"bogus": 1}, vectorize="envpool")


def _play(env, steps: int, seed: int = 0) -> dict[str, list]:
    """Random play on a vector env: per sub-env the learning episodes, and the games it reports, each
    beside the truth counted here from the steps (an autoreset step, after an episode's end, is not one)."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    n = env.num_envs
    score, length, lives_ended = np.zeros(n), np.zeros(n, int), np.zeros(n, int)
    reset_step = np.zeros(n, bool)
    out: dict[str, list] = {"games": [], "truth": [], "lives": []}
    for _ in range(steps):
        _, rew, term, trunc, info = env.step(rng.integers(0, env.single_action_space.n, n))
        score += np.where(reset_step, 0.0, rew)
        length += ~reset_step
        ended = (term | trunc) & ~reset_step
        lives_ended += ended
        for i in np.flatnonzero(ended & info["game_over"]):
            out["games"].append((float(info["game_return"][i]), int(info["game_length"][i])))
            out["truth"].append((float(score[i]), int(length[i])))
            out["lives"].append(int(lives_ended[i]))
            score[i], length[i], lives_ended[i] = 0.0, 0, 0
        assert not (info["game_over"] & ~ended).any()  # a game ends only where an episode does
        reset_step = ended
    return out


def test_envpools_atari_episodic_life_reports_whole_games():
    """EnvPool's own episodic_life ends an episode per lost life; the games' score and steps come back
    as rlrun's game keys (the episode statistics' games, as with the episodic_life wrapper)."""
    env = make_vector_env("SpaceInvaders-v5", 2, {"episodic_life": True}, vectorize="envpool")
    try:
        played = _play(env, 4000)
    finally:
        env.close()
    assert len(played["games"]) >= 4 and played["games"] == played["truth"], played
    assert set(played["lives"]) == {3}  # SpaceInvaders' three lives: three episodes a game
    clipped = make_vector_env("SpaceInvaders-v5", 2, {"episodic_life": True, "reward_clip": True}, vectorize="envpool")
    try:
        played = _play(clipped, 4000)
    finally:
        clipped.close()
    # the game's own score (5-30 an invader), not the clipped rewards the learner sees (one each)
    assert played["games"] and all(g[0] > t[0] > 0 for g, t in zip(played["games"], played["truth"], strict=True))
    plain = make_vector_env("SpaceInvaders-v5", 2, vectorize="envpool")
    try:
        _, _, _, _, info = plain.step(np.zeros(2, dtype=np.int64))
        assert info == {}  # without episodic_life an episode is a game: nothing to add
    finally:
        plain.close()


def test_the_copies_report_envpools_games_to_the_sampler_and_evaluation():
    """The games pass through OneAgentEnv as VectorStep.game (what the rollout worker and greedy evaluation
    read): as many as the pool's info says ended, each with its score and steps."""
    from rlrun.envs.copies import AGENT, OneAgentEnv

    copies = OneAgentEnv(make_vector_env("Breakout-v5", 2, {"episodic_life": True}, vectorize="envpool"))
    rng = np.random.default_rng(1)
    try:
        copies.reset(seed=0)
        games, lives = [], 0
        for _ in range(1500):
            st = copies.step({AGENT: rng.integers(0, 4, 2)})
            lives += int(st.episode_end.sum())
            assert st.game is not None and not (st.game.end & ~st.episode_end).any()
            games += [(float(r), int(n)) for r, n in zip(st.game.returns[st.game.end], st.game.lengths[st.game.end],
                                                         strict=True)]
    finally:
        copies.close()
    assert len(games) >= 4 and lives >= 5 * len(games)  # Breakout's five lives: five episodes a game
    assert all(n >= 40 and r >= 0 for r, n in games)


@pytest.mark.slow
def test_a_run_on_envpools_breakout_with_episodic_life_records_games(tmp_path):
    p = run_cli(["+experiment=ppo_breakout", "env=breakout_envpool", "stop.timesteps_total=2048",
                 "algo.train_batch_size=512", "seed=0"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["env.kwargs.episodic_life"] == "True" and run.data.params["env.vectorize"] == "envpool"
    # random play loses Breakout's 5 lives in ~35 steps each: a game is ~170
    assert run.data.metrics["rollout/episode_len_mean"] >= 100, run.data.metrics
    # rlrun-eval plays the checkpoint on the same pool, whole games, and EnvPool renders its frames
    import os
    import subprocess
    import sys

    from .conftest import REPO

    e = subprocess.run([sys.executable, "-m", "rlrun.app.eval_cli", "checkpoint=latest", "episodes=2", "render=true",
                        "render_episodes=1", "max_frames=60", "explore=true", "log=false"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert e.returncode == 0, e.stderr[-3000:]
    assert re.search(r"sampled-action return over 2 episodes", e.stdout), e.stdout
    assert "recorded 1 episode(s), 60 frames" in e.stdout, e.stdout
    assert list((tmp_path / "rlrun-eval").glob("*/*.gif")), e.stdout


@pytest.mark.parametrize(("args", "expect"), [
    (["env.id=Taxi-v4"], "env.vectorize: envpool has no env 'Taxi-v4'"),
    (["+env.kwargs.bogus=1"], "env.kwargs: envpool's CartPole-v1 rejected {'bogus': 1}"),
    (["env.id=ALE/Breakout-v5"], "envpool has no env 'ALE/Breakout-v5' (did you mean 'Breakout-v5'?)"),
    (["env.id=Breakout-v5", "env.wrappers=[episodic_life]"], "env.kwargs.episodic_life=true"),
])
def test_the_cli_refuses_them_before_training(refuse, args, expect):
    p = refuse("+experiment=ppo_cartpole", "env.vectorize=envpool", "tracking=none", *args)
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("rlrun: error:")]
    assert len(errors) == 1 and expect in errors[0] and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "iter " not in p.stdout


@pytest.mark.slow
def test_ppo_cartpole_on_envpool_reaches_475(tmp_path):
    p = run_cli(["+experiment=ppo_cartpole", "env.vectorize=envpool", "seed=0", "tracking=none"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = run_summary(p.stdout)
    assert summary["stopped"].startswith("rollout/episode_return_mean"), summary
    assert float(summary["final"]) >= 475 and int(summary["steps"].replace(",", "")) <= 150_000, summary
