"""Every command and code block of the README runs here, in README order, in one launch directory (later
blocks use what earlier ones made: runs, checkpoints, a sweep). Commands that would train long get a
small budget appended, the way a user would shorten them; placeholders (``/abs/path``, ``run_id``,
``multirun/<date>/<time>``) are filled in. A block this file does not know how to run fails the test,
so a new README example cannot go untested."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, free_port, isolated, on_ray_cluster

README = (REPO / "README.md").read_text()
BUDGET = "stop.timesteps_total=3072"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang or 'text'}"


def blocks() -> list[Block]:
    out = []
    for m in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```", README, re.S | re.M):
        text = textwrap.dedent("\n".join(ln[len(m[1]):] for ln in m[3].splitlines()))
        out.append(Block(m[2], text, README[: m.start()].count("\n") + 1))
    return out


BLOCKS = blocks()
# yaml: a file the README asks to write (an RLlib experiment file): written as <its first key>.yaml,
# which the bash block after it runs
RUNNABLE = [b for b in BLOCKS if b.lang in ("bash", "python", "console", "yaml")]


def commands(block: Block) -> list[str]:
    """The shell commands of a bash block, trailing comments removed."""
    return [re.sub(r"\s+#\s.*$", "", ln).strip() for ln in block.text.splitlines() if ln.strip()]


def test_ci_runs_the_readme_test_command():
    test_cmd = next(c for b in RUNNABLE for c in commands(b) if "pytest" in c and c.startswith("pip install"))
    assert test_cmd in (REPO / ".ci" / "run").read_text().splitlines()


QUICK_TIER = re.search(r"^python -m pytest (.+?)\s+# the quick tier, for the edit loop: (\d+) tests", README, re.M)


@functools.cache
def collected() -> tuple[int, int]:
    """(tests the README's quick-tier command selects, tests the suite has): one collection serves both
    (pytest prints ``<selected>/<all> tests collected (<n> deselected)``)."""
    assert QUICK_TIER, "the Development section's quick-tier line is gone"
    p = subprocess.run([sys.executable, "-m", "pytest", *shlex.split(QUICK_TIER[1]), "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-n", "0"], cwd=REPO, capture_output=True, text=True, timeout=600)
    m = re.search(r"^(\d+)(?:/(\d+))? tests? collected", p.stdout, flags=re.M)
    assert m, p.stdout[-2000:] + p.stderr[-2000:]
    return int(m[1]), int(m[2] or m[1])


def test_the_readme_says_how_many_tests_the_suite_has():
    said, suite = int(re.search(r"; (\d+) tests today", README)[1]), collected()[1]
    assert said == suite, f"README says {said} tests, the suite has {suite}"


def test_the_readme_quick_tier_count_is_what_pytest_collects():
    said, quick = int(QUICK_TIER[2]), collected()[0]
    assert said == quick, f"README says the quick tier has {said} tests, it has {quick}"


def test_the_readme_bad_input_count_is_the_cases_of_test_bad_input():
    from tests.test_bad_input import CASES  # test_bad_input_gets_one_clear_line runs each case once

    said = int(re.search(r"`tests/test_bad_input.py` runs (\d+) such mistakes", README)[1])
    assert said == len(CASES), f"README says {said} bad-input cases, tests/test_bad_input.py has {len(CASES)}"


DATE = re.compile(r"(?<!\d)20\d\d-[01]\d-[0-3]\d(?!\d)")
# a short SHA: hex of digits and letters, or digits alone right after "commit" or "recorded in"
SHA = re.compile(r"(?<![0-9A-Za-z_])(?:(?=[a-f]*\d)(?=\d*[a-f])[0-9a-f]{7,40}|(?<=commit\s)\d{7,40}"
                 r"|(?<=recorded in\s)\d{7,40})(?![0-9A-Za-z_])")


def units() -> list[tuple[str, str]]:
    """The README as (kind, text) in order: "code" (a fenced block), "table", or "text" (a paragraph or
    one list item; a list item runs until the next item or a blank line)."""
    out: list[tuple[str, str]] = []
    lines: list[str] = []
    fence = False

    def flush() -> None:
        if lines:
            text = "\n".join(lines)
            if fence:
                out.append(("code", text))
            elif all(ln.lstrip().startswith("|") for ln in lines):
                out.append(("table", text))
            else:
                out.append(("text", text))
            lines.clear()

    for ln in README.splitlines():
        if ln.lstrip().startswith("```"):
            if not fence:
                flush()
            lines.append(ln)
            if fence:
                flush()
            fence = not fence
        elif fence:
            lines.append(ln)
        elif not ln.strip():
            flush()
        else:
            if re.match(r"\s*[-*] ", ln):
                flush()
            lines.append(ln)
    flush()
    return out


def test_every_dated_figure_names_a_commit_that_exists():
    """A paragraph or list item with a date (a measurement's) names the commit it was measured at, or
    the commit that recorded its results ("recorded in <sha>"); a dated table or code block (a sample
    output) has the commit in its caption, the paragraph right above it. Each named commit exists."""
    assert (REPO / ".git").exists(), "no .git: the README's commits are checked in a git clone (CI has one)"
    missing, shas = [], set()
    parts = units()
    for i, (kind, text) in enumerate(parts):
        if not DATE.search(text):
            continue
        caption = parts[i - 1][1] if kind != "text" and i and parts[i - 1][0] == "text" else ""
        found = SHA.findall(caption) + (SHA.findall(text) if kind != "code" else [])
        if not found:
            missing.append((caption + "\n" + text).strip()[:300])
        shas.update(found)
    assert not missing, "dated, but no commit named:\n\n" + "\n\n".join(missing)
    gone = [s for s in sorted(shas) if subprocess.run(["git", "cat-file", "-e", f"{s}^{{commit}}"], cwd=REPO,
                                                       capture_output=True).returncode != 0]
    assert not gone, f"the README names commits this clone does not have: {gone}"


def test_only_the_directory_tree_and_a_run_summary_are_not_runnable():
    # the summary is checked against a real run's in run_bash_command
    assert [b.text.split("\n")[0] for b in BLOCKS if b not in RUNNABLE] == [
        "rlrun: stopped: rollout/episode_return_mean = 484.22 >= 475 (target met)", "conf/"]


def labels(summary_text: str) -> list[str]:
    lines = summary_text.strip().splitlines()
    start = max(i for i, ln in enumerate(lines) if ln.startswith("rlrun: stopped: "))
    return [ln.split()[0] for ln in lines[start + 1:]]


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


def sh(cmd: str, cwd: Path, timeout: float = 900, wrap=None) -> subprocess.CompletedProcess[str]:
    argv = ["bash", "-c", cmd]
    env = {**ENV, "MINARI_DATASETS_PATH": str(cwd / "minari-datasets")}  # Minari's examples: not in ~/.minari
    p = subprocess.run(wrap(argv) if wrap else argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=env)
    assert p.returncode == 0, f"$ {cmd}\nexit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def with_budget(cmd: str) -> str:
    """``cmd`` with at most ``BUDGET`` env steps (and 2 Optuna trials) if it trains."""
    if not re.match(r"rlrun ", cmd) or "--cfg" in cmd or "debug=fast" in cmd:
        return cmd
    cmd = re.sub(r"hydra\.sweeper\.n_trials=\d+", "hydra.sweeper.n_trials=2", cmd)
    if "stop.timesteps_total=" in cmd:
        return re.sub(r"stop\.timesteps_total=\S+", BUDGET, cmd)
    return f"{cmd} {BUDGET}"


def run_bash_command(cmd: str, launch: Path) -> None:
    if cmd.startswith("pip install"):
        # the install is what .ci/run did before this suite started (torch pinned to the local CPU build)
        install, _, rest = cmd.partition("&&")
        assert install.startswith("pip install torch==2.13.0 -e ")
        if rest.strip().startswith("python -m pytest"):
            return  # the suite itself: CI runs it (test_ci_runs_the_readme_test_command)
        out = sh(rest.strip(), launch).stdout  # the first run trains to the target, as the README says
        assert "stopped: rollout/episode_return_mean" in out, out[-2000:]
        shown = next(b.text for b in BLOCKS if b.lang == "text")
        # the README shows the summary a run prints; a run that ends before its writer has created the
        # MLflow run says "(being created)" and has no `open` line yet (the README says so too)
        expected = [x for x in labels(shown) if x != "open" or "(being created)" not in out]
        assert labels(out) == expected, out[-2000:]
        return
    if cmd.startswith("mlflow ui"):
        return mlflow_ui(cmd, launch)
    if cmd.startswith("python -m pytest"):
        # the fast-test selection of the Development section: collect it (running the suite inside itself
        # would recurse) and check it picks the tests it says it does
        p = sh(f"{cmd} --collect-only -q -p no:cacheprovider -n 0", REPO)  # collected here, not by 2 workers
        assert "test_batch.py" in p.stdout and "test_learning.py" not in p.stdout and "test_faults.py" not in p.stdout
        return
    if cmd.startswith(("ruff ", "mypy")):
        sh(cmd, REPO)  # the Development section's commands run in a checkout
        return
    if cmd.startswith("ray start --head"):
        return ray_cluster(cmd, launch)
    if "rollout=server" in cmd and cmd.endswith("&"):
        return start_server_run(cmd, launch)
    if cmd.startswith("rlrun-report "):
        sweep = sorted(launch.glob("multirun/*/*"))[0]
        cmd = cmd.replace("multirun/<date>/<time>", str(sweep.relative_to(launch)))
    wrap = isolated if ("rollout=ray" in cmd or "launcher=ray" in cmd or "tune=" in cmd) else None
    sh(with_budget(cmd), launch, wrap=wrap)


def mlflow_ui(cmd: str, launch: Path) -> None:
    port = free_port()
    tmp = launch / "mlflow-ui-tmp"  # MLflow's server leaves a db_init_lock-<hash> file in its temp dir
    tmp.mkdir(exist_ok=True)
    # one server process instead of MLflow's default of 4 plus its job runner (3 more processes): 7.4 s of
    # CPU to the first page against 17.5 s (2026-11-26); the page the test asks for is the same
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd} --port {port} --workers 1"], cwd=launch,
                            env={**ENV, "TMPDIR": str(tmp), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, page = time.monotonic() + 120, ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert "MLflow" in page, proc.stderr.read()[-2000:] if proc.poll() is not None else "no answer"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def ray_cluster(cmd: str, launch: Path) -> None:
    """``ray start --head && rlrun ...``: the head on Ray's default port in a loopback-only namespace,
    stopped by its own processes afterwards (conftest.on_ray_cluster; never ``ray stop --force``)."""
    head, rest = cmd.split("&&", 1)
    assert head.strip() == "ray start --head"
    p = subprocess.run(on_ray_cluster(with_budget(rest.strip()), port=6379), cwd=launch, capture_output=True,
                       text=True, timeout=900, env=ENV)
    assert p.returncode == 0, f"$ {cmd}\nexit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"


SERVER_RUNS: list[tuple[subprocess.Popen, int]] = []  # the External applications example: (run, port)


def start_server_run(cmd: str, launch: Path) -> None:
    """``rlrun ... rollout=server ... &``: started in the background on a free port, with the budget;
    the client block that follows drives it and waits for it (``run_python``)."""
    port = free_port()
    cmd = with_budget(cmd.removesuffix("&").strip()).replace("rollout.server.port=9900", f"rollout.server.port={port}")
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=launch, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    SERVER_RUNS.append((proc, port))


def run_python(block: Block, launch: Path) -> None:
    code = block.text
    if "PolicyClient(" in code:
        proc, port = SERVER_RUNS.pop()
        deadline = time.monotonic() + 120
        while not (launch / "server.token").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        sh(f"{shlex.quote(sys.executable)} -c {shlex.quote(code.replace(':9900', f':{port}'))}", launch)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "rlrun: stopped: timesteps_total" in out, (out[-2000:], err[-2000:])
        return
    if "LOSSES.register" in code:  # "Put this in my_losses.py next to where you run rlrun"
        (launch / "my_losses.py").write_text(code)
        code = "import my_losses"
    if "MODELS.register" in code:  # "in my_models.py"; the bash block after it uses it
        (launch / "my_models.py").write_text(code)
        code = "import my_models"
    if "SOURCES.register" in code:  # "Put this in my_sources.py"; the bash block after it uses it
        (launch / "my_sources.py").write_text(code)
        code = "import my_sources"
    if "build_trainer(" in code:  # "in my_policies.py"; the blocks after it use it
        (launch / "my_policies.py").write_text(code)
        code = "import my_policies"
    if "CALLBACKS.register" in code:  # "Put this in my_callbacks.py ..."; the bash block before uses it
        (launch / "my_callbacks.py").write_text(code)
        code = "import my_callbacks"
    if "mlflow.pyfunc.load_model" in code:
        db = launch / "mlflow.db"
        run_id = subprocess.run(
            [sys.executable, "-c", "import mlflow; c = mlflow.MlflowClient(); "
             "print(c.search_logged_models([e.experiment_id for e in c.search_experiments()])[0].source_run_id)"],
            env={**ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}, capture_output=True, text=True, timeout=120,
        ).stdout.strip()
        assert run_id, "no MLflow model logged by the runs above"
        code = code.replace("sqlite:////abs/path/mlflow.db", f"sqlite:///{db}")
        # dst_path: MLflow would otherwise download the model into a temp dir it never removes
        code = code.replace('load_model(f"runs:/{run_id}/model")',
                            'load_model(f"runs:/{run_id}/model", dst_path=tempfile.mkdtemp(dir="."))')
        code = (f"run_id = {run_id!r}\nimport tempfile\n{code}"
                "\nassert len(model.predict(np.zeros((8, 4), np.float32))) == 8\n")
    if "from ray import tune" in code:  # Tune starts Ray: loopback only, its session dir removed after, and
        # TMPDIR there too: the dashboard Ray starts by default is killed at exit with its pymp-* temp dir left
        ray_tmp = tempfile.mkdtemp(prefix="rt")
        try:
            p = subprocess.run(isolated([sys.executable, "-c", code]), cwd=launch, capture_output=True, text=True,
                               timeout=900, env={**ENV, "RAY_TMPDIR": ray_tmp, "TMPDIR": ray_tmp})
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
        return
    sh(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}", launch)


def run_console(block: Block, launch: Path) -> None:
    """``$ command`` lines and the output the README shows for them (``...``: the rest is elided)."""
    pairs = re.findall(r"^\$ (.+)\n((?:(?!\$ ).*\n?)*)", block.text, re.M)
    assert pairs
    for cmd, shown in pairs:
        p = subprocess.run(["bash", "-c", cmd], cwd=launch, capture_output=True, text=True, timeout=300, env=ENV)
        got, want = (p.stdout + p.stderr).strip(), shown.strip()
        if want.endswith("..."):
            assert got.startswith(want[:-3]), f"$ {cmd}\n{got}"
        else:
            assert got == want, f"$ {cmd}\n{got}"


@pytest.mark.slow
def run_cluster_block(block: Block, launch: Path) -> None:
    """The "Several machines" recipe: its head and node as ``tests/test_cluster.two_nodes`` starts
    them (the node cannot see the launch dir), then its ``rlrun`` command with ``HEAD_IP`` = 127.0.0.1."""
    from tests.test_cluster import PLUGIN, two_nodes

    export, head, node, cmd = commands(block)
    assert export == "export RAY_AUTH_MODE=token"
    assert head == "ray start --head --port=6379 --resources='{\"head_node\": 2}'"
    assert node == "ray start --address=HEAD_IP:6379 --resources='{\"node2\": 2}'"
    (launch / "my_plugins").mkdir(exist_ok=True)
    (launch / "my_plugins" / "__init__.py").write_text(PLUGIN.replace("ShippedCartPole", "ReadmeCartPole"))
    argv = two_nodes(with_budget(cmd.replace("HEAD_IP", "127.0.0.1")), str(launch), 6379,
                     os.environ.get("RAY_TMPDIR", "/tmp"))
    p = subprocess.run(argv, cwd=launch, capture_output=True, text=True, timeout=900, env=ENV)
    assert p.returncode == 0, f"$ {cmd}\nexit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_readme_block_runs(block: Block, launch: Path):
    if block.text.startswith("export RAY_AUTH_MODE=token"):
        run_cluster_block(block, launch)
    elif block.lang == "python":
        run_python(block, launch)
    elif block.lang == "console":
        run_console(block, launch)
    elif block.lang == "yaml":
        (launch / f"{next(iter(yaml.safe_load(block.text)))}.yaml").write_text(block.text)
    else:
        for cmd in commands(block):
            run_bash_command(cmd, launch)
