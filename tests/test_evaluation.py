import pytest

from rlrun.algos.algorithm import make_policy
from rlrun.app.cli import compose
from rlrun.app.runner import run
from rlrun.config.schemas import EnvConfig, ModelConfig
from rlrun.core.registry import ENVS, MODELS
from rlrun.sources.plugins import load_builtins
from rlrun.training.evaluation import evaluate
from tests.scripted_env import ScriptedVectorEnv, ValueIsTenT

load_builtins()
ENVS.add("scripted", lambda num_envs, **kw: ScriptedVectorEnv(num_envs, **kw), override=True)
MODELS.add("value_is_ten_t", ValueIsTenT, override=True)


def test_whole_episodes_shared_out_across_sub_envs():
    env = ScriptedVectorEnv(2, [3, 5], [False, True])
    policy = make_policy("ppo", env.single_observation_space, env.single_action_space,
                         model_config=ModelConfig(name="value_is_ten_t"))
    res = evaluate(policy, EnvConfig(id="scripted"), num_episodes=5, num_envs=2, seed=0, env=env)
    # quotas 3 + 2; rewards 1 + t, so a 3-step episode returns 6 and a 5-step one 15; autoreset steps skipped
    assert sorted(zip(res.returns, res.lengths, strict=True)) == [(6, 3), (6, 3), (6, 3), (15, 5), (15, 5)]
    assert res.metrics()["eval/num_episodes"] == 5


def test_eval_metrics_reported_at_the_interval(tmp_path):
    cfg = compose(["+experiment=dqn_cartpole", "evaluation.interval=2", "evaluation.num_episodes=3",
                   "stop.training_iteration=4", "tracking=none", "progress=false", f"output_dir={tmp_path}"])
    r = run(cfg, launch_dir=tmp_path)
    evals = [h.get("eval/num_episodes") for h in r.history]
    assert evals == [None, 3.0, None, 3.0]  # the last iteration was an evaluation's: not evaluated twice
    assert r.metrics["eval/episode_len_mean"] >= 8  # greedy CartPole episodes last at least 8 steps


@pytest.mark.parametrize("final", [True, False])
def test_a_run_stopping_between_evaluations_evaluates_its_last_iteration(tmp_path, final):
    cfg = compose(["+experiment=dqn_cartpole", "evaluation.interval=2", "evaluation.num_episodes=3",
                   f"evaluation.final={str(final).lower()}", "stop.training_iteration=3", "tracking=none",
                   "progress=false", f"output_dir={tmp_path}"])
    r = run(cfg, launch_dir=tmp_path)
    evals = [h.get("eval/num_episodes") for h in r.history]
    assert evals == [None, 3.0, 3.0 if final else None]
    assert ("eval/episode_return_mean" in r.metrics) is final


def test_explore_evaluates_sampled_actions_and_greedy_evaluation_repeats_itself():
    """evaluate(explore=False) is deterministic for a seed; explore=True samples (rlrun-eval explore=true)."""
    import gymnasium as gym
    import numpy as np

    policy = make_policy("pg", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(2), seed=0)
    env_cfg = EnvConfig(id="CartPole-v1")
    greedy = [evaluate(policy, env_cfg, num_episodes=20, num_envs=4, seed=1).returns for _ in range(2)]
    sampled = evaluate(policy, env_cfg, num_episodes=20, num_envs=4, seed=1, explore=True).returns
    assert greedy[0] == greedy[1]
    assert sorted(sampled) != sorted(greedy[0]), (sampled, greedy[0])
