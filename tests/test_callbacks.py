"""Callbacks and custom metrics (rlrun/sources/callbacks.py): hooks called with keyword arguments, the
episode object on a scripted env, env infos, custom/<name>_mean|min|max in MLflow with local and Ray
workers, nothing reported when no episode ended, and a raising callback stopping the run with one line."""

import textwrap

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from rlrun import CALLBACKS, Callbacks
from rlrun.core.registry import ENVS
from rlrun.sources.callbacks import custom_metric_summary, env_info
from rlrun.sources.plugins import load_builtins
from rlrun.sources.rollout_worker import RolloutWorker, WorkerSpec, make_policy_factory
from rlrun.training.validate import build_config
from tests.conftest import isolated, rlrun_cmd, run_summary
from tests.scripted_env import ScriptedVectorEnv

POLE_ANGLE = textwrap.dedent("""
    # a user's plugin module, outside the repository: the largest pole angle of each episode
    from rlrun import CALLBACKS, Callbacks

    @CALLBACKS.register("pole_angle")
    class PoleAngle(Callbacks):
        def on_episode_start(self, *, episode, **kwargs):
            episode.user_data["angles"] = [abs(float(episode.last_observation[2]))]

        def on_episode_step(self, *, episode, **kwargs):
            episode.user_data["angles"].append(abs(float(episode.last_observation[2])))

        def on_episode_end(self, *, episode, **kwargs):
            episode.custom_metrics["pole_angle_max"] = max(episode.user_data["angles"])

        def on_train_result(self, *, result, **kwargs):
            result["custom/iterations_seen"] = result["training_iteration"]
""")


class InfoEnv(ScriptedVectorEnv):
    """The scripted env with infos: ``t`` for every sub-env, ``odd`` only where t is odd."""

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, {"t": self.t.copy(), "_t": np.ones(self.num_envs, bool)}

    def step(self, actions):
        obs, rew, term, trunc, _ = super().step(actions)
        odd = self.t % 2 == 1
        return obs, rew, term, trunc, {"t": self.t.copy(), "_t": np.ones(self.num_envs, bool),
                                       "odd": np.where(odd, 1, 0), "_odd": odd}


load_builtins()
ENVS.add("scripted_info", lambda num_envs, **kw: InfoEnv(num_envs, **kw), override=True)
LOG: list[tuple] = []


@CALLBACKS.register("recorder", override=True)
class Recorder(Callbacks):
    def on_episode_start(self, *, worker, episode, env_index, **kwargs):
        LOG.append(("start", episode.episode_id, env_index, dict(episode.last_info)))

    def on_episode_step(self, *, episode, env_index, **kwargs):
        LOG.append(("step", episode.episode_id, env_index, episode.length, episode.last_reward,
                    dict(episode.last_info)))

    def on_episode_end(self, *, episode, env_index, **kwargs):
        LOG.append(("end", episode.episode_id, env_index, episode.length, episode.total_reward))
        episode.custom_metrics["len"] = episode.length

    def on_postprocess_trajectory(self, *, policy_id, postprocessed_batch, **kwargs):
        postprocessed_batch["advantages"][:] = 0.0  # customising sample collection
        LOG.append(("postprocess", policy_id, len(postprocessed_batch)))

    def on_sample_end(self, *, samples, **kwargs):
        LOG.append(("sample_end", len(samples), float(np.abs(samples["advantages"]).sum())))


def test_episode_hooks_see_what_the_worker_counts_and_the_envs_infos():
    LOG.clear()
    cfg = build_config({"env": {"id": "scripted_info", "kwargs": {"lengths": [3, 4], "truncate": [False, True]}},
                        "rollout": {"num_envs_per_worker": 2, "rollout_fragment_length": 5},
                        "algo": {"name": "ppo", "train_batch_size": 10, "sgd_minibatch_size": 10},
                        "callbacks": ["recorder"]})
    w = RolloutWorker(WorkerSpec(cfg.env, cfg.rollout, 0, callbacks=("recorder",)), make_policy_factory(cfg))
    batch = w.sample()
    stats = w.get_metrics()
    ends = [e for e in LOG if e[0] == "end"]
    # 5 vector steps: sub-env 0 ends a 3-step episode (rewards 1+2+3), takes the dummy reset step and
    # one step of the next; sub-env 1 ends a 4-step episode (1+2+3+4) - as the worker counts them
    assert [(e[2], e[3], e[4]) for e in ends] == [(0, 3, 6.0), (1, 4, 10.0)]
    assert stats.returns == [6.0, 10.0] and stats.custom == {"len": [3, 4]}
    # each episode id is the batch's eps_id for its rows
    ids = {e[1] for e in LOG if e[0] == "step"}
    assert ids == set(np.unique(batch["eps_id"]).tolist())
    steps0 = [e for e in LOG if e[0] == "step" and e[2] == 0]
    assert [e[3] for e in steps0[:3]] == [1, 2, 3] and [e[5]["t"] for e in steps0[:3]] == [1, 2, 3]
    assert "odd" in steps0[0][5] and "odd" not in steps0[1][5]  # infos masked per sub-env
    starts = [e for e in LOG if e[0] == "start"]
    assert starts[0][3] == {"t": 0} and len(starts) == 2 + len(ends)  # the first two, then one after each end
    assert ("postprocess", "default_policy", len(batch)) in LOG and LOG[-1] == ("sample_end", len(batch), 0.0)
    w.stop()


