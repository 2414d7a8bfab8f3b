"""rlrun algorithms as Ray Tune Trainables (rlrun/app/tune_trainable.py) and population-based
training from YAML (``rlrun +experiment=... tune=pbt``, rlrun/app/tune_run.py): real Tune, a real
local Ray instance in a loopback-only namespace, a real SQLite MLflow store."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, isolated, run_cli


def _left_running(*roots: str) -> list[str]:
    """Processes whose command line names one of ``roots`` or whose working dir is under one."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if any(r in cmd or cwd.startswith(r) for r in roots):
            left.append(f"{pid}: {cmd[:200]}")
    return left


def _client(tmp_path: Path):
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _runs(client, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, [e.name for e in client.search_experiments()]
    return client.search_runs([exp.experiment_id])


def _run_isolated(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
                  timeout: float = 900) -> tuple[subprocess.CompletedProcess[str], int]:
    """``argv`` in a loopback-only namespace (its pid is the command's: unshare and sh exec it)."""
    proc = subprocess.Popen(isolated(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # Ctrl-C: rlrun stops its trials and its Ray instance (tested below)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{argv[2:]} ran past {timeout} s; stopped:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), proc.pid


def _run_script(script: str, tmp_path: Path, timeout: float = 900) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``script`` run isolated with its own Ray temp dir (removed after; nothing of it left running), and its
    output's lines by their first word."""
    ray_tmp = tempfile.mkdtemp(prefix="rt")
    try:
        (tmp_path / "script.py").write_text(script)
        p, _ = _run_isolated([sys.executable, "script.py"], tmp_path, {"RAY_TMPDIR": ray_tmp}, timeout=timeout)
        assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
        assert not _left_running(ray_tmp, str(tmp_path))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return p, {line.split()[0]: line.split()[1:] for line in p.stdout.splitlines() if line.split()}


@pytest.mark.ray
def test_pbt_from_yaml_exploits_and_records_every_trial_in_mlflow(tmp_path):
    # 3 iterations of 1024 steps, synchronous PBT over two trials with a perturbation at every iteration: two rounds
    # in which both trials wait, then the one behind takes the other's checkpoint (as a rule: see below). The interval
    # is under an iteration's 1,024-1,053 steps, so that each trial's iteration 2 reaches round 2 (with 1024 a local
    # run of 2026-12-07 on Tune's own synchronous PBT hung until killed: rlrun's SynchronousPBT, tested below, now
    # takes such a trial into the round). (Tune's
    # asynchronous PBT skips an exploit when the top trial saved no checkpoint at its own last check: over 4 trials,
    # seven asynchronous rounds made no exploit in one fresh-clone run of 2026-12-02, the trials' scores, a few short
    # episodes, mostly noise)
    p, pid = _run_isolated([sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole", "tune=pbt", "tune.synch=true",
                            "tune.num_samples=2", "stop.timesteps_total=3072", "tune.perturbation_interval=900",
                            "progress=false", "evaluation.interval=2", "evaluation.num_episodes=2"], tmp_path)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert p.stdout.count("rlrun: trial ") == 2 and "rlrun: best trial" in p.stdout, p.stdout[-3000:]
    # the private Ray instance (its temp dir rlrun-ray-<pid>-*: rlrun/sources/ray_instance.py), the trials'
    # actors and their MLflow writers: all gone when rlrun exits
    assert not _left_running(f"rlrun-ray-{pid}-", str(tmp_path)), "left running after rlrun exited"
    client = _client(tmp_path)
    runs = _runs(client, "ppo_cartpole")  # every trial: one run of the preset's experiment
    open_runs = [(r.info.status, r.data.tags) for r in runs if r.info.status != "FINISHED"]
    assert len(runs) == 2 and not open_runs, open_runs
    assert len({r.data.tags["rlrun.tune.trial_id"] for r in runs}) == 2
    ids = {r.info.run_id for r in runs}
    exploited = [r for r in runs if "rlrun.tune.exploit.1" in r.data.tags]
    exploits = sum(1 for r in runs for tag in r.data.tags if tag.startswith("rlrun.tune.exploit."))
    # rlrun tags every exploit Tune made: its own record has a line for each (PBT's log_config, pbt_global.txt).
    # Synchronous PBT made one at each of the two rounds in most runs; in a fresh-clone CI run of 2026-12-07 it
    # made one only (at the second round the two trials reported exact ties, 18.876712, one a clone of the other)
    made = len(next(tmp_path.glob("outputs/*/*/tune/ppo_cartpole/pbt_global.txt")).read_text().splitlines())
    assert exploits == made >= 1, (exploits, made)
    changed = False
    for r in exploited:
        source = r.data.tags["rlrun.tune.restored_from_run"]
        assert source in ids - {r.info.run_id}, "the checkpoint came from another trial's run"
        assert "restored trial" in r.data.tags["rlrun.tune.exploit.1"]
        marks = client.get_metric_history(r.info.run_id, "tune/exploits")  # where on its curve: after its own steps
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "timesteps_total")]
        assert marks and all(any(s < m.step for s in steps) for m in marks), (marks, steps)
        for key in ("algo.lr", "loss.clip_param"):  # the values it trained with over time
            values = [m.value for m in client.get_metric_history(r.info.run_id, f"hparams/{key}")]
            # one a training iteration; a trial that took a checkpoint further on trains fewer of its own
            assert len(values) >= 2, values
            changed |= len(set(values)) > 1
    assert changed, "an exploiting trial's values never changed"
    for r in runs:  # each trial keeps its own seed through exploits (the source's would replay the source's episodes)
        seeds = {m.value for m in client.get_metric_history(r.info.run_id, "hparams/seed")}
        assert seeds == {float(r.data.params["seed"])}, (seeds, r.data.params["seed"])
    # Tune's checkpoints are rlrun checkpoints, also in the trial's MLflow run. Tune saves a trial when it pauses it to
    # wait at a round or when it is the top one; the trial that reached both rounds second and was behind at both saved
    # none (a fresh-clone CI run of 2026-12-07). The run an exploit took its checkpoint from always holds it
    tune_ckpts = {r.info.run_id: [a.path for a in client.list_artifacts(r.info.run_id, "checkpoints")
                                  if a.path.startswith("checkpoints/checkpoint_")] for r in runs}
    sources = {r.data.tags["rlrun.tune.restored_from_run"] for r in exploited}
    assert sources and all(tune_ckpts[s] for s in sources), (sources, tune_ckpts)
    for run_id, names in tune_ckpts.items():
        for name in names:
            files = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run_id, name)}
            assert {"meta.json", "config.yaml"} <= files, (name, files)
    for r in runs:  # every trial's final checkpoint, as a run without Tune has
        names = [a.path for a in client.list_artifacts(r.info.run_id, "checkpoints")]
        assert [n for n in names if n.startswith("checkpoints/iter_")], names
        assert r.data.tags["rlrun.stop_reason"].startswith("timesteps_total"), r.data.tags  # its own stop ended it
        # evaluation.final: the trial's last iteration evaluated too (3 iterations, an evaluation every 2)
        evals = [m.step for m in client.get_metric_history(r.info.run_id, "eval/episode_return_mean")]
        last = max(m.step for m in client.get_metric_history(r.info.run_id, "timesteps_total"))
        assert evals and evals[-1] == last, (evals, last)


