"""Remote rollout workers on a real local Ray instance. Every Ray process runs in its own network
namespace with only loopback (see conftest.isolated), and is stopped by the test."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, isolated, on_ray_cluster, rlrun_cmd, run_summary

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _mlflow_run(d, experiment="ppo_cartpole"):
    client = MlflowClient(tracking_uri=f"sqlite:///{d / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id])
    return client, run


def test_num_workers_0_never_imports_ray(tmp_path):
    code = textwrap.dedent("""
        import sys
        from rlrun.app.cli import compose
        from rlrun.app.runner import run
        r = run(compose(["+experiment=ppo_cartpole", "tracking=none", "progress=false",
                         "stop.training_iteration=2"]))
        assert r.metrics["training_iteration"] == 2
        print("ray imported:", "ray" in sys.modules)
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=ENV,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "ray imported: False" in p.stdout


@pytest.mark.ray
def test_first_batches_reproducible_and_ray_shut_down_after_each_job(tmp_path):
    # two jobs in one process, as Hydra's basic multirun launcher runs them
    code = textwrap.dedent("""
        import numpy as np, ray
        from rlrun import make_trainer
        batches = []
        for _ in range(2):
            t = make_trainer(["+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=2",
                              "tracking=none", "seed=7"])
            batches.append(t.sample_batch())
            t.stop()
            assert not ray.is_initialized(), "Ray still up after the job"
        a, b = batches
        assert a.keys() == b.keys()
        print("rows", len(a), len(b))
        print("identical:", all(np.array_equal(a[k], b[k]) for k in a))
        print("workers differ:", not np.array_equal(a["obs"][:8], a["obs"][len(a) // 2:len(a) // 2 + 8]))
        # a resumed run: the Ray workers' envs start afresh (not from the run's first states), the same each time
        args = ["+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=2", "tracking=none", "seed=7"]
        t = make_trainer(args)
        t.train()
        state = t.get_state()
        t.stop()
        resumed = []
        for _ in range(2):
            t = make_trainer(args)
            t.set_state(state)
            resumed.append(t.sample_batch())
            t.stop()
        r = resumed[0]
        print("resumed afresh:", all(not np.isclose(r["obs"][i], a["obs"][i]).all() for i in (0, len(a) // 2)))
        print("resumed identical:", all(np.array_equal(r[k], resumed[1][k]) for k in r))
    """)
    p = subprocess.run(isolated([sys.executable, "-c", code]), cwd=tmp_path, capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "identical: True" in p.stdout and "workers differ: True" in p.stdout, p.stdout
    assert "resumed afresh: True" in p.stdout and "resumed identical: True" in p.stdout, p.stdout
    # each job's private Ray instance removed its session dir (logs, sockets) at shutdown
    assert not list(Path(os.environ["RAY_TMPDIR"]).glob("rlrun-ray-*"))
    rows = [int(x) for x in p.stdout.split("rows ")[1].split()[:2]]
    # the preset's 1024-row batch from 2 workers x 16 sub-envs; the overshoot < num_envs per fragment
    assert rows[0] == rows[1] and 1024 <= rows[0] < 1024 + 2 * 16


@pytest.mark.ray
@pytest.mark.slow
def test_killed_worker_is_restarted_and_the_run_still_reaches_475(tmp_path):
    args = ["+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=2", "seed=0"]
    err_file = (tmp_path / "stderr.txt").open("w")  # a file: an unread stderr pipe could fill and block
    proc = subprocess.Popen(isolated(rlrun_cmd(*args)), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=err_file, text=True, env=ENV)
    lines: list[str] = []
    trained = threading.Event()  # the first progress line: iteration 1 is done, the run is mid-way

    def read_stdout():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("iter "):
                trained.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        # the preset trains for ~3.5 s after iteration 1, so a worker is killed as soon as it has
        # trained (a fixed sleep after the workers start outlasted the whole run in CI)
        assert trained.wait(180), "no progress line within 180 s"
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "RolloutWorker" in " ".join(_cmdline(c))]
        assert len(workers) == 2, [_cmdline(w) for w in workers]
        workers[0].send_signal(signal.SIGKILL)
        proc.wait(timeout=600)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        err_file.close()
    err = (tmp_path / "stderr.txt").read_text()
    out = "".join(lines)
    assert proc.returncode == 0, err[-3000:]
    assert run_summary(out)["stopped"].startswith("rollout/episode_return_mean"), out[-500:]
    client, run = _mlflow_run(tmp_path)
    assert run.info.status == "FINISHED"
    restarts = client.get_metric_history(run.info.run_id, "workers/num_restarts")
    assert max(m.value for m in restarts) >= 1
    healthy = client.get_metric_history(run.info.run_id, "workers/num_healthy")
    assert healthy[-1].value == 2
    assert run.data.metrics["rollout/episode_return_mean"] >= 475