def test_custom_metrics_summary_reports_nothing_without_episodes():
    assert custom_metric_summary({}) == {} and custom_metric_summary({"x": []}) == {}
    assert custom_metric_summary({"x": [1.0, 3.0, float("nan")]}) == {"custom/x_mean": 2.0, "custom/x_min": 1.0,
                                                                       "custom/x_max": 3.0}
    assert env_info({"a": np.array([1, 2]), "_a": np.array([False, True]), "b": {"c": np.array([5, 6])}}, 0) == \
        {"b": {"c": 5}}


def _plugin(tmp_path, text=POLE_ANGLE, name="my_callbacks"):
    d = tmp_path / "user_code"
    d.mkdir(exist_ok=True)
    (d / f"{name}.py").write_text(text)
    return d


@pytest.mark.slow
def test_a_plugin_callbacks_custom_metric_reaches_mlflow_and_is_a_stop_key(cli, tmp_path):
    _plugin(tmp_path)
    p = cli("+experiment=ppo_cartpole", "plugins=[user_code.my_callbacks]", "callbacks=[pole_angle]",
            "stop.training_iteration=8", "++stop={custom/pole_angle_max_mean: 1.0}")
    assert p.returncode == 0, p.stderr[-3000:]
    s = run_summary(p.stdout)
    assert s["stopped"] == "training_iteration = 8 >= 8", s
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    metrics = client.get_run(s["run_id"]).data.metrics
    for k in ("custom/pole_angle_max_mean", "custom/pole_angle_max_min", "custom/pole_angle_max_max"):
        assert 0.0 < metrics[k] <= 0.2095 + 0.05, (k, metrics.get(k))  # CartPole ends past 12 degrees
    assert metrics["custom/iterations_seen"] == 8.0  # on_train_result added a key
    history = client.get_metric_history(s["run_id"], "custom/pole_angle_max_mean")
    assert 1 <= len(history) <= 8


@pytest.mark.slow
def test_no_custom_metric_when_no_episode_ended(cli, tmp_path):
    _plugin(tmp_path)
    p = cli("plugins=[user_code.my_callbacks]", "callbacks=[pole_angle]", "algo.train_batch_size=16",
            "algo.sgd_minibatch_size=16", "rollout.num_envs_per_worker=2", "rollout.rollout_fragment_length=8",
            "stop.training_iteration=1")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(
        run_summary(p.stdout)["run_id"]).data.metrics
    assert not [k for k in metrics if k.startswith("custom/pole")] and metrics["rollout/episodes_this_iter"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["on_episode_end", "on_train_result"])
def test_a_raising_callback_stops_the_run_with_one_line_naming_it_and_the_hook(cli, tmp_path, hook):
    _plugin(tmp_path, f"from rlrun import CALLBACKS, Callbacks\n@CALLBACKS.register('broken')\n"
                      f"class Broken(Callbacks):\n    def {hook}(self, **kwargs):\n        raise KeyError('angle')\n")
    p = cli("plugins=[user_code.my_callbacks]", "callbacks=[broken]", "stop.training_iteration=5")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert lines[0] == f"rlrun: error: callbacks: 'broken' raised in {hook}: KeyError: 'angle'", lines


@pytest.mark.parametrize("args, message", [
    (["callbacks=[pole]"], "callbacks[0]: unknown callbacks 'pole'"),
    (["++stop={custom/pole_angle_max_mean: 1}"], "stop.custom/pole_angle_max_mean: 'custom/pole_angle_max_mean' is "
                                                 "not a metric"),
])
def test_unknown_callbacks_and_custom_stop_keys_without_callbacks_are_refused(refuse, args, message):
    p = refuse(*args, "tracking=none")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr[-2000:]


@pytest.mark.ray
def test_custom_metrics_from_ray_workers_reach_mlflow(tmp_path):
    import subprocess

    _plugin(tmp_path)
    p = subprocess.run(isolated(rlrun_cmd("+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=2",
                                          "plugins=[user_code.my_callbacks]", "callbacks=[pole_angle]",
                                          "stop.training_iteration=6")),
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    s = run_summary(p.stdout)
    metrics = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(s["run_id"]).data.metrics
    assert 0.0 < metrics["custom/pole_angle_max_mean"] < 0.3, metrics
