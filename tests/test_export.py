"""The final policy as an MLflow model, and ``rlrun-eval`` (greedy evaluation, GIF video in MLflow)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
import mlflow.pyfunc
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from rlrun.app.cli import compose
from rlrun.app.eval_cli import parse_args
from rlrun.app.runner import run
from rlrun.training.export import load_policy

from .conftest import REPO


def _train(d, *overrides):
    cfg = compose([*overrides, "progress=false", f"output_dir={d / 'out'}"], launch_dir=str(d))
    return run(cfg, launch_dir=d)


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    return d, _train(d, "+experiment=ppo_cartpole", "stop.training_iteration=3")


def _load_model(d, run_id):
    mlflow.set_tracking_uri(f"sqlite:///{d / 'mlflow.db'}")  # what MLFLOW_TRACKING_URI does for a user
    # dst_path: without it MLflow downloads the model into a temp dir it never removes
    dst = Path(tempfile.mkdtemp(prefix="model-", dir=d))
    return mlflow.pyfunc.load_model(f"runs:/{run_id}/model", dst_path=str(dst))


def _eval_cli(cwd, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "rlrun.app.eval_cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.slow
def test_pyfunc_model_returns_the_policys_greedy_actions(cartpole_run):
    d, result = cartpole_run
    model = _load_model(d, result.run_id)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    actions = np.asarray(model.predict(obs))
    assert actions.shape == (64,) and actions.dtype == np.int64
    assert set(np.unique(actions)) <= {0, 1}
    policy = load_policy(result.checkpoint_dir, d).policy
    np.testing.assert_array_equal(actions, policy.compute_actions(obs, explore=False).actions)
    sig = model.metadata.signature
    assert sig is not None and tuple(sig.inputs.to_dict()[0]["tensor-spec"]["shape"]) == (-1, 4)


@pytest.mark.slow
def test_continuous_actions_are_clipped_to_the_box(tmp_path):
    r = _train(tmp_path, "+experiment=ppo_pendulum", "stop.training_iteration=1")
    model = _load_model(tmp_path, r.run_id)
    obs = np.random.default_rng(0).normal(scale=50, size=(32, 3)).astype(np.float32)  # far out: big means
    actions = np.asarray(model.predict(obs))
    assert actions.shape == (32, 1) and actions.dtype == np.float32
    assert actions.min() >= -2.0 and actions.max() <= 2.0


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["sac_pendulum", "td3_pendulum"])
def test_sac_and_td3_models_act_as_their_policies_do_scaled_to_the_bounds(preset, tmp_path):
    # a directory name of its own: MLflow caches one SQLite engine per URI in this process, and pytest
    # reuses a passed test's tmp_path name for the next parameter
    tmp_path = tmp_path / preset
    tmp_path.mkdir()
    # learning from the second iteration: the actor is no longer its initialisation
    r = _train(tmp_path, f"+experiment={preset}", "algo.learning_starts=64", "stop.training_iteration=3",
               "model.hiddens=[32,32]", "model.critic_hiddens=[32,32]", "evaluation.interval=0")
    model = _load_model(tmp_path, r.run_id)
    obs = np.random.default_rng(0).normal(scale=3, size=(64, 3)).astype(np.float32)
    actions = np.asarray(model.predict(obs))
    policy = load_policy(r.checkpoint_dir, tmp_path).policy
    np.testing.assert_allclose(actions, policy.compute_actions(obs, explore=False).actions, rtol=1e-5, atol=1e-5)
    assert actions.shape == (64, 1) and -2.0 <= actions.min() < actions.max() <= 2.0
    assert actions.max() - actions.min() > 0.01  # not all at one bound


@pytest.mark.slow
def test_a_discrete_sac_model_acts_as_its_policy_does_greedily(tmp_path):
    r = _train(tmp_path, "+experiment=sac_cartpole", "algo.learning_starts=64", "stop.training_iteration=3",
               "model.hiddens=[32,32]", "model.critic_hiddens=[32,32]", "evaluation.interval=0")
    model = _load_model(tmp_path, r.run_id)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    actions = np.asarray(model.predict(obs))
    assert actions.shape == (64,) and actions.dtype == np.int64
    policy = load_policy(r.checkpoint_dir, tmp_path).policy
    np.testing.assert_array_equal(actions, policy.compute_actions(obs, explore=False).actions)
    assert set(np.unique(actions)) == {0, 1}  # the categorical actor's argmax, not one fixed action


def test_log_model_false_logs_no_model(tmp_path):
    r = _train(tmp_path, "+experiment=ppo_cartpole", "stop.training_iteration=1", "tracking.log_model=false")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert not client.search_logged_models(experiment_ids=[client.get_run(r.run_id).info.experiment_id])


@pytest.mark.slow
def test_rlrun_eval_logs_result_and_video_to_the_run(cartpole_run):
    d, result = cartpole_run
    p = _eval_cli(d, f"checkpoint={result.run_id}", "episodes=4", "render=true", "max_frames=40")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "greedy return over 4 episodes: mean" in p.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{d / 'mlflow.db'}")
    ckpt = result.checkpoint_dir.name
    names = {a.path for a in client.list_artifacts(result.run_id, f"evaluation/{ckpt}")}
    assert names == {f"evaluation/{ckpt}/episode.gif", f"evaluation/{ckpt}/result.json"}
    local = client.download_artifacts(result.run_id, f"evaluation/{ckpt}", str(d / "dl"))
    info = json.loads((Path(local) / "result.json").read_text())
    assert info["eval/num_episodes"] == 4 and len(info["returns"]) == 4
    gif = Image.open(f"{local}/episode.gif")
    assert gif.size == (600, 400) and gif.n_frames > 1


def test_rlrun_eval_without_mlflow_writes_to_the_launch_dir(tmp_path):
    r = _train(tmp_path, "+experiment=ppo_cartpole", "stop.training_iteration=1", "tracking=none")
    p = _eval_cli(tmp_path, f"checkpoint={r.checkpoint_dir}", "episodes=2")
    assert p.returncode == 0, p.stderr[-3000:]
    out = tmp_path / "rlrun-eval" / r.checkpoint_dir.name / "result.json"
    assert json.loads(out.read_text())["eval/num_episodes"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["checkpoint=latest", "episodse=3"], "episodse: unknown key (did you mean 'episodes'?)"),
        (["episodes=3"], "checkpoint: missing"),
        (["checkpoint=latest", "episodes=0"], "episodes: must be >= 1, got 0"),
        (["checkpoint=latest", "render=maybe"], "render: expected"),
        (["checkpoint"], "expected key=value, got 'checkpoint'"),
    ],
)
def test_eval_arguments_are_checked(args, message):
    with pytest.raises(Exception, match=None) as e:
        parse_args(args)
    assert message in str(e.value)


def test_rlrun_eval_bad_checkpoint_exits_2_naming_it(tmp_path):
    p = _eval_cli(tmp_path, "checkpoint=nowhere/iter_000001")
    assert p.returncode == 2
    assert "checkpoint=nowhere/iter_000001: not a checkpoint directory" in p.stderr
    assert "Traceback" not in p.stderr
