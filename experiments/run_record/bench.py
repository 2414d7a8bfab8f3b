"""What does a run's provenance record cost (issue 38: under 50 ms per run)?

Two measurements, same session:

1. In process, the record's own work as the runner does it (``git_state`` + ``write_record``: one
   ``git status``, the patch when dirty, the ``*.dist-info`` scan, plugin sources, the files written),
   median of ``--reps`` calls, in a clean git tree, a dirty one (a plugin with an uncommitted change),
   and outside git; beside it the one ``git rev-parse`` the runner made before.
2. Whole process: ``rlrun +experiment=ppo_cartpole stop.training_iteration=1`` in a dirty git tree,
   ``--runs`` runs each of this checkout and of ``--before`` (the commit before the record; checked out
   in a temporary git worktree), interleaved; medians.

Writes results/<name>.md, .csv and .png.

    python experiments/run_record/bench.py --before f360702 --runs 5 --reps 30 --name 2026-11-27
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from rlrun.core.provenance import git_sha, git_state, write_record  # noqa: E402


def _git(d: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=b@example.com", "-c", "user.name=b", *args], cwd=d, check=True,
                   capture_output=True)


def _launch_dir(root: Path, dirty: bool, git: bool = True) -> Path:
    d = root / f"launch-{'git' if git else 'plain'}-{'dirty' if dirty else 'clean'}"
    d.mkdir()
    (d / "my_plugin.py").write_text("# a plugin\nSCALE = 1\n" + "# padding\n" * 500)
    if git:
        (d / ".gitignore").write_text("mlflow.db*\nmlartifacts/\noutputs/\nrecord-*/\n")
        _git(d, "init", "-q")
        _git(d, "add", ".")
        _git(d, "commit", "-qm", "first")
        if dirty:
            (d / "my_plugin.py").write_text("# a plugin\nSCALE = 2\n" + "# padding\n" * 500)
    return d


def in_process(root: Path, reps: int) -> list[dict[str, object]]:
    rows = []
    for label, d in (("clean git tree", _launch_dir(root, False)), ("dirty git tree", _launch_dir(root, True)),
                     ("not a git tree", _launch_dir(root, False, git=False))):
        os.chdir(d)
        sys.path.insert(0, str(d))
        import importlib

        importlib.import_module("my_plugin")
        record, before = [], []
        for i in range(reps):
            t = time.perf_counter()
            write_record(d / f"record-{i}", git_state(d), ["my_plugin"])
            record.append(time.perf_counter() - t)
            t = time.perf_counter()
            git_sha(d)
            before.append(time.perf_counter() - t)
        sys.modules.pop("my_plugin", None)
        sys.path.remove(str(d))
        for what, ts in ((f"record ({label})", record), (f"before: git rev-parse ({label})", before)):
            rows.append({"what": what, "median_ms": round(1000 * statistics.median(ts), 1),
                         "min_ms": round(1000 * min(ts), 1), "max_ms": round(1000 * max(ts), 1), "n": reps})
    os.chdir(REPO)
    return rows


def whole_process(root: Path, before: str, runs: int) -> list[dict[str, object]]:
    tree = root / "before"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), before], cwd=REPO, check=True)
    try:
        times: dict[str, list[float]] = {"this checkout": [], f"before ({before})": []}
        for i in range(runs):
            for label, code in ((f"before ({before})", tree), ("this checkout", REPO)):
                d = root / f"run-{i}-{'b' if code == tree else 'a'}"  # a fresh copy of the dirty tree each run
                shutil.copytree(root / "launch-git-dirty", d, ignore=shutil.ignore_patterns("record-*"))
                t = time.perf_counter()
                p = subprocess.run([sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole",
                                    "stop.training_iteration=1", "progress=false", "plugins=[my_plugin]"], cwd=d,
                                   capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(code)})
                times[label].append(time.perf_counter() - t)
                if p.returncode != 0:
                    raise SystemExit(f"{label}: rlrun failed: {p.stderr[-2000:]}")
        return [{"what": f"whole process, {label}", "median_ms": round(1000 * statistics.median(ts)),
                 "min_ms": round(1000 * min(ts)), "max_ms": round(1000 * max(ts)), "n": runs}
                for label, ts in times.items()]
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the commit before the provenance record")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--name", default="latest")
    args = ap.parse_args()
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlrun-record-bench-") as tmp:  # outside any git tree
        rows = in_process(Path(tmp), args.reps) + whole_process(Path(tmp), args.before, args.runs)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    lines = ["| what | median ms | min ms | max ms | n |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['what']} | {r['median_ms']} | {r['min_ms']} | {r['max_ms']} | {r['n']} |" for r in rows]
    lines.append(f"\n{time.strftime('%Y-%m-%d %H:%M')}, commit {head.strip()}, Python {sys.version.split()[0]}")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    small = [r for r in rows if not str(r["what"]).startswith("whole")]
    a.barh([str(r["what"]) for r in small], [float(r["median_ms"]) for r in small])  # type: ignore[arg-type]
    a.set_xlabel("ms (median)")
    a.set_title("the record's own work")
    whole = [r for r in rows if str(r["what"]).startswith("whole")]
    b.barh([str(r["what"]) for r in whole], [float(r["median_ms"]) / 1000 for r in whole])  # type: ignore[arg-type]
    b.set_xlabel("s (median)")
    b.set_title("rlrun ppo_cartpole, 1 iteration")
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=90)


if __name__ == "__main__":
    main()
