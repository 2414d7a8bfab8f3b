"""Wall time of the same 6-job sweep with Hydra's basic launcher (jobs one after another, in this
process) and with `hydra/launcher=ray` (jobs as Ray tasks on a local instance, 2 at a time here),
and whether both leave the same run structure in MLflow (1 parent, 6 FINISHED children).

    python experiments/sweep_launchers/bench.py --repeats 2

Each sweep runs in a fresh launch directory (so both pay for creating the MLflow store). The Ray
sweep runs in a loopback-only network namespace when `unshare` is available (Ray binds every
interface). Writes results/<timestamp>.csv, results/latest.md and results/latest.png.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SWEEP = ["+experiment=ppo_cartpole", "seed=0,1,2", "algo.lr=1e-3,3e-4", "stop.timesteps_total=20000", "progress=false"]
LAUNCHERS = {"basic": [], "ray": ["hydra/launcher=ray"]}


def isolated(argv: list[str]) -> list[str]:
    if shutil.which("unshare") and shutil.which("ip"):
        return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    return argv


def one_sweep(launcher: str) -> dict[str, object]:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory(prefix="rlrun-sweep-bench-") as d:
        cmd = ["rlrun", "-m", *LAUNCHERS[launcher], *SWEEP]
        t0 = time.perf_counter()
        p = subprocess.run(isolated(cmd) if launcher == "ray" else cmd, cwd=d, capture_output=True, text=True,
                           timeout=1800)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"{launcher} sweep failed:\n{p.stderr[-3000:]}")
        client = MlflowClient(tracking_uri=f"sqlite:///{d}/mlflow.db")
        runs = client.search_runs([client.get_experiment_by_name("ppo_cartpole").experiment_id])
        parents = [r for r in runs if r.data.tags.get("rlrun.sweep") == "true"]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
        structure = (f"{len(parents)} parent ({parents[0].info.status if parents else '-'}), {len(children)} children "
                     f"({', '.join(sorted({c.info.status for c in children}))})")
        artifacts = sorted(a.path for a in client.list_artifacts(parents[0].info.run_id)) if parents else []
    return {"launcher": launcher, "wall_s": round(wall, 1), "structure": structure,
            "parent_artifacts": " ".join(artifacts)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for rep in range(args.repeats):
        for launcher in LAUNCHERS:
            r = one_sweep(launcher)
            r["repeat"] = rep
            rows.append(r)
            print(r, flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(out / f"{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = {k: statistics.median(float(r["wall_s"]) for r in rows if r["launcher"] == k) for k in LAUNCHERS}  # type: ignore[arg-type]
    lines = ["| launcher | repeat | wall time (s) | MLflow runs | parent artifacts |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['launcher']} | {r['repeat']} | {r['wall_s']} | {r['structure']} | {r['parent_artifacts']} |"
              for r in rows]
    lines.append(f"\nmedian wall time: basic **{med['basic']:.1f} s**, ray **{med['ray']:.1f} s** "
                 f"(`rlrun -m {' '.join(SWEEP)}`; python {sys.version.split()[0]})")
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, k in enumerate(LAUNCHERS):
        ys = [float(r["wall_s"]) for r in rows if r["launcher"] == k]  # type: ignore[arg-type]
        ax.scatter([i] * len(ys), ys)
        ax.bar(i, med[k], alpha=0.3)
    ax.set_xticks(range(len(LAUNCHERS)), list(LAUNCHERS))
    ax.set_ylabel("sweep wall time (s)")
    ax.set_title("6-job sweep, 20k env steps each (2 cores)")
    fig.tight_layout()
    fig.savefig(out / "latest.png", dpi=100)


if __name__ == "__main__":
    main()
