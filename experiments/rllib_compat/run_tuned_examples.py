"""Run RLlib's tuned-example YAML files unmodified with ``rlrun-rllib train -f`` over several seeds:
does each meet its own ``stop`` reward within its own ``timesteps_total``?

RLlib's files are not part of rlrun: point this at them (a Ray checkout's ``rllib/tuned_examples``).

    python experiments/rllib_compat/run_tuned_examples.py RAY/rllib/tuned_examples/ppo/cartpole-ppo.yaml \\
        RAY/rllib/tuned_examples/dqn/cartpole-dqn.yaml --seeds 0 1 2 --name tuned_2026-11-27

Each run is ``rlrun-rllib train -f FILE seed=<s>`` (the seed is the one override; an RLlib ``seed`` in the
file is replaced), its record read back from the MLflow store in a fresh directory. Writes
results/<name>.md (file, seed, met, env steps at the stop, return, wall time) and results/<name>.csv.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def one_run(path: Path, seed: int, timeout: float) -> dict[str, object]:
    spec = next(iter(yaml.safe_load(path.read_text()).values()))
    with tempfile.TemporaryDirectory(prefix="rlrun-tuned-") as tmp:
        t0 = time.perf_counter()
        p = subprocess.run(["rlrun-rllib", "train", "-f", str(path), f"seed={seed}"], cwd=tmp, capture_output=True,
                           text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        stopped = next((ln for ln in p.stdout.splitlines() if ln.startswith("rlrun: stopped:")), "")
        final = next((ln for ln in p.stdout.splitlines() if ln.strip().startswith("return")), "")
        steps = next((ln for ln in p.stdout.splitlines() if ln.strip().startswith("env steps")), "")
    return {"file": f"{path.parent.name}/{path.name}", "seed": seed, "rc": p.returncode,
            "met": "target met" in stopped, "stop": spec.get("stop"),
            "env_steps": steps.split()[2].replace(",", "") if steps else "",
            "return": final.split("final")[1].split(",")[0].strip() if "final" in final else "",
            "wall_s": round(wall, 1), "error": "" if p.returncode == 0 else (p.stderr.strip().splitlines() or [""])[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--name", default="latest")
    args = ap.parse_args()
    rows = []
    for f in args.files:
        for s in args.seeds:
            rows.append(one_run(f.resolve(), s, args.timeout))
            print(rows[-1], flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| file | stop (RLlib's) | seeds met | env steps at stop, per seed | return at stop | wall s (median) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for f in dict.fromkeys(r["file"] for r in rows):
        rs = [r for r in rows if r["file"] == f]
        lines.append(f"| `{f}` | {rs[0]['stop']} | {sum(bool(r['met']) for r in rs)} of {len(rs)} | "
                     f"{', '.join(str(r['env_steps']) or r['error'] for r in rs)} | "
                     f"{', '.join(str(r['return']) for r in rs)} | "
                     f"{statistics.median(float(str(r['wall_s'])) for r in rs):.0f} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if all(r["met"] for r in rows) else 1)


if __name__ == "__main__":
    main()
