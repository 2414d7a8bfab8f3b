"""Does memory stay flat over a long run? PPO on 2 Ray workers and DQN with a full replay buffer, side by side.

Starts two real `rlrun` runs in fresh launch directories, each stopped by `time_total_s`:

* ``ppo``: ``+experiment=ppo_cartpole rollout=ray`` (2 Ray rollout workers), return target off;
* ``dqn``: ``+experiment=dqn_cartpole`` (its 100k-row replay buffer is full after ~100k env steps),
  return target off;

and every ``--interval`` seconds samples, for every process each run started (found by a marker in
their environment: trainer, MLflow writer, Ray workers and Ray's own processes), its resident memory
(VmRSS), open file descriptors and threads, and the size of each run's MLflow store. Growth is
measured from ``--warmup`` minutes on (allocator pools, caches and the replay buffer fill up first).

Writes results/<timestamp>.csv, results/latest.md and results/latest.png.

    python experiments/soak/run.py --minutes 30 --interval 30 --warmup 5
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNS = {"ppo": ["+experiment=ppo_cartpole", "rollout=ray"], "dqn": ["+experiment=dqn_cartpole"]}
NO_TARGET = "rollout/episode_return_mean: 1e9, timesteps_total: 1e12"  # only the clock stops the runs


def role(pid: int, trainer: int) -> str:
    """What a process is: the trainer, its MLflow writer, a Ray rollout worker, or Ray's own."""
    if pid == trainer:
        return "trainer"
    try:
        cmd = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        return "gone"
    if "rlrun.tracking.writer" in cmd:
        return "writer"
    if "RolloutWorker" in cmd or "ray::" in cmd:
        return "ray worker"
    return "ray " + Path(cmd.split(" ", 1)[0]).name if cmd else "other"


