"""Population-based training from YAML on CartPole: ``rlrun +experiment=ppo_cartpole tune=pbt``, run to
the preset's own stop (return 475 or 150k env steps per trial), its record read back from MLflow.

    python experiments/tune_pbt/run.py --name pbt_2026-11-27 [extra rlrun overrides]

Runs the command in a fresh directory (its own MLflow store, a private local Ray instance), then
writes results/<name>.md (per trial: the values it started with and ended with, its exploits - whose
checkpoint, which MLflow run -, final return, env steps, whether it met 475) and results/<name>.png
(return vs env steps per trial; a marker where it took another trial's checkpoint), and checks that
no process of the run is left once ``rlrun`` has exited.

    python experiments/tune_pbt/run.py --compare tune.reuse_actors=true,false --rounds 3 --name reuse_2026-12-08

runs the command ``--rounds`` times with each of the two values of the key, alternating (the order reversed every
other round), and writes results/<name>.md, .csv and .png: per run the wall time of the whole command, the trial
processes (actors) that took trials up and how often trials were started or resumed (each trial's ``rlrun/actors``
file), the exploits, the trials that met 475, and the trials' MLflow end states.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEYS = ("algo.lr", "loss.clip_param", "seed")


def left_running(marker: str, root: str) -> list[str]:
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if marker in cmd or cwd.startswith(root):
            left.append(f"{pid} {cmd[:120]}")
    return left


def trials(store: Path) -> list[dict[str, object]]:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{store}")
    exp = client.get_experiment_by_name("ppo_cartpole")
    rows = []
    for r in client.search_runs([exp.experiment_id], order_by=["tags.mlflow.runName"]):
        tags = r.data.tags
        curve = [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "rollout/episode_return_mean")]
        hparams = {k: client.get_metric_history(r.info.run_id, f"hparams/{k}") for k in KEYS}
        exploits = [tags[k] for k in sorted(tags) if k.startswith("rlrun.tune.exploit.")]
        # where it took another trial's checkpoint (the metric tune/exploits, at the restored env step)
        marks = [m.step for m in client.get_metric_history(r.info.run_id, "tune/exploits")]
        rows.append({
            "trial": tags.get("rlrun.tune.trial_id"), "run": r.info.run_id[:8], "status": r.info.status,
            "start": ", ".join(f"{k}={r.data.params.get(k)}" for k in KEYS),
            "end": ", ".join(f"{k}={hparams[k][-1].value:g}" for k in KEYS if hparams[k]),
            "exploits": len(exploits), "exploit_notes": exploits,
            "return": curve[-1][1] if curve else float("nan"), "env_steps": curve[-1][0] if curve else 0,
            "met": tags.get("rlrun.target_met"), "curve": curve, "marks": marks,
        })
    return rows


def run_once(cmd: list[str], timeout: float) -> dict[str, object]:
    """``cmd`` in a fresh directory: exit status, wall time, its ``rlrun`` lines, processes left, the trials'
    MLflow records, and the actors (processes) that took trials up."""
    with tempfile.TemporaryDirectory(prefix="rlrun-pbt-") as tmp:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log, _ = proc.communicate(timeout=timeout)
        wall = time.perf_counter() - t0
        holders = [ln for f in Path(tmp).glob("outputs/*/*/tune/*/*/rlrun/actors") for ln in f.read_text().split()]
        return {"rc": proc.returncode, "wall": wall, "left": left_running(f"rlrun-ray-{proc.pid}-", tmp),
                "log": "\n".join(ln for ln in log.splitlines() if ln.startswith("rlrun")),
                "rows": trials(Path(tmp) / "mlflow.db"), "takeups": len(holders), "actors": len(set(holders))}


def compare(args: argparse.Namespace, out: Path) -> None:
    import statistics

    key, values = args.compare.split("=", 1)
    a, b = values.split(",")
    runs = []
    for i in range(args.rounds):
        for value in (a, b) if i % 2 == 0 else (b, a):
            cmd = ["rlrun", "+experiment=ppo_cartpole", "tune=pbt", "progress=false", *args.overrides, f"{key}={value}"]
            r = run_once(cmd, args.timeout)
            rows = r["rows"]
            runs.append({"round": i + 1, key: value, "exit": r["rc"], "wall_s": round(r["wall"], 1),
                         "actors": r["actors"], "take_ups": r["takeups"],
                         "exploits": sum(row["exploits"] for row in rows),
                         "statuses": " ".join(sorted(str(row["status"]) for row in rows)),
                         "met_475": sum(row["met"] == "true" for row in rows), "left": len(r["left"])})
            print(runs[-1], flush=True)
    keys = list(runs[0])
    with open(out / f"{args.name}.csv", "w") as f:
        f.write(",".join(keys) + "\n" + "".join(",".join(str(r[k]) for k in keys) + "\n" for r in runs))
    med = {v: statistics.median(float(r["wall_s"]) for r in runs if r[key] == v) for v in (a, b)}
    lines = [f"# {args.name}: `rlrun +experiment=ppo_cartpole tune=pbt progress=false {' '.join(args.overrides)} "
             f"{key}={a}|{b}`", "", "| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in runs]
    lines += ["", f"Median wall time: {key}={a} {med[a]:.1f} s, {key}={b} {med[b]:.1f} s: **{med[a] / med[b]:.2f}x**"]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for value, color in ((a, "tab:blue"), (b, "tab:orange")):
        pts = [(r["round"], r["wall_s"]) for r in runs if r[key] == value]
        ax.plot(*zip(*pts, strict=True), "o-", color=color, label=f"{key}={value}")
    ax.set_xlabel("round")
    ax.set_ylabel("wall time of the whole population (s)")
    ax.set_title(f"PBT, 4 trials of ppo_cartpole: {key}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=110)
    bad = [r for r in runs if r["exit"] != 0 or r["left"] or set(str(r["statuses"]).split()) != {"FINISHED"}]
    sys.exit(1 if bad else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="latest")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--compare", help="KEY=A,B: the command with KEY=A and KEY=B, --rounds times each")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    if args.compare:
        compare(args, out)
        return
    cmd = ["rlrun", "+experiment=ppo_cartpole", "tune=pbt", "progress=false", *args.overrides]
    r = run_once(cmd, args.timeout)
    (out / f"{args.name}.log").write_text(str(r["log"]))
    rc, wall, left, rows = r["rc"], r["wall"], r["left"], r["rows"]
    lines = [f"# {args.name}: `{' '.join(cmd)}`", "",
             f"exit status {rc}, wall time {wall:.0f} s, processes left after exit: {len(left)}", "",
             "| trial | MLflow run | status | started with | ended with | exploits | final return | env steps | "
             "met 475 |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['trial']} | {r['run']} | {r['status']} | {r['start']} | {r['end']} | {r['exploits']} | "
                     f"{r['return']:.1f} | {r['env_steps']:,} | {r['met']} |")
    lines += ["", "Exploits (MLflow tags `rlrun.tune.exploit.<n>`):", ""]
    lines += [f"- {r['trial']}: {note}" for r in rows for note in r["exploit_notes"]]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        xs, ys = [s for s, _ in r["curve"]], [v for _, v in r["curve"]]
        (line,) = ax.plot(xs, ys, label=f"trial {r['trial']} ({r['exploits']} exploits)", lw=1)
        for step in r["marks"]:
            y = next((v for s, v in r["curve"] if s >= step), None)
            if y is not None:
                ax.plot([step], [y], "o", color=line.get_color(), ms=5)
    ax.axhline(475, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("env steps (a trial's own; an exploit continues from the source's)")
    ax.set_ylabel("episode return (mean of last 100)")
    ax.set_title("PBT, 4 trials: rlrun +experiment=ppo_cartpole tune=pbt (o: took another's checkpoint)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=110)
    sys.exit(0 if rc == 0 and not left else 1)


if __name__ == "__main__":
    main()
