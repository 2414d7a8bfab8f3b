"""MLflow with a real SQLite store: one run per rlrun run, read back with MlflowClient."""

import time
from pathlib import Path

import pandas
import pytest
import torch
from mlflow.tracking import MlflowClient

from rlrun.app.cli import compose
from rlrun.app.runner import run
from rlrun.core.provenance import MAX_PARAM_VALUE, flatten, params_from_config


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("tracked")
    cfg = compose(["+experiment=ppo_cartpole", "stop.training_iteration=3", "progress=false",
                   f"output_dir={d / 'out'}"], launch_dir=str(d))
    result = run(cfg, launch_dir=d)
    return d, result, MlflowClient(tracking_uri=f"sqlite:///{d / 'mlflow.db'}")


def test_run_is_in_experiment_named_after_config(tracked_run):
    d, result, client = tracked_run
    exp = client.get_experiment_by_name("ppo_cartpole")
    assert exp is not None
    run = client.get_run(result.run_id)
    assert run.info.experiment_id == exp.experiment_id
    assert run.info.status == "FINISHED"
    assert Path(d / "mlflow.db").is_file()


def test_params_and_tags(tracked_run):
    _, result, client = tracked_run
    data = client.get_run(result.run_id).data
    assert data.params["algo.lr"] == "0.0041"
    assert data.params["rollout.num_envs_per_worker"] == "32"
    assert data.params["stop.rollout/episode_return_mean"] == "475.0"
    for tag in ("git_sha", "version.rlrun", "version.torch", "version.gymnasium"):
        assert data.tags[tag], tag
    assert data.tags["rlrun.algo"] == "ppo"


def test_metrics_once_per_iteration_stepped_by_env_steps(tracked_run):
    _, result, client = tracked_run
    for key in ("rollout/episode_return_mean", "rollout/episode_len_mean", "train/loss/policy", "train/loss/vf",
                "train/approx_kl", "train/entropy", "time/env_steps_per_s"):
        hist = client.get_metric_history(result.run_id, key)
        assert len(hist) == 3, key
        steps = [m.step for m in hist]
        assert steps == sorted(steps) and steps[-1] == result.metrics["timesteps_total"]
        assert steps == [int(h["timesteps_total"]) for h in result.history]
    # the same rows in the run directory, as the README reads them
    table = pandas.read_json(result.output_dir / "metrics.jsonl", lines=True)
    assert table["_step"].tolist() == steps and table["training_iteration"].tolist() == [1, 2, 3]
    mlflow_returns = [m.value for m in client.get_metric_history(result.run_id, "rollout/episode_return_mean")]
    assert table["rollout/episode_return_mean"].tolist() == mlflow_returns


def test_artifacts_config_and_loadable_checkpoint(tracked_run, tmp_path):
    _, result, client = tracked_run
    names = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"config.yaml", "checkpoints"} <= names
    ckpt = client.list_artifacts(result.run_id, "checkpoints")
    assert [a.path for a in ckpt] == ["checkpoints/iter_000003"]
    local = client.download_artifacts(result.run_id, "checkpoints/iter_000003", str(tmp_path))
    state = torch.load(Path(local) / "policy.pt", weights_only=True)
    assert "model" in state["policies"]["default_policy"]
    assert (Path(local) / "meta.json").is_file()


def test_tracking_none_writes_no_store(tmp_path):
    cfg = compose(["+experiment=ppo_cartpole", "tracking=none", "stop.training_iteration=1", "progress=false",
                   f"output_dir={tmp_path / 'out'}"], launch_dir=str(tmp_path))
    result = run(cfg, launch_dir=tmp_path)
    assert result.run_id is None and not (tmp_path / "mlflow.db").exists()


def test_params_respect_mlflow_limits():
    params = params_from_config({"a": {"b": "x" * 10000}, "c": [1, 2]})
    assert len(params["a.b"]) == MAX_PARAM_VALUE and params["c"] == "[1, 2]"
    assert flatten({"a": {"b": {"c": 1}}}) == {"a.b.c": 1}


