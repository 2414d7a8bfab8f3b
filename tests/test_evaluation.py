from rlrun.algorithm import make_policy
from rlrun.cli import compose
from rlrun.config import EnvConfig, ModelConfig
from rlrun.evaluation import evaluate
from rlrun.plugins import load_builtins
from rlrun.registry import ENVS, MODELS
from rlrun.runner import run
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
    assert evals == [None, 3.0, None, 3.0]
    assert r.metrics["eval/episode_len_mean"] >= 8  # greedy CartPole episodes last at least 8 steps