def _cmdline(p):
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.mark.ray
def test_job_joins_an_existing_cluster_with_address_auto(tmp_path):
    command = (f"{sys.executable} -m rlrun +experiment=ppo_cartpole rollout=ray rollout.num_workers=2 "
               "rollout.ray.address=auto stop.training_iteration=3")
    p = subprocess.run(on_ray_cluster(command, 6390), cwd=tmp_path, capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    _, run = _mlflow_run(tmp_path)
    assert run.data.tags["ray.address"] == "127.0.0.1:6390"  # the job ran on the cluster we started
    assert run.data.metrics["workers/num_healthy"] == 2


@pytest.mark.ray
def test_address_without_a_cluster_fails_fast_with_a_clear_message(tmp_path):
    t0 = time.monotonic()
    p = subprocess.run(isolated(rlrun_cmd("rollout=ray", "rollout.ray.address=127.0.0.1:6391", "tracking=none")),
                       cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 2
    assert "rollout.ray.address: no Ray cluster at '127.0.0.1:6391'" in p.stderr
    assert "Traceback" not in p.stderr
    assert time.monotonic() - t0 < 60


@pytest.mark.ray
def test_address_auto_that_finds_a_dead_cluster_fails_fast_naming_what_it_found(tmp_path):
    # the address file the last `ray start` left under $RAY_TMPDIR, of a head that is gone: Ray would try
    # it for minutes (600 s measured with a head in an unreachable network namespace)
    ray_tmp = tmp_path / "rt"
    (ray_tmp / "ray").mkdir(parents=True)
    (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:6393")
    t0 = time.monotonic()
    p = subprocess.run(isolated(rlrun_cmd("rollout=ray", "rollout.ray.address=auto", "tracking=none")),
                       cwd=tmp_path, capture_output=True, text=True, env={**ENV, "RAY_TMPDIR": str(ray_tmp)},
                       timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    # Ray prefers the file, but where exactly one GCS process runs on the machine (another test's head) it takes
    # that one's address instead: either way the line names the address Ray found, and nothing answers there
    assert re.search(r"rollout\.ray\.address: no Ray cluster at 'auto' \(Ray found '127\.0\.0\.1:\d+'\)",
                     p.stderr), p.stderr
    assert "Traceback" not in p.stderr
    assert time.monotonic() - t0 < 60


FLAKY = textwrap.dedent('''
    import os
    import gymnasium as gym
    from rlrun import ENVS

    class Flaky(gym.Wrapper):
        """CartPole that raises once its process has stepped ``after`` times (per process)."""
        steps = 0

        def __init__(self, env, after):
            super().__init__(env)
            self.after = after

        def step(self, action):
            Flaky.steps += 1
            if Flaky.steps > self.after and os.getpid() != int(os.environ["DRIVER_PID"]):
                raise RuntimeError("flaky env exploded")
            return self.env.step(action)

    @ENVS.register("FlakyCartPole", vector=False)
    def flaky(after=3000):
        return Flaky(gym.make("CartPole-v1"), after)
''')


@pytest.mark.ray
def test_env_error_drops_one_fragment_restarts_and_past_the_bound_fails_cleanly(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    driver = f"export DRIVER_PID=$$; exec {sys.executable} -m rlrun "
    common = ("algo=pg rollout=ray rollout.num_workers=2 rollout.num_envs_per_worker=4 "
              "rollout.rollout_fragment_length=32 algo.train_batch_size=256 env.id=FlakyCartPole "
              "'plugins=[flaky]' progress=false")
    # within the bound: each worker fails once (after 800 steps), is restarted, and the run finishes
    ok = subprocess.run(isolated(["bash", "-c", driver + common + " +env.kwargs.after=800 stop.training_iteration=12 "
                                  "rollout.max_worker_restarts=10"]),
                        cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=600)
    assert ok.returncode == 0, ok.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["workers/num_restarts"] >= 2
    assert run.data.metrics["workers/num_dropped_fragments"] >= 2
    # past the bound: a clear message, a final checkpoint, and the MLflow run marked FAILED
    bad = subprocess.run(isolated(["bash", "-c", driver + common + " +env.kwargs.after=800 stop.training_iteration=50 "
                                   "rollout.max_worker_restarts=1 tracking.experiment_name=bound"]),
                         cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=600)
    assert bad.returncode == 1
    assert "past rollout.max_worker_restarts=1" in bad.stderr and "flaky env exploded" in bad.stderr
    (run,) = client.search_runs([client.get_experiment_by_name("bound").experiment_id])
    assert run.info.status == "FAILED"
    ckpts = client.list_artifacts(run.info.run_id, "checkpoints")
    assert len(ckpts) == 1 and ckpts[0].path.startswith("checkpoints/iter_")


@pytest.mark.ray
@pytest.mark.slow
def test_appo_with_two_async_workers_reaches_475_within_500k_steps(tmp_path):
    p = subprocess.run(isolated(rlrun_cmd("+experiment=appo_cartpole", "seed=0")), cwd=tmp_path, capture_output=True,
                       text=True, env=ENV, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    _, run = _mlflow_run(tmp_path, "appo_cartpole")
    assert run.data.metrics["rollout/episode_return_mean"] >= 475
    assert run.data.metrics["timesteps_total"] <= 500_000
    assert run.data.metrics["workers/num_healthy"] == 2


@pytest.mark.ray
def test_remote_workers_follow_the_learners_schedules(tmp_path):
    # DQN's epsilon is a schedule over the learner's env steps: remote workers must see the count
    code = textwrap.dedent("""
        import ray
        from rlrun import make_trainer
        t = make_trainer(["+experiment=dqn_cartpole", "rollout=ray", "rollout.num_workers=2",
                          "rollout.num_envs_per_worker=1", "algo.learning_starts=100000", "tracking=none"])
        for _ in range(3):
            t.train()
        t.workers.sync_weights()
        seen = ray.get([w.__ray_call__.remote(lambda self: self.policy.global_timestep)
                        for w in t.workers._remote.values()])
        print("learner", t.timesteps_total, "workers", seen)
        t.stop()
    """)
    p = subprocess.run(isolated([sys.executable, "-c", code]), cwd=tmp_path, capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    learner = int(p.stdout.split("learner ")[1].split()[0])
    assert learner >= 3 * 256 and f"workers [{learner}, {learner}]" in p.stdout, p.stdout


@pytest.mark.ray
def test_sac_trains_on_ray_workers_with_sub_envs_and_the_workers_act_with_the_learners_weights(tmp_path):
    code = textwrap.dedent("""
        import numpy as np, ray
        from rlrun import make_trainer
        t = make_trainer(["+experiment=sac_pendulum", "rollout=ray", "rollout.num_workers=2",
                          "rollout.num_envs_per_worker=2", "algo.train_batch_size=128", "algo.learning_starts=256",
                          "model.hiddens=[32,32]", "model.critic_hiddens=[32,32]", "tracking=none"])
        for _ in range(4):
            r = t.train()
        t.workers.sync_weights()
        obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        mine = t.policy.compute_actions(obs, explore=False).actions
        theirs = ray.get([w.__ray_call__.remote(lambda self, o: self.policy.compute_actions(o, explore=False).actions,
                                                 obs) for w in t.workers._remote.values()])
        print("updates", r["train/num_updates"], "loss", r["train/loss/critic"],
              "same", all(np.array_equal(mine, a) for a in theirs))
        t.stop()
    """)
    p = subprocess.run(isolated([sys.executable, "-c", code]), cwd=tmp_path, capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    # 4 iterations of 128 env steps (2 workers x 2 sub-envs x 32): the buffer reaches 256 in the second
    assert "updates 384.0" in p.stdout and "same True" in p.stdout, p.stdout
    assert np.isfinite(float(p.stdout.split("loss ")[1].split()[0]))


@pytest.mark.ray
def test_a_private_ray_instance_listens_on_loopback_only_and_dies_with_its_run(tmp_path):
    args = ["+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=2", "tracking=none", "progress=false",
            "stop.timesteps_total=100000000", "++stop={rollout/episode_return_mean: 100000}"]
    proc = subprocess.Popen(isolated(rlrun_cmd(*args), fake_lan=True), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        family: list[psutil.Process] = []
        while time.monotonic() < deadline and proc.poll() is None:
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            if sum("RolloutWorker" in p.name() for p in family) == 2:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(3.0)  # the workers are sampling; every Ray process has opened its ports
        listening = listening_addresses(proc.pid)  # the namespace holds only this run's processes
        assert len(listening) >= 8, listening  # gcs_server, raylet, agents, workers
        exposed = [a for a in listening if a not in ("127.0.0.1", "::1")]
        assert not exposed, exposed
        os.killpg(proc.pid, signal.SIGKILL)  # what a scheduler or the OOM killer does
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, [(p.pid, p.name()) for p in alive]
        # a group kill leaves no time to remove the instance's temp dir: the next private instance does
        left = list(Path(os.environ["RAY_TMPDIR"]).glob(f"rlrun-ray-{proc.pid}-*"))
        assert left
        from rlrun.sources.ray_instance import private_temp_dir

        shutil.rmtree(private_temp_dir())
        assert not any(d.exists() for d in left)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def listening_addresses(pid: int) -> list[str]:
    """IP of every TCP socket listening in ``pid``'s network namespace (from /proc/<pid>/net/tcp{,6};
    psutil matches sockets against the caller's namespace only)."""
    import ipaddress

    out = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            raw = bytes.fromhex(local.split(":")[0])
            # the kernel prints each 32-bit word in host (little-endian) order
            word_swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(word_swapped)
            out.append(str(getattr(ip, "ipv4_mapped", None) or ip))
    return out
