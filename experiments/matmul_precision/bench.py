"""What ``torch_matmul_precision: medium`` buys: the learner's time per env step with float32 matmuls and
convolutions computed in float32 (``highest``, the default) and in bfloat16 where the CPU has it
(``medium``: torch.set_float32_matmul_precision), on presets whose learner is most of the run.

Each figure is one ``rlrun +experiment=<preset> <overrides>`` process as a user runs it (short runs, no
MLflow record: ``tracking=none``); the learner's seconds (``time/learn_s``) are summed over the iterations
that trained and divided by their env steps. Precisions alternate, --repeats processes each; medians.
Writes results/<name>.md, .csv and .png.

    python experiments/matmul_precision/bench.py --repeats 3 --name matmul_precision_2026-11-28
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PRECISIONS = ("highest", "medium")
# preset -> overrides for a short run whose iterations after the first few all train
CASES = {
    "ppo_breakout": ["stop.timesteps_total=8192"],
    "dqn_breakout": ["algo.learning_starts=1000", "stop.timesteps_total=3000"],
    "sac_halfcheetah": ["algo.learning_starts=1024", "stop.timesteps_total=4096", "evaluation.interval=0"],
    "dqn_cartpole": ["stop={timesteps_total: 12800}"],
}


def processor() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def one(preset: str, precision: str) -> dict[str, float]:
    """One run: the learner's ms per 1,000 env steps over the iterations that trained, and wall time."""
    with tempfile.TemporaryDirectory(prefix="rlrun-prec-") as d:
        cmd = [sys.executable, "-m", "rlrun", f"+experiment={preset}", *CASES[preset], "seed=0", "tracking=none",
               "progress=false", f"torch_matmul_precision={precision}", f"output_dir={d}/out"]
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env={**os.environ, "TMPDIR": d})
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(f"{preset} ({precision}) failed:\n{p.stderr[-3000:]}")
        rows = [json.loads(x) for x in (Path(d) / "out" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    trained = [r for r in rows if r.get("train/num_sgd_steps", 0) > 0][1:]  # the first one warms up
    steps = sum(r["rollout/env_steps_this_iter"] for r in trained)
    learn = sum(r["time/learn_s"] for r in trained)
    return {"learn_ms_per_1k": 1000 * learn / steps * 1000, "wall_s": wall, "env_steps": float(steps)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--presets", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--name", default="latest")
    args = ap.parse_args()
    rows = []
    for preset in args.presets:
        for r in range(args.repeats):
            for precision in PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]:
                got = one(preset, precision)
                rows.append({"preset": preset, "precision": precision, "repeat": r, **got})
                print(rows[-1], flush=True)
    write(rows, args)


def write(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med: dict[tuple[str, str], float] = {}
    lines = [f"# float32 matmul precision: the learner's time, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/matmul_precision/bench.py --repeats {args.repeats} --name {args.name}` on "
             f"{processor()} ({os.cpu_count()} cores); the presets' own torch_threads; medians of "
             f"{args.repeats} processes.", "",
             "| preset | precision | learner ms per 1k env steps (median) | runs | / highest |",
             "| --- | --- | --- | --- | --- |"]
    for preset in args.presets:
        for precision in PRECISIONS:
            vals = [float(r["learn_ms_per_1k"]) for r in rows if r["preset"] == preset and r["precision"] == precision]  # type: ignore[arg-type]
            med[preset, precision] = statistics.median(vals)
            ratio = med[preset, precision] / med[preset, "highest"]
            lines.append(f"| {preset} | {precision} | {med[preset, precision]:,.0f} | "
                         f"{' / '.join(f'{v:,.0f}' for v in vals)} | {ratio:.2f} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(args.presets))
    for i, precision in enumerate(PRECISIONS):
        ax.bar([x + 0.4 * i for x in xs], [med[p, precision] / med[p, "highest"] for p in args.presets], 0.4,
               label=precision)
    ax.set_xticks([x + 0.2 for x in xs], args.presets)
    ax.set_ylabel("learner time / highest's")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=120)


if __name__ == "__main__":
    main()