@pytest.mark.ray
def test_fifo_over_pbts_keys_draws_each_trials_values_as_pbt_does_and_keeps_them(tmp_path):
    # tune=pbt's population without exploits: the keys PBT mutates are drawn once per trial, as PBT draws them
    p, pid = _run_isolated([sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole", "tune=pbt",
                            "tune.scheduler=fifo", "tune.num_samples=2", "stop.timesteps_total=2048",
                            "progress=false"], tmp_path)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert "rlrun: 2 trials (fifo)" in p.stdout and p.stdout.count("rlrun: trial ") == 2, p.stdout[-3000:]
    assert not _left_running(f"rlrun-ray-{pid}-", str(tmp_path)), "left running after rlrun exited"
    client = _client(tmp_path)
    runs = _runs(client, "ppo_cartpole")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs), [r.info.status for r in runs]
    lrs = [float(r.data.params["algo.lr"]) for r in runs]  # pbt.yaml: {loguniform: [3.0e-4, 1.0e-2]}
    assert all(3.0e-4 <= lr <= 1.0e-2 for lr in lrs) and lrs[0] != lrs[1], lrs
    assert all(float(r.data.params["loss.clip_param"]) in (0.1, 0.2, 0.3) for r in runs)
    for r in runs:  # kept: one value over the whole trial, and no exploit
        values = {m.value for m in client.get_metric_history(r.info.run_id, "hparams/algo.lr")}
        assert len(values) == 1 and not [k for k in r.data.tags if k.startswith("rlrun.tune.exploit")], r.data.tags


