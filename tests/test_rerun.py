"""``rlrun rerun=<run id>``: a recorded run runs again from its MLflow record, says first what differs
from the record (code, packages, plugin sources, Python, machine), and checks that the curve repeats;
the record holds what that needs (command, overrides, git state and patch, packages, plugin sources)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, isolated, rlrun_cmd, run_cli, run_summary

pytestmark = pytest.mark.slow


def _store(d):
    return MlflowClient(tracking_uri=f"sqlite:///{d / 'mlflow.db'}")


def _returns(client, run_id):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, "rollout/episode_return_mean")]


@pytest.mark.parametrize("args", [
    ["+experiment=ppo_cartpole", "stop.training_iteration=15"],
    ["+experiment=dqn_cartpole", "stop.training_iteration=30"],
    ["+experiment=ppo_multi_cartpole", "stop.training_iteration=6"],
], ids=["ppo_cartpole", "dqn_cartpole", "ppo_multi_cartpole"])
def test_a_rerun_repeats_the_recorded_run_and_says_it_is_identical(tmp_path, args):
    first = run_cli([*args, "seed=0", "progress=false", "tracking.wait=true"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    original = run_summary(first.stdout)["run_id"].strip("()")

    again = run_cli([f"rerun={original}", "progress=false", "tracking.wait=true"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    block = again.stdout.split("rlrun: stopped:")[0]
    assert f"rlrun: rerun of run '{run_summary(first.stdout)['MLflow'].split(chr(39))[1]}' ({original})" in block
    for label in ("recorded", "code", "packages", "plugins", "python", "machine"):
        assert f"\n  {label} " in block, block
    assert "packages   same: " in block and "python     same: " in block, block
    assert "variant" not in block  # progress and tracking settings are not a variant
    repeat = again.stdout.strip().splitlines()[-1]
    assert repeat.startswith("  repeat     identical to run ") and original in repeat, again.stdout[-2000:]

    client = _store(tmp_path)
    new = run_summary(again.stdout)["run_id"].strip("()")
    assert new != original
    tags = client.get_run(new).data.tags
    assert tags["rlrun.rerun_of"] == original and tags["rlrun.rerun_variant"] == ""
    assert client.get_run(new).info.experiment_id == client.get_run(original).info.experiment_id
    curve = _returns(client, original)
    assert len(curve) == int(args[1].split("=")[1]) and _returns(client, new) == curve

    # a variant: listed as such, tagged, and its curve is not claimed to repeat
    variant = run_cli([f"rerun={original}", "seed=3", "stop.training_iteration=3", "progress=false"], tmp_path)
    assert variant.returncode == 0, variant.stderr[-3000:]
    assert "  variant    seed=3 stop.training_iteration=3" in variant.stdout
    assert "  repeat     differs from run " in variant.stdout, variant.stdout[-2000:]
    if args[0] != "+experiment=ppo_cartpole":
        return
    # rlrun-report <run> <run>: the two side by side
    other = run_summary(variant.stdout)["run_id"].strip("()")
    same = subprocess.run([sys.executable, "-m", "rlrun.tracking.report", original, new], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert same.returncode == 0, same.stderr
    assert "  config     same (output and tracking settings aside)" in same.stdout, same.stdout
    assert "  curves     identical to run " in same.stdout, same.stdout
    apart = subprocess.run([sys.executable, "-m", "rlrun.tracking.report", original, other], cwd=tmp_path,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert apart.returncode == 0, apart.stderr
    assert "  config     seed: 0 vs 3; stop.training_iteration: 15.0 vs 3.0" in apart.stdout, apart.stdout
    assert "  curves     differs from run " in apart.stdout and "at iteration 1: " in apart.stdout, apart.stdout


def _git(d, *args):
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=d,
                          capture_output=True, text=True, check=True).stdout


def test_a_dirty_tree_is_recorded_with_its_patch_and_rerun_says_the_code_differs(tmp_path):
    """A run from a tree with an uncommitted change to a plugin: the record holds the patch (which
    applies with ``git apply``) and the plugin's source; after ``git stash`` the rerun says both differ
    before it starts."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "my_plugin.py").write_text("# a plugin module\nSCALE = 1\n")
    (tmp_path / ".gitignore").write_text("mlflow.db*\nmlartifacts/\noutputs/\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "first")
    (tmp_path / "my_plugin.py").write_text("# a plugin module\nSCALE = 2  # not committed\n")
    first = run_cli(["+experiment=ppo_cartpole", "stop.training_iteration=2", "plugins=[my_plugin]", "progress=false",
                     "tracking.wait=true"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    original = run_summary(first.stdout)["run_id"].strip("()")
    client = _store(tmp_path)
    tags = client.get_run(original).data.tags
    head = _git(tmp_path, "rev-parse", "HEAD").strip()
    assert tags["git_sha"] == head and tags["rlrun.git_dirty"] == "true", tags
    assert tags["rlrun.git_patch"].startswith("provenance/git.patch: ") and "cut" not in tags["rlrun.git_patch"]
    assert tags["rlrun.plugin_sources"] == "provenance/plugins/my_plugin.py"
    assert tags["rlrun.command"].startswith("rlrun +experiment=ppo_cartpole ") and \
        tags["rlrun.overrides"].startswith("+experiment=ppo_cartpole stop.training_iteration=2")
    artifacts = {a.path for a in client.list_artifacts(original, "provenance")}
    assert {"provenance/git.patch", "provenance/requirements.txt", "provenance/plugins"} <= artifacts
    patch = client.download_artifacts(original, "provenance/git.patch", str(tmp_path / "dl"))
    requirements = Path(client.download_artifacts(original, "provenance/requirements.txt", str(tmp_path / "dl")))
    assert any(line.startswith("torch==") for line in requirements.read_text().splitlines())

    _git(tmp_path, "stash", "-q")
    again = run_cli([f"rerun={original}", "progress=false"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    block = again.stdout.split("rlrun: stopped:")[0]
    assert "  code       differs: the record has uncommitted changes this tree lacks (" in block, block
    assert "  plugins    differ: my_plugin.py" in block, block
    assert client.get_run(run_summary(again.stdout)["run_id"].strip("()")).data.tags["rlrun.rerun_differs"] == \
        "code, plugins"
    _git(tmp_path, "apply", patch)  # the recorded patch brings the change back
    assert "SCALE = 2" in (tmp_path / "my_plugin.py").read_text()


def test_resume_by_run_id_after_the_output_dir_is_gone_continues_the_same_run_quietly(tmp_path):
    import shutil

    first = run_cli(["+experiment=ppo_cartpole", "stop.training_iteration=2", "progress=false", "tracking.wait=true"],
                    tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = run_summary(first.stdout)["run_id"].strip("()")
    shutil.rmtree(tmp_path / "outputs")
    again = run_cli(["+experiment=ppo_cartpole", "stop.training_iteration=4", "progress=false", "tracking.wait=true",
                     f"resume={run_id}"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert run_summary(again.stdout)["run_id"].strip("()") == run_id
    assert "Downloading artifacts" not in again.stdout + again.stderr, again.stderr[-2000:]
    steps = [m.step for m in _store(tmp_path).get_metric_history(run_id, "timesteps_total")]
    assert len(steps) == 4 and len(set(steps)) == 4, steps


def test_a_run_without_a_config_artifact_is_refused_in_one_line(tmp_path):
    client = _store(tmp_path)
    exp = client.create_experiment("other", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(exp, run_name="not-rlrun").info.run_id
    client.set_terminated(run_id)
    for spec in (run_id, "not-rlrun", f"runs:/{run_id}"):
        p = run_cli([f"rerun={spec}"], tmp_path)
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [
            f"rlrun: error: rerun={spec}: run {run_id} has no config.yaml artifact (not an rlrun run, or its "
            f"record is incomplete): nothing to run again"], p.stderr


@pytest.mark.ray
def test_a_run_on_ray_workers_repeats_too(tmp_path):
    """Synchronous Ray sampling gathers the workers' fragments in worker order, each worker seeded by its
    index: a rerun on the same machine repeats the curve (asynchronous sampling, APPO's, does not)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def cli(*args):
        return subprocess.run(isolated(rlrun_cmd(*args, "progress=false", "tracking.wait=true")), cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, env=env)

    first = cli("+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=2", "seed=0",
                "stop.training_iteration=8")
    assert first.returncode == 0, first.stderr[-3000:]
    original = run_summary(first.stdout)["run_id"].strip("()")
    again = cli(f"rerun={original}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1].startswith("  repeat     identical to run "), again.stdout[-2000:]


def test_a_sweep_jobs_run_reruns_that_job_alone_and_the_parent_is_refused(tmp_path):
    sweep = run_cli(["-m", "+experiment=ppo_cartpole", "seed=0,1", "stop.training_iteration=3", "progress=false"],
                    tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    client = _store(tmp_path)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parent = next(r for r in runs if r.data.tags.get("rlrun.sweep") == "true")
    job = next(r for r in runs if r.data.tags.get("rlrun.job_num") == "1")
    again = run_cli([f"rerun={job.info.run_id}", "progress=false", "tracking=none"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "  recorded   +experiment=ppo_cartpole seed=1 stop.training_iteration=3 progress=False (job 1 of the " \
           "sweep `rlrun -m +experiment=ppo_cartpole seed=0,1" in again.stdout, again.stdout[:2000]
    assert again.stdout.strip().splitlines()[-1].startswith("  repeat     identical to run 'job 1: "), again.stdout
    assert len([r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]) == len(runs)

    p = run_cli([f"rerun={parent.info.run_id}"], tmp_path)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"rlrun: error: rerun={parent.info.run_id}: run {parent.info.run_id} is a sweep's parent run: give one of "
        f"its jobs' runs (rlrun-report {parent.info.run_id} lists them)"], p.stderr
