"""The soak benchmark (experiments/soak) shortened to a test: PPO on 2 Ray workers, its MLflow writer
recording every iteration (~20 a second), ~75 s. Once the run has warmed up, no process of its own
(trainer, writer, rollout workers) grows by more than its bound, none holds more open files, and
neither the trainer nor the writer starts a thread. The window is set in the run's training time
(``time_total_s`` in its ``metrics.jsonl``), not in seconds since the launch: beside other tests the
start (imports, Ray) once took over 30 s, and a window counted from the launch then held the first
iterations (the trainer's one-time +14 MB, 3 files and a thread; CI, 2026-11-28). Before the metric
history went to a file (2026-11-26) the trainer grew ~7 MB a minute here: +1.7 % measured over a 52 s
window, so ~+1.1 % over today's 36 s one (its bound is 0.8 %); since then -0.01 to +0.24 % was
measured. Ray's own processes are measured by the benchmark: in a run this short its GCS is still
filling its store of task events (capped: rlrun/sources/ray_instance.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, isolated, rlrun_cmd

pytestmark = [pytest.mark.slow, pytest.mark.ray]

RUN_S = 72  # training time (stop.time_total_s)
WINDOW = (16, 52)  # seconds of training time: warmed up, and not yet ending the run
LAUNCH_S = 420  # wall-clock seconds the run may take to reach the window's end
BOUND = {"trainer": 0.8, "writer": 2.0, "rollout worker": 2.0}  # % of RSS at the window's start


def _ours(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("RLRUN_SOAK_TEST") == marker:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def _role(p: psutil.Process, trainer_pid: int) -> str:
    if p.pid == trainer_pid:
        return "trainer"
    cmd = " ".join(p.cmdline())
    if "rlrun.tracking.writer" in cmd:
        return "writer"
    return "rollout worker" if "RolloutWorker" in cmd else "ray"


def _training_s(cwd: Path) -> float:
    """The run's training time so far: ``time_total_s`` of the last line its history holds (0 before)."""
    for path in cwd.glob("outputs/*/*/metrics.jsonl"):
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 8192))
            lines = f.read().splitlines()
        for line in reversed(lines):
            try:
                return float(json.loads(line)["time_total_s"])
            except (ValueError, KeyError):
                continue  # the tail's first line, cut by the seek
    return 0.0


def test_a_long_ppo_run_on_ray_workers_holds_its_memory_flat(tmp_path):
    marker = uuid.uuid4().hex
    no_target = f"++stop={{rollout/episode_return_mean: 1e9, timesteps_total: 1e12, time_total_s: {RUN_S}}}"
    proc = subprocess.Popen(isolated(rlrun_cmd("+experiment=ppo_cartpole", "rollout=ray", "progress=false", no_target)),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "RLRUN_SOAK_TEST": marker})
    t0 = time.monotonic()
    seen: dict[int, tuple[str, list[tuple[int, int, int]]]] = {}  # pid: (role, [(rss, fds, threads)])
    try:
        while (t := _training_s(tmp_path)) < WINDOW[1] and proc.poll() is None:
            assert time.monotonic() - t0 < LAUNCH_S, f"{LAUNCH_S} s after the launch the run had trained {t:.0f} s"
            for p in _ours(marker):
                try:
                    with p.oneshot():
                        s = (p.memory_info().rss, p.num_fds(), p.num_threads())
                        role = _role(p, proc.pid)
                except psutil.Error:
                    continue
                if t >= WINDOW[0]:
                    # a Ray worker process names itself after its actor only once the actor is placed
                    # (``ray::IDLE`` before, ``ray::RolloutWorker...`` after): a pid seen once as a rollout
                    # worker is one, whatever an earlier sample of it read
                    first, samples = seen.get(p.pid, (role, []))
                    seen[p.pid] = ("rollout worker" if "rollout worker" in (first, role) else first, [*samples, s])
            time.sleep(3)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    roles = sorted(r for r, samples in seen.values() if len(samples) >= 8)
    census = {pid: (role, len(samples)) for pid, (role, samples) in seen.items()}
    assert roles.count("trainer") == 1 and roles.count("writer") == 1 and roles.count("rollout worker") == 2, census
    report = []
    for pid, (role, samples) in sorted(seen.items()):
        if role not in BOUND or len(samples) < 8:
            continue
        rss0, rss1 = samples[0][0], samples[-1][0]
        # a file or thread open for a moment at one sample (the writer uploading a checkpoint, SQLite's
        # journal) is no leak: one that leaks is still open at each of the last samples
        fds0, fds1 = max(s[1] for s in samples[:3]), min(s[1] for s in samples[-3:])
        threads0, threads1 = max(s[2] for s in samples[:3]), min(s[2] for s in samples[-3:])
        growth = 100 * (rss1 - rss0) / rss0
        report.append(f"{role} {pid}: {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MB ({growth:+.2f} %), "
                      f"fds {fds0} -> {fds1}, threads {threads0} -> {threads1}")
        assert growth < BOUND[role] and fds1 <= fds0, "\n".join(report)
        # a Ray worker's thread pools (gRPC) start threads as it runs; ours start none after the start
        assert role == "rollout worker" or threads1 <= threads0, "\n".join(report)
    print("\n".join(report))