def sample(pid: int) -> tuple[int, int, int] | None:
    """(RSS kB, open fds, threads) of a live process, else None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), fds, int(fields["Threads"])


def marked(marker: bytes) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "environ").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def soak(minutes: float, interval: float, runs: dict[str, list[str]] = RUNS) -> list[dict[str, object]]:
    """Run ``runs`` side by side for ``minutes``; the samples, one row per (time, run, process)."""
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="rlrun-soak-") as base:
        procs: dict[str, tuple[subprocess.Popen[bytes], bytes, Path]] = {}
        for name, args in runs.items():
            d = Path(base) / name
            d.mkdir()
            token = uuid.uuid4().hex
            env = {**os.environ, "PYTHONPATH": str(REPO), "RLRUN_SOAK": token}
            log = open(d / "rlrun.log", "wb")  # noqa: SIM115  (closed with the process)
            stop = f"++stop={{{NO_TARGET}, time_total_s: {minutes * 60}}}"
            p = subprocess.Popen([sys.executable, "-m", "rlrun", *args, stop],
                                 cwd=d, stdout=log, stderr=subprocess.STDOUT, env=env)
            log.close()
            procs[name] = (p, f"RLRUN_SOAK={token}".encode(), d)
        t0 = time.monotonic()
        while any(p.poll() is None for p, _, _ in procs.values()):
            t = round((time.monotonic() - t0) / 60, 2)
            for name, (p, marker, d) in procs.items():
                db = d / "mlflow.db"
                for pid in marked(marker):
                    s = sample(pid)
                    if s is not None:
                        rows.append({"minute": t, "run": name, "role": role(pid, p.pid), "pid": pid, "rss_kb": s[0],
                                     "fds": s[1], "threads": s[2],
                                     "db_kb": db.stat().st_size // 1024 if db.exists() else 0})
            time.sleep(interval)
        for name, (p, _, d) in procs.items():
            if p.returncode != 0:
                raise SystemExit(f"{name} failed ({p.returncode}):\n{(d / 'rlrun.log').read_text()[-3000:]}")
    return rows


def growth(rows: list[dict[str, object]], warmup: float) -> list[dict[str, object]]:
    """Per (run, role, pid): RSS, fds and threads at the end of the warm-up and at the end, and the
    RSS growth in between (%)."""
    out = []
    keys = sorted({(str(r["run"]), str(r["role"]), int(r["pid"])) for r in rows})  # type: ignore[call-overload]
    for run, rl, pid in keys:
        rs = [r for r in rows if r["run"] == run and r["pid"] == pid and float(r["minute"]) >= warmup]  # type: ignore[arg-type]
        if len(rs) < 2:
            continue
        first, last = rs[0], rs[-1]
        peak_late = max(int(r["rss_kb"]) for r in rs[len(rs) // 2:])  # type: ignore[call-overload]
        out.append({"run": run, "role": rl, "pid": pid, "from_min": first["minute"], "to_min": last["minute"],
                    "rss_mb_from": round(int(first["rss_kb"]) / 1024, 1),  # type: ignore[call-overload]
                    "rss_mb_to": round(int(last["rss_kb"]) / 1024, 1),  # type: ignore[call-overload]
                    "rss_growth_pct": round(100 * (int(last["rss_kb"]) - int(first["rss_kb"]))  # type: ignore[call-overload]
                                            / int(first["rss_kb"]), 2),  # type: ignore[call-overload]
                    "rss_mb_peak_second_half": round(peak_late / 1024, 1),
                    "fds": f"{first['fds']} -> {last['fds']}", "threads": f"{first['threads']} -> {last['threads']}"})
    return out


def write(rows: list[dict[str, object]], table: list[dict[str, object]], minutes: float, warmup: float,
          out: Path = HERE / "results") -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(out / f"{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    db = {run: max(int(r["db_kb"]) for r in rows if r["run"] == run) for run in {str(r["run"]) for r in rows}}  # type: ignore[call-overload]
    lines = [f"# soak ({stamp}): {minutes:g} min, growth from minute {warmup:g}", "",
             f"`python experiments/soak/run.py --minutes {minutes:g} --warmup {warmup:g}`", "",
             "| run | process | pid | RSS MB at warm-up end | RSS MB at end | RSS growth % | peak MB (2nd half) "
             "| fds | threads |", "|---|---|---|---|---|---|---|---|---|"]
    for g in table:
        lines.append(f"| {g['run']} | {g['role']} | {g['pid']} | {g['rss_mb_from']} | {g['rss_mb_to']} | "
                     f"{g['rss_growth_pct']:+.2f} | {g['rss_mb_peak_second_half']} | {g['fds']} | {g['threads']} |")
    lines += ["", "MLflow store size at the end: " + ", ".join(f"{k} {v / 1024:.1f} MB" for k, v in sorted(db.items()))]
    worst = max((abs(float(g["rss_growth_pct"])) for g in table), default=float("nan"))  # type: ignore[arg-type]
    lines += ["", f"Largest RSS change of any process after the warm-up: {worst:.2f} %."]
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run, rl, pid in sorted({(str(r["run"]), str(r["role"]), int(r["pid"])) for r in rows}):  # type: ignore[call-overload]
        rs = [r for r in rows if r["pid"] == pid and r["run"] == run]
        if rl.startswith("ray ") and rl != "ray worker":
            continue  # Ray's own processes: in the table
        ax.plot([float(r["minute"]) for r in rs], [int(r["rss_kb"]) / 1024 for r in rs],  # type: ignore[call-overload]
                label=f"{run} {rl} {pid}")
    ax.axvline(warmup, color="grey", ls=":")
    ax.set_xlabel("minute")
    ax.set_ylabel("RSS (MB)")
    ax.set_title("rlrun soak: resident memory per process")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latest.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--interval", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--results", type=Path, default=HERE / "results", help="where the table, csv and plot go")
    args = ap.parse_args()
    rows = soak(args.minutes, args.interval, {k: RUNS[k] for k in args.runs})
    table = growth(rows, args.warmup)
    write(rows, table, args.minutes, args.warmup, args.results)
    print("median RSS growth %:", statistics.median(float(g["rss_growth_pct"]) for g in table))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
