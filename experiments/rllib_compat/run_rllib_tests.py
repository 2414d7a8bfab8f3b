"""Run RLlib's own unit tests for its classic SampleBatch and MultiAgentBatch against rlrun's batches.

RLlib's test files are not part of rlrun (they are RLlib's): point this script at them in a checkout
of Ray from the classic-stack era (``rllib/policy/tests/test_sample_batch.py`` and
``rllib/policy/tests/test_multi_agent_batch.py``). They run unmodified; ``tests/rllib_names.py`` maps
RLlib's module names onto rlrun (see its docstring for what it maps and to what).

    python experiments/rllib_compat/run_rllib_tests.py RAY/rllib/policy/tests/test_sample_batch.py \\
        RAY/rllib/policy/tests/test_multi_agent_batch.py --name sample_batch_2026-11-27

Writes results/<name>.md: one row per test (passed / failed, and the first line of why), and the
tests the mapping documents as exceptions (they test RLlib internals rlrun does not have).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# tests of RLlib internals rlrun does not have, and why (the table says so beside their outcome)
EXCEPTIONS = {
    "test_dict_properties_of_sample_batches": "RLlib's view-requirement bookkeeping (added_keys/accessed_keys/"
    "deleted_keys), and columns of different lengths in one batch, which rlrun refuses on purpose",
    "test_compression": "RLlib's LZ4 observation compression (compress/decompress_if_needed)",
    "test_shuffle_with_interceptor": "RLlib's get-interceptors (set_get_interceptor)",
    "test_to_device": "RLlib's RepeatedValues and in-batch torch tensors (to_device)",
    "test_interceptors": "RLlib's get-interceptors; the test also raises on a machine without CUDA by design",
}


def run(files: list[Path]) -> list[tuple[str, str, str]]:
    """(test, outcome, first line of the failure) for every test in ``files``."""
    with tempfile.TemporaryDirectory(prefix="rlrun-rllib-tests-") as tmp:
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "rllib_names", "-c", str(Path(tmp) / "none.ini"),
               "--rootdir", tmp, "-p", "no:cacheprovider", "-q",
               "--continue-on-collection-errors", f"--junitxml={report}", *map(str, files)]
        (Path(tmp) / "none.ini").write_text("[pytest]\n")
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
        if not report.exists():
            sys.exit(f"pytest wrote no report:\n{proc.stdout}\n{proc.stderr}")
        out = []
        for case in ET.parse(report).getroot().iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            why = ((bad.get("message") or "").splitlines() or [""])[0][:160] if bad is not None else ""
            out.append((f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}",
                        "passed" if bad is None and case.find("skipped") is None else
                        "skipped" if bad is None else "failed", why))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="RLlib test files (from a Ray checkout)")
    ap.add_argument("--name", default="latest", help="results/<name>.md")
    args = ap.parse_args()
    rows = run([f.resolve() for f in args.files])
    passed = sum(o == "passed" for _, o, _ in rows)
    lines = [f"# RLlib's classic batch tests against rlrun: {passed} of {len(rows)} passed", "",
             "| test | outcome | RLlib internal it tests (exception) | why it failed |", "| --- | --- | --- | --- |"]
    for test, outcome, why in rows:
        name = test.rsplit("::", 1)[-1]
        lines.append(f"| `{test}` | {outcome} | {EXCEPTIONS.get(name, '')} | {re.sub(r'[|]', '/', why)} |")
    out = HERE / "results" / f"{args.name}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