@pytest.mark.ray
def test_asha_from_yaml_stops_trials_behind_at_a_rung_and_records_why(tmp_path):
    # one trial at a time over a grid of the preset's lr and a frozen one (1e-9), twice each, all on seed 0. ASHA keeps
    # a trial at a rung only if it beats the median of the trials that reached it before: whatever the order, a
    # frozen trial that comes after a learning one stops at the 4,096-step rung, and a learning one (the same curve
    # each time) never falls behind, so it trains to max_t
    p, pid = _run_isolated([sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole", "tune=asha",
                            "tune.num_samples=2", "tune.max_concurrent_trials=1", "tune.max_t=8192",
                            "tune.grace_period=4096", "~tune.param_space.algo.lr",
                            "+tune.param_space.algo.lr={grid: [4.1e-3, 1.0e-9]}",
                            "tune.param_space.seed=0", "progress=false"], tmp_path)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert "rlrun: 4 trials (asha)" in p.stdout and p.stdout.count("rlrun: trial ") == 4, p.stdout[-3000:]
    assert "(stopped by asha)" in p.stdout, p.stdout[-3000:]
    assert not _left_running(f"rlrun-ray-{pid}-", str(tmp_path)), "left running after rlrun exited"
    runs = _runs(_client(tmp_path), "ppo_cartpole")
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs), [r.info.status for r in runs]
    ended = {(float(r.data.params["algo.lr"]), r.data.metrics["timesteps_total"], r.data.tags["rlrun.stop_reason"])
             for r in runs}
    learning = [e for e in ended if e[0] > 1e-6]
    assert learning and all(steps >= 8192 for _, steps, _ in learning), ended
    frozen = [e for e in ended if e[0] < 1e-6]  # an iteration is whole episodes: the rung is passed at ~4,100 steps
    assert any(4096 <= steps < 8192 and why == f"stopped by the Tune scheduler at timesteps_total = {steps:g}"
               for _, steps, why in frozen), ended


@pytest.mark.ray
def test_ctrl_c_ends_the_population_marks_its_trials_killed_and_leaves_nothing_running(tmp_path):
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # a stop no trial can meet (CartPole's returns end at 500): every trial is still running at Ctrl-C (with the
    # preset's 475, one trial met it before Ctrl-C in a CI run and ended FINISHED)
    never = "++stop={rollout/episode_return_mean: 501, timesteps_total: 100000000}"
    proc = subprocess.Popen(isolated([sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole", "tune=pbt", never,
                                      "progress=false"]), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:  # every trial has recorded iterations
            time.sleep(2)
            if (tmp_path / "mlflow.db").exists():
                runs = _runs_or_none(_client(tmp_path), "ppo_cartpole")
                if runs and len(runs) == 4 and all("timesteps_total" in r.data.metrics for r in runs):
                    break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out[-2000:], err[-2000:])
    assert not _left_running(f"rlrun-ray-{proc.pid}-", str(tmp_path))
    runs = _runs(_client(tmp_path), "ppo_cartpole")
    assert "rlrun: interrupted: 4 trials had not ended (MLflow runs marked KILLED)" in err, err[-2000:]
    assert [r.info.status for r in runs] == ["KILLED"] * 4
    assert all(r.data.tags["rlrun.stop_reason"].startswith("interrupted") for r in runs)


