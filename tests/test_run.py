import signal
import subprocess
import time

from mlflow.tracking import MlflowClient

from rlrun.run import stop_reason
from tests.conftest import REPO, rlrun_cmd


def test_stop_reason_any_criterion_and_nan_never_meets():
    stop = {"timesteps_total": 100, "rollout/episode_return_mean": 10}
    assert stop_reason(stop, {"timesteps_total": 50, "rollout/episode_return_mean": float("nan")}) is None
    assert stop_reason(stop, {"timesteps_total": 100}) == "timesteps_total = 100 >= 100"
    assert "rollout/episode_return_mean" in stop_reason(stop, {"timesteps_total": 1, "rollout/episode_return_mean": 11})


def test_ctrl_c_writes_a_final_checkpoint_and_marks_the_run_killed(tmp_path):
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(rlrun_cmd("+experiment=ppo_cartpole", "stop.timesteps_total=10000000",
                                      "++stop={rollout/episode_return_mean: 1000}"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "iter" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        time.sleep(2.0)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ppo_cartpole").experiment_id])
    assert run.info.status == "KILLED"
    (ckpt,) = client.list_artifacts(run.info.run_id, "checkpoints")
    assert ckpt.path.startswith("checkpoints/iter_")
