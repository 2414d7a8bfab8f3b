"""Env wrappers from YAML (rlrun/envs/wrappers.py): parsing, the vector form kept where every wrapper has
one, per-sub-env wrapping otherwise, the same wrappers in training and evaluation, and one clear
line for every mistake, before compute."""

import gymnasium as gym
import numpy as np
import pytest

from rlrun.config.schemas import EnvConfig
from rlrun.core.registry import RegistryError
from rlrun.envs.make import env_from_config, make_vector_env, probe_env
from rlrun.envs.wrappers import parse_wrappers
from rlrun.sources.plugins import load_builtins
from rlrun.training.evaluation import evaluate

load_builtins()


def test_mask_observation_keeps_cartpoles_numpy_vector_env_and_drops_the_velocities():
    env = make_vector_env("CartPole-v1", 4, wrappers=[{"name": "mask_observation", "keep": [0, 2]}])
    plain = make_vector_env("CartPole-v1", 4)
    assert not isinstance(env.unwrapped, gym.vector.SyncVectorEnv)  # still gymnasium's numpy CartPole
    assert env.single_observation_space.shape == (2,) and env.observation_space.shape == (4, 2)
    masked, _ = env.reset(seed=3)
    full, _ = plain.reset(seed=3)
    np.testing.assert_array_equal(masked, full[:, [0, 2]])
    actions = np.array([0, 1, 1, 0])
    np.testing.assert_array_equal(env.step(actions)[0], plain.step(actions)[0][:, [0, 2]])


def test_a_wrapper_without_a_vector_form_wraps_each_sub_env():
    env = make_vector_env("CartPole-v1", 3, wrappers=[{"name": "frame_stack", "stack_size": 4},
                                                      "flatten_observation"])
    assert isinstance(env, gym.vector.SyncVectorEnv) and env.single_observation_space.shape == (16,)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 16)
    np.testing.assert_array_equal(obs[:, :12], np.tile(obs[:, 12:], 3))  # the stack starts as 4 reset frames
    env = make_vector_env("CartPole-v1", 2, wrappers=[{"name": "time_limit", "max_episode_steps": 5}])
    env.reset(seed=0)
    truncs = [env.step(np.zeros(2, dtype=np.int64))[3] for _ in range(5)]
    assert truncs[-1].all() and not any(t.any() for t in truncs[:-1])


def test_minigrid_gets_image_observations_from_its_wrapper():
    assert probe_env("MiniGrid-Empty-5x5-v0", wrappers=["minigrid_image"])[0].shape == (7, 7, 3)
    # gymnasium's module:EnvId form imports the module first
    assert probe_env("minigrid:MiniGrid-Empty-5x5-v0", wrappers=["minigrid_image"])[0].shape == (7, 7, 3)
    with pytest.raises(Exception, match="Dict observation space.*minigrid_image"):
        probe_env("MiniGrid-Empty-5x5-v0")


def test_resize_and_clip_reward():
    env = make_vector_env("MiniGrid-Empty-5x5-v0", 1, wrappers=["minigrid_image",
                                                                  {"name": "resize_observation", "shape": [14, 21]}])
    assert env.reset(seed=0)[0].shape == (1, 14, 21, 3)
    env = make_vector_env("CartPole-v1", 2, wrappers=[{"name": "clip_reward", "max_reward": 0.5}])
    env.reset(seed=0)
    np.testing.assert_array_equal(env.step(np.zeros(2, dtype=np.int64))[1], 0.5)


def test_evaluation_uses_the_same_wrappers_as_training():
    cfg = EnvConfig(id="CartPole-v1", wrappers=[{"name": "time_limit", "max_episode_steps": 7}])

    class Zero:
        def filter_obs(self, obs):
            return obs

        def compute_actions(self, obs, explore=False):
            return type("A", (), {"actions": np.zeros(len(obs), dtype=np.int64)})()

    assert env_from_config(cfg, 2).single_observation_space.shape == (4,)
    res = evaluate(Zero(), cfg, num_episodes=4, num_envs=2, seed=0)  # pushing left ends CartPole in ~8-10 steps
    assert max(res.lengths) <= 7 and len(res.returns) == 4


@pytest.mark.parametrize("wrappers, message", [
    (["framestack"], "env.wrappers[0].name: unknown env wrapper 'framestack' (did you mean 'frame_stack'?)"),
    ([{"name": "frame_stack", "size": 3}], "env.wrappers[0] (frame_stack): unknown argument 'size'; it takes "
                                           "stack_size"),
    (["clip_reward", {"name": "time_limit"}], "env.wrappers[1] (time_limit): missing argument max_episode_steps"),
    ([3], "env.wrappers[0]: expected a wrapper name or {name: <wrapper>"),
])
def test_bad_wrapper_entries_are_named(wrappers, message):
    with pytest.raises(RegistryError) as e:
        parse_wrappers(wrappers)
    assert message in str(e.value)


@pytest.mark.parametrize("args, message", [
    (["env.wrappers=[framestack]"], "env.wrappers[0].name: unknown env wrapper 'framestack' (did you mean"),
    (["env.wrappers=[{name: mask_observation, keep: [9]}]"], "keep=[9]: indices must be within the 4"),
    (["env.id=MiniGrid-Empty-5x5-v0"], "Dict observation space"),
    (["env.wrappers=[frame_stack]", "env.vectorize=vector_entry_point"],
     "env.wrappers[0]: wrapper 'frame_stack' has no vector form"),
    (["env.wrappers=[episodic_life]"],
     "episodic_life needs an Atari env (ale-py's, which has lives and a FIRE button); CartPole-v1 is not one"),
    (["env.id=ALE/Freeway-v5", "env.wrappers=[fire_reset]"],
     "fire_reset needs a game whose action 1 is FIRE; ALE/Freeway-v5 has ['NOOP', 'UP', 'DOWN']"),
])
def test_the_cli_refuses_bad_wrappers_with_one_line_before_compute(refuse, tmp_path, args, message):
    p = refuse(*args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.glob("outputs/*/*/checkpoints"))