def _runs_or_none(client, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp is not None else None


SCRIPT = textwrap.dedent("""
    import os
    import ray
    from ray import tune
    from rlrun import PPOTrainer

    ray.init(num_cpus=2, include_dashboard=False)
    where = os.path.abspath("ray_results")
    cfg = {"env": "CartPole-v1", "train_batch_size": 1000, "num_sgd_iter": 5}
    grid = tune.run(PPOTrainer, config={**cfg, "lr": tune.grid_search([1e-3, 3e-4])}, stop={"training_iteration": 2},
                    checkpoint_freq=1, storage_path=where, name="grid", verbose=0)
    first = grid.trials[0]
    print("GRID", [t.last_result["training_iteration"] for t in grid.trials], first.config["lr"])
    again = tune.run(PPOTrainer, config={**cfg, "lr": first.config["lr"]}, restore=first.checkpoint.path,
                     stop={"training_iteration": 3}, storage_path=where, name="restored", verbose=0)
    r = again.trials[0].last_result
    print("RESTORED", r["training_iteration"], r["timesteps_total"], r["episode_reward_mean"] > 0)
    res = tune.Tuner(PPOTrainer, param_space=cfg, run_config=tune.RunConfig(
        stop={"training_iteration": 1}, storage_path=where, name="tuner", verbose=0)).fit()
    print("TUNER", res[0].metrics["training_iteration"], res[0].error)

    # a policy from build_policy and its build_trainer class, in Tune (the actor registers them again)
    from rlrun import Postprocessing, SampleBatch, build_policy, build_trainer, compute_advantages, trainable

    def pg_loss(policy, model, dist_class, train_batch):
        logits, _ = model({SampleBatch.CUR_OBS: train_batch[SampleBatch.CUR_OBS]})
        logp = dist_class(logits).logp(train_batch[SampleBatch.ACTIONS])
        return -(logp * train_batch[Postprocessing.ADVANTAGES]).mean()

    def advantages(policy, batch, other_agent_batches=None, episode=None):
        return compute_advantages(batch, 0.0, policy.config["gamma"], use_gae=False, use_critic=False)

    MyTrainer = build_trainer(name="MyTuneTrainer", default_policy=build_policy(
        name="MyTunePolicy", loss_fn=pg_loss, postprocess_fn=advantages))
    c = tune.run(trainable(MyTrainer), config={"env": "CartPole-v1", "lr": 0.01, "train_batch_size": 1000},
                 stop={"training_iteration": 2}, storage_path=where, name="classic", verbose=0)
    print("CLASSIC", c.trials[0].status, c.trials[0].last_result["training_iteration"])
    ray.shutdown()
""")


@pytest.mark.ray
def test_tune_run_and_tuner_train_rlrun_algorithms_with_save_and_restore(tmp_path):
    p, lines = _run_script(SCRIPT, tmp_path)
    assert lines["GRID"][:2] == ["[2,", "2]"], p.stdout
    # restored from the grid's checkpoint at iteration 2: one more iteration, its env steps on top
    assert lines["RESTORED"][0] == "3" and int(lines["RESTORED"][1]) >= 3000, p.stdout
    assert lines["TUNER"] == ["1", "None"], p.stdout
    client = _client(tmp_path)  # the launch dir's store: each trial one run in its Tune experiment's name
    grid = _runs(client, "grid")
    assert len(grid) == 2 and {r.info.status for r in grid} == {"FINISHED"}
    assert sorted(float(r.data.params["algo.lr"]) for r in grid) == [3e-4, 1e-3]
    for r in grid:
        assert len(client.list_artifacts(r.info.run_id, "checkpoints")) == 2  # checkpoint_freq=1, 2 iterations
        assert "rollout/episode_return_mean" in r.data.metrics
        assert r.data.tags["mlflow.runName"].startswith("PPOTrainer")
    (restored,) = _runs(client, "restored")
    steps = [m.step for m in client.get_metric_history(restored.info.run_id, "timesteps_total")]
    assert len(steps) == 1 and steps[0] >= 3000, steps  # the one iteration it trained, after the restored two
    assert len(_runs(client, "tuner")) == 1
    assert lines["CLASSIC"] == ["TERMINATED", "2"], p.stdout
    (classic,) = _runs(client, "classic")
    assert classic.data.params["algo.name"] == "MyTuneTrainer" and classic.data.params["loss.name"] == "MyTunePolicy"


SYNCH_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import ray
    from ray import tune
    from rlrun.app.tune_run import TuneSection, _scheduler

    # the times each trial reports (time_attr t), by trial index, and the stop; one round every 100
    SCENARIOS = {"skips": ([100, 200, 300], [101, 202, 303], 300), "ends": ([100, 150, 250], [101, 202, 303], 250)}

    class Scripted(tune.Trainable):
        def setup(self, config):
            self.times = SCENARIOS[config["scenario"]][int(self.trial_id.split("_")[-1])]
            self.i = 0

        def step(self):
            if (self.i == 0) == self.trial_id.endswith("1"):  # trial 1 reaches round 1 last, trial 0 later slower
                time.sleep(2)
            self.i += 1
            return {"t": self.times[self.i - 1], "score": float(self.times[self.i - 1])}

        def save_checkpoint(self, checkpoint_dir):
            with open(os.path.join(checkpoint_dir, "i.json"), "w") as f:
                json.dump(self.i, f)

        def load_checkpoint(self, checkpoint_dir):
            with open(os.path.join(checkpoint_dir, "i.json")) as f:
                self.i = json.load(f)

    ray.init(num_cpus=2, include_dashboard=False)
    for name, (_, _, stop) in SCENARIOS.items():
        scheduler = _scheduler(TuneSection(metric="score", time_attr="t", perturbation_interval=100, synch=True,
                                           quantile_fraction=0.5, hyperparam_mutations={"w": [1.0, 2.0]}))
        results = tune.Tuner(
            tune.with_resources(Scripted, {"cpu": 1}), param_space={"scenario": name, "w": 1.0},
            tune_config=tune.TuneConfig(num_samples=2, scheduler=scheduler, metric="score", mode="max",
                                        time_budget_s=60),  # a population that waits for good ends here
            run_config=tune.RunConfig(stop={"t": stop}, storage_path=os.path.abspath("tune"), name=name,
                                      verbose=0)).fit()
        print(name.upper(), *[r.metrics.get("t") for r in sorted(results, key=lambda r: r.path)],
              scheduler._num_perturbations, flush=True)
    ray.shutdown()
""")


@pytest.mark.ray
def test_synchronous_pbt_never_leaves_its_population_waiting_for_a_trial_that_skipped_a_round_or_ended(tmp_path):
    # Tune 2.60's synchronous PBT, scripted: at round 1 (t >= 100) trial 1 reports last (101), and Tune sets both
    # trials' last perturbation to 101. "skips": trial 0's 200 reaches round 2 (>= 200) but is 99 past 101, so Tune
    # lets it go on to its stop (300) while trial 1 waits at 202 for it - for good. "ends": trial 0 reaches its stop
    # (250) under round 2, its last result never reaches the scheduler, and trial 1 waits at 202. Both hung until
    # the time budget with Tune's PopulationBasedTraining ([300, 202] and [250, 202], one round each); rlrun's
    # SynchronousPBT takes trial 0 into round 2 at 200, and gives the round up when no live trial can bring it about
    p, lines = _run_script(SYNCH_SCRIPT, tmp_path, timeout=300)
    assert lines["SKIPS"] == ["300", "303", "2"], p.stdout  # both trials at their stop, after two rounds
    assert lines["ENDS"] == ["250", "303", "1"], p.stdout  # trial 1 went on past the round given up


def test_asynchronous_pbt_pauses_a_trial_to_let_another_run_only_where_they_take_turns():
    # Tune's asynchronous PBT pauses a trial that reaches its perturbation while any other trial is PENDING or PAUSED
    # (time sharing, for more trials than CPUs). Where every trial runs at once (tune.time_share null -> false), the
    # other is only restarting after its own exploit, and the pause cost this one a restart for nothing
    from ray.tune.experiment import Trial

    from rlrun.app.tune_pbt import SynchronousPBT

    class Controller:
        search_alg = None

        def __init__(self, trials: list) -> None:
            self.trials = trials

        def get_trials(self) -> list:
            return self.trials

    def decide(time_share: bool) -> str:
        pbt = SynchronousPBT(time_attr="t", perturbation_interval=10, metric="score", mode="max",
                             quantile_fraction=0.25, hyperparam_mutations={"lr": [1e-3, 1e-2]}, time_share=time_share)
        trials = [Trial("PPO", config={"lr": 1e-3}, stub=True, trial_id=str(i)) for i in range(4)]
        controller = Controller(trials)
        for t in trials:
            pbt.on_trial_add(controller, t)
            t.set_status(Trial.RUNNING)
        for i, t in enumerate(trials):  # first results, under the interval
            pbt.on_trial_result(controller, t, {"t": 5, "score": float(i), "training_iteration": 1})
        trials[3].set_status(Trial.PAUSED)  # the top trial, paused (restarting, or waiting for a CPU)
        # trial 1 reaches its perturbation in the middle of the population: neither exploited nor saved
        return str(pbt.on_trial_result(controller, trials[1], {"t": 15, "score": 1.0, "training_iteration": 2}))

    assert decide(time_share=True) == "PAUSE"  # Tune's own
    assert decide(time_share=False) == "CONTINUE"


def test_a_checkpoint_of_another_trial_brings_its_weights_but_not_its_random_streams(tmp_path, monkeypatch):
    # PBT's exploit restores another trial's checkpoint: before, the trial took the source's RNG states with its
    # weights and drew the source's action noise and minibatches; now its own, from its seed (its own trial's
    # checkpoint still gives back the RNG states exactly)
    from rlrun import PPOTrainer

    monkeypatch.chdir(tmp_path)  # the MLflow store: ./mlflow.db
    cfg = {"env": "CartPole-v1", "train_batch_size": 200, "seed": 1}
    source = PPOTrainer(config=cfg)
    source.train()
    saved = source.save(str(tmp_path / "checkpoint"))
    policy = source.ctx.trainer.policy
    streams = (policy.np_rng.bit_generator.state, policy.generator.get_state())
    weights = policy.get_weights()
    same, other = PPOTrainer(config={**cfg, "seed": 2}), PPOTrainer(config={**cfg, "seed": 2})
    try:
        same.restore(saved)
        monkeypatch.setattr(type(other), "trial_id", property(lambda self: "other"))  # all "default" outside Tune
        other.restore(saved)
        for trainable, own in ((same, False), (other, True)):
            p = trainable.ctx.trainer.policy
            assert (p.np_rng.bit_generator.state != streams[0]) == own
            assert (not torch.equal(p.generator.get_state(), streams[1])) == own
            for k, w in p.get_weights().items():
                np.testing.assert_array_equal(w, weights[k])
    finally:
        for trainable in (source, same, other):
            trainable.stop()


def test_an_actor_whose_trial_went_on_in_another_actor_lets_go_of_its_run_without_ending_it(tmp_path, monkeypatch):
    # Tune reuses actors (reuse_actors=True): an actor it cached with a paused trial may see that trial taken up by
    # another actor before it is given a trial again or stopped. It must then leave the trial's MLflow run to that
    # actor: no end state, no final record (before, it ended the run while the trial went on elsewhere)
    import mlflow

    from rlrun import PPOTrainer
    from rlrun.app.tune_trainable import HOLDER_FILE

    monkeypatch.chdir(tmp_path)  # the MLflow store: ./mlflow.db
    cfg = {"env": "CartPole-v1", "train_batch_size": 200, "seed": 1}
    held, taken = PPOTrainer(config=cfg), PPOTrainer(config=cfg)
    try:
        for trainable in (held, taken):
            trainable.train()
        ctx = held.ctx
        assert held.reset_config(dict(cfg)) and held.ctx is ctx  # its own trial again, still its own: it goes on
        with open(Path(taken.ctx.out_dir) / HOLDER_FILE, "a") as f:
            f.write("1-another\n")  # another actor took the trial up since
        ids = {"held": held.ctx.tracker.wait_started(), "taken": taken.ctx.tracker.wait_started()}
        ctx = taken.ctx
        assert taken.reset_config(dict(cfg)) and taken.ctx is not ctx  # not its own now: it starts afresh
    finally:
        for trainable in (held, taken):
            trainable.stop()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {k: client.get_run(v) for k, v in ids.items()}
    assert runs["taken"].info.status == "RUNNING" and "rlrun.stop_reason" not in runs["taken"].data.tags
    assert runs["held"].info.status == "FINISHED" and runs["held"].data.tags["rlrun.stop_reason"] == "stopped by Tune"


def test_a_trials_cpu_share_is_rllibs_num_cpus_for_driver_and_a_bad_one_is_refused_naming_the_key():
    from rlrun import PPOTrainer
    from rlrun.app.rllib_files import translate
    from rlrun.config.typed import ConfigError

    def bundles(config: dict) -> list:
        return PPOTrainer.default_resource_request(config).bundles

    assert bundles({}) == [{"CPU": 1.0}]
    assert bundles({"num_cpus_for_driver": 0.5, "num_workers": 2}) == [{"CPU": 0.5}, {"CPU": 1.0}, {"CPU": 1.0}]
    assert bundles({"num_cpus_for_main_process": 0.25}) == [{"CPU": 0.25}]  # RLlib's newest name
    # each Ray rollout worker's bundle holds the CPUs its actor asks for (RLlib's num_cpus_per_worker, newest name too)
    assert bundles({"num_workers": 2, "num_cpus_per_worker": 0.5}) == [{"CPU": 1.0}, {"CPU": 0.5}, {"CPU": 0.5}]
    assert bundles({"num_env_runners": 1, "num_cpus_per_env_runner": 2}) == [{"CPU": 1.0}, {"CPU": 2.0}]
    assert bundles({"rlrun": {"rollout": {"num_workers": 1, "num_cpus_per_worker": 0.25}}}) == [{"CPU": 1.0},
                                                                                                 {"CPU": 0.25}]
    with pytest.raises(ConfigError, match="config.num_cpus_per_worker: .*got 0"):
        bundles({"num_workers": 1, "num_cpus_per_worker": 0})
    for bad in (0, -1, "half", True, float("inf"), float("nan"), 65):
        with pytest.raises(ConfigError, match=f"config.num_cpus_for_driver: .*got {bad!r}"):
            bundles({"num_cpus_for_driver": bad})
    # outside Tune it means nothing: accepted and listed as ignored, as RLlib's other resource keys are
    tr = translate({"run": "PPO", "env": "CartPole-v1", "config": {"num_cpus_for_driver": 0.5}}, "p")
    assert tr.ignored == ["num_cpus_for_driver"]


@pytest.mark.parametrize("args, line", [
    (["tune.num_samples=0"], "tune.num_samples: expected a whole number >= 1, got 0"),
    (["tune.scheduler=hyperband"], "tune.scheduler: 'hyperband' is not one rlrun has"),
    (["+tune.hyperparam_mutations.algo.lrr=[1.0e-3]"],
     "tune.hyperparam_mutations.algo.lrr: algo.lrr is not a key of the rlrun config (did you mean 'lr'?)"),
    (["tune.hyperparam_mutations.loss.clip_param=[wide]"], "loss.clip_param='wide'"),
    (["+tune.workers=2"], "tune.workers: not a tune key"),
    (["+tune.param_space.algo.gamma={uniform: [0.999, 0.9]}"],
     "tune.param_space.algo.gamma: uniform needs [lo, hi] with lo < hi"),
    (["tune.hyperparam_mutations.algo.lr=3"], "tune.hyperparam_mutations.algo.lr: expected a list of values"),
    (["tune.scheduler=asha", "+tune.grace_period=0"], "tune: ASHA needs 0 < grace_period <= max_t"),
    (["+tune.hyperparam_mutations.algo.gamma={grid: [0.9, 0.99]}"],
     "tune.hyperparam_mutations.algo.gamma: grid takes a non-empty list of values, and only in tune.param_space"),
    (["-m", "seed=0,1"], "tune: a Tune population runs without -m"),
    (["tune.synch=sometimes"], "tune.synch: expected true or false, got 'sometimes'"),
    (["tune.time_share=sometimes"], "tune.time_share: expected true or false or null, got 'sometimes'"),
])
def test_a_bad_tune_section_is_one_line_before_ray_starts(tmp_path, args, line):
    p = run_cli(["+experiment=ppo_cartpole", "tune=pbt", *args], tmp_path, timeout=120)
    assert p.returncode == 2, (p.stdout[-2000:], p.stderr[-2000:])
    err = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and line in err[0], p.stderr
    assert not (tmp_path / "mlflow.db").exists()
