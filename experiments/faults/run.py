"""Fault trials: concurrent runs in one directory, SIGTERM and process-group SIGKILL at random moments.

Each trial runs the real CLI in a fresh temporary directory and checks the MLflow store afterwards:

- concurrent_fresh / concurrent_existing: 3 runs started together (on a fresh store / one that
  exists); all must exit 0 and be FINISHED, each with its own config (seed) and its own checkpoint
  (meta.json names that run), and the store must still answer.
- sigterm: SIGTERM after a random 3-9 s; exit 143 and a final checkpoint; then ``resume=latest``.
- group_kill: SIGKILL to the trainer's whole process group a random 0-6 s after its first periodic
  checkpoint (before it there is nothing to resume), and to its MLflow writer too (the worst case:
  nothing confirmed what it had not written); then ``resume=latest``.
  For both kill trials: one MLflow run, FINISHED, steps unique and increasing, and every iteration
  the resumed checkpoint covers present in the metric history; no run left RUNNING.

    python experiments/faults/run.py --repeats 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
COVERED: list[int] = []  # iterations the resumed checkpoint covered, per kill trial
LONG = ["algo=ppo", "stop.timesteps_total=3000000", "checkpoint.every_n_iters=10", "progress=false"]


def cli(args: list[str], cwd: Path, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "rlrun", *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def runs(d: Path, experiment: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{d / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return list(client.search_runs([exp.experiment_id])) if exp else []


def concurrent(d: Path, existing: bool) -> str | None:
    from mlflow.tracking import MlflowClient

    if existing and cli(["+experiment=ppo_cartpole", "stop.timesteps_total=1000", "progress=false"], d).wait():
        return "could not create the store"
    procs = {s: cli(["+experiment=ppo_cartpole", "stop.timesteps_total=5000", f"seed={s}", "progress=false"], d)
             for s in (10, 11, 12)}
    codes = {s: p.wait() for s, p in procs.items()}
    if any(codes.values()):
        worst = procs[max(codes, key=lambda s: codes[s])]
        return f"exit codes {codes}: {worst.stderr.read()[-300:] if worst.stderr else ''}"
    client = MlflowClient(f"sqlite:///{d / 'mlflow.db'}")
    mine = [r for r in runs(d, "ppo_cartpole") if r.data.params["seed"] in ("10", "11", "12")]
    if sorted(r.data.params["seed"] for r in mine) != ["10", "11", "12"]:
        return f"runs recorded: {[r.data.params.get('seed') for r in mine]}"
    for r in mine:
        rid, seed = r.info.run_id, r.data.params["seed"]
        if r.info.status != "FINISHED":
            return f"seed {seed}: {r.info.status}"
        local = Path(client.download_artifacts(rid, "config.yaml", str(d / f"dl-{seed}")))
        if f"seed: {seed}\n" not in local.read_text():
            return f"seed {seed}: its config.yaml is another run's"
        ckpts = [a.path for a in client.list_artifacts(rid, "checkpoints")]
        meta = json.loads(Path(client.download_artifacts(rid, f"{ckpts[-1]}/meta.json", str(d / f"m-{seed}")))
                          .read_text())
        if meta["mlflow_run_id"] != rid:
            return f"seed {seed}: its checkpoint belongs to run {meta['mlflow_run_id']}"
    return None


def killed_then_resumed(d: Path, kill: Callable[[subprocess.Popen[str]], None], expect_code: int | None,
                        after_checkpoint: bool) -> str | None:
    p = cli(LONG, d, start_new_session=True)
    if after_checkpoint:  # a kill before the first checkpoint has nothing to resume: wait for one, then a while
        deadline = time.monotonic() + 120
        while not list(d.glob("outputs/*/*/checkpoints/iter_*/meta.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(random.uniform(0.0, 6.0))
    else:
        time.sleep(random.uniform(3.0, 9.0))
    kill(p)
    code = p.wait()
    if expect_code is not None and code != expect_code:
        return f"exit {code}, expected {expect_code}: {p.stderr.read()[-300:]}"
    ckpts = sorted(d.glob("outputs/*/*/checkpoints/iter_*/history.jsonl"))
    if not ckpts:
        return "no checkpoint to resume"
    covered = {int(json.loads(line)["_step"]) for line in ckpts[-1].read_text().splitlines()}
    COVERED.append(len(covered))
    # one more iteration (counters come back from the checkpoint, so training_iteration=1 is met at once)
    r = cli(["algo=ppo", "stop.timesteps_total=null", "stop.training_iteration=1", "checkpoint.every_n_iters=10",
             "progress=false", "resume=latest"], d)
    r_code = r.wait()
    if r_code != 0:
        return f"resume exit {r_code}: {r.stderr.read()[-300:]}"
    from mlflow.tracking import MlflowClient

    all_runs = runs(d, "Default")
    if len(all_runs) != 1 or all_runs[0].info.status != "FINISHED":
        return f"runs after resume: {[(r.info.run_id, r.info.status) for r in all_runs]}"
    client = MlflowClient(f"sqlite:///{d / 'mlflow.db'}")
    steps = [m.step for m in client.get_metric_history(all_runs[0].info.run_id, "timesteps_total")]
    if steps != sorted(set(steps)):
        return "metric history has repeated or unordered steps"
    missing = covered - set(steps)
    return f"{len(missing)} checkpointed iterations missing from MLflow" if missing else None


def sigterm(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGTERM)


def group_kill(p: subprocess.Popen[str]) -> None:
    writers = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "rlrun.tracking.writer"], capture_output=True, text=True)
    os.killpg(p.pid, signal.SIGKILL)
    for pid in writers.stdout.split():
        os.kill(int(pid), signal.SIGKILL)  # the writer too: nothing it had not written is confirmed


TRIALS: dict[str, Callable[[Path], str | None]] = {
    "concurrent_fresh": lambda d: concurrent(d, existing=False),
    "concurrent_existing": lambda d: concurrent(d, existing=True),
    "sigterm": lambda d: killed_then_resumed(d, sigterm, 143, after_checkpoint=False),
    "group_kill": lambda d: killed_then_resumed(d, group_kill, -signal.SIGKILL, after_checkpoint=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--trials", nargs="+", default=list(TRIALS), choices=list(TRIALS))
    args = ap.parse_args()
    random.seed(0)
    results: dict[str, list[str | None]] = {t: [] for t in args.trials}
    covered: dict[str, list[int]] = {t: [] for t in args.trials}
    for rep in range(args.repeats):
        for name in args.trials:
            with tempfile.TemporaryDirectory(prefix="rlrun-faults-") as d:
                t0 = time.perf_counter()
                COVERED.clear()
                problem = TRIALS[name](Path(d))
                results[name].append(problem)
                covered[name] += COVERED
                print(f"{name} #{rep}: {'ok' if problem is None else problem} ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
    lines = ["| trial | passed | iterations covered by the resumed checkpoint (min-max) | problems |",
             "| --- | --- | --- | --- |"]
    for name, res in results.items():
        bad = sorted({p for p in res if p})
        cov = f"{min(covered[name])}-{max(covered[name])}" if covered[name] else "-"
        lines.append(f"| {name} | {sum(p is None for p in res)} of {len(res)} | {cov} | {'; '.join(bad) or '-'} |")
    lines.append(f"\n{time.strftime('%Y-%m-%d')}, {args.repeats} repeats, python {sys.version.split()[0]}")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "latest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