def test_run_page_has_curve_description_and_target_tag(tracked_run):
    _, result, client = tracked_run
    data = client.get_run(result.run_id).data
    assert "learning_curve.png" in {a.path for a in client.list_artifacts(result.run_id)}
    assert data.tags["rlrun.target_met"] == "false"  # 3 iterations do not reach 475
    assert "ppo_cartpole" in data.tags["mlflow.note.content"] and "CartPole-v1" in data.tags["mlflow.note.content"]
    assert data.tags["rlrun.stop_reason"] == "training_iteration = 3 >= 3"


def test_periodic_checkpoints_are_uploaded_and_pruned_locally(tmp_path):
    cfg = compose(["+experiment=ppo_cartpole", "stop.training_iteration=5", "progress=false",
                   "checkpoint.every_n_iters=2", "checkpoint.keep_last=2", f"output_dir={tmp_path / 'out'}"],
                  launch_dir=str(tmp_path))
    result = run(cfg, launch_dir=tmp_path)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    uploaded = [a.path for a in client.list_artifacts(result.run_id, "checkpoints")]
    assert uploaded == ["checkpoints/iter_000002", "checkpoints/iter_000004", "checkpoints/iter_000005"]
    local = sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert local[-2:] == ["iter_000004", "iter_000005"] and len(local) <= 3
    assert not [p for p in (tmp_path / "out" / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp dirs


@pytest.mark.slow
def test_local_checkpoints_stay_bounded_while_uploads_lag(tmp_path):
    import threading

    cfg = compose(["+experiment=ppo_cartpole", "stop.training_iteration=40", "progress=false",
                   "checkpoint.every_n_iters=1", "checkpoint.keep_last=2", f"output_dir={tmp_path / 'out'}"],
                  launch_dir=str(tmp_path))
    root, most, done = tmp_path / "out" / "checkpoints", [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            if root.is_dir():
                most[0] = max(most[0], sum(p.name.startswith("iter_") for p in root.iterdir()))
            time.sleep(0.005)

    t = threading.Thread(target=watch)
    t.start()
    try:
        result = run(cfg, launch_dir=tmp_path)
    finally:
        done.set()
        t.join()
    # 2 x keep_last, plus the new one for the moment between its rename and the pruning
    assert most[0] <= 2 * 2 + 1, most[0]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(client.list_artifacts(result.run_id, "checkpoints")) == 40  # MLflow has every one


@pytest.mark.parametrize("width", [80, 100, 160])
def test_the_live_progress_line_fits_the_terminal_whole(width):
    import io

    from rich.console import Console

    from rlrun.tracking.progress import ProgressLine

    console = Console(file=io.StringIO(), width=width, force_terminal=True, record=True)
    line = ProgressLine(stop={"timesteps_total": 100000, "rollout/episode_return_mean": 475}, console=console)
    line.update({"training_iteration": 87, "timesteps_total": 90842, "rollout/episode_return_mean": 475.5,
                 "time/env_steps_per_s": 12345.0, "time_total_s": 7.3})
    console.export_text(clear=True)  # what the bar showed before the update
    line._bar.refresh()
    shown = console.export_text().strip("\n")
    line._bar.stop()
    assert "…" not in shown and len(shown) <= width, shown  # rich cut nothing
    assert "90,842" in shown and "475.50/475" in shown.replace(" / ", "/") and "12,345" in shown, shown


def test_the_summary_labels_what_it_counts(tmp_path):
    from rlrun.tracking.progress import Summary

    def lines(row):
        return Summary("done", False, [row], 1.0, tmp_path, None, None, None, "e", None, window=10).lines()

    game = lines({"rollout/episode_return_mean": 0.0, "rollout/p0/episode_return_mean": 3.0,
                  "rollout/p1/episode_return_mean": -3.0, "timesteps_total": 64.0})
    assert "(every agent's rewards summed, mean of the last 10 episodes)" in game[1]  # 0 in a zero-sum game
    assert game[2:5] == ["  policies   (their agents' episode returns)", "    p0: final 3.0, best 3.0",
                         "    p1: final -3.0, best -3.0"]
    offline = lines({"offline/rows_read": 5000.0, "timesteps_total": 5000.0, "rollout/episode_return_mean": 1.0})
    assert offline[2] == "  rows read  5,000 in 1.0 s" and "(mean of the last 10 episodes)" in offline[1]
    single = lines({"rollout/episode_return_mean": 1.0, "timesteps_total": 64.0})
    assert single[2] == "  env steps  64 in 1.0 s"
