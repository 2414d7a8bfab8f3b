import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The suite runs two test processes on a machine's cores (pyproject.toml: -n 2), and the presets that
# learn on two torch threads (dqn_cartpole, td3_pendulum, ...) then share the cores with another learner.
# torch's OpenMP threads spin while they wait for work by default; two such learners side by side on two
# cores spend their time slices spinning: two 20k-step dqn_cartpole runs at once took 69.0 s each (median
# of 6; up to 182 s), 19.1 s with threads that sleep (one alone: 15.9 s spinning, 18.6 s sleeping;
# experiments/omp_wait_policy), and CI's run of 2026-11-30 took 1,439 and 1,200+ s for two such tests.
# Set before torch is first imported (in this process; the processes the tests start inherit it).
# Results do not change: only how idle threads wait.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# Everything the suite writes to a temp dir goes to one short dir of its own (Ray's socket paths have a
# length limit): TMPDIR, and so every tempfile of the tests and of the processes they start; Ray's
# session dirs ($RAY_TMPDIR); torch's compile cache (/tmp/torchinductor_<user> otherwise). The check
# below looks only there, so files that other programs create in the shared /tmp meanwhile cannot fail
# the suite. pytest's own tmp_path dirs stay under /tmp/pytest-of-<user> (kept for failed tests only).
SUITE_TMP: list[str] = []
SUITE_TMP_EXPECTED = {"inductor"}  # torch's compile cache: the suite's own, removed with the dir


def pytest_configure(config):
    # pytest 9.2 computes an item's nodeid from a field pytest-xdist 3.8 (the newest) does not set: the
    # groups below would not reach xdist and a module's tests, the README blocks that build on each other's
    # files among them, would be spread over both workers and fail one by one. Say so at once instead.
    if config.getoption("dist", "no") == "loadgroup" and tuple(map(int, pytest.__version__.split(".")[:2])) >= (9, 2):
        raise pytest.UsageError(f"pytest {pytest.__version__} breaks pytest-xdist's --dist loadgroup (pyproject.toml "
                                "uses it); install the pytest that the [test] extra bounds: pip install -e \".[test]\"")
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    # the machine's temp dir, also for pytest-xdist's workers (they inherit the TMPDIR set below): each
    # process of the suite gets a dir of its own beside the others', not inside its parent's
    root = os.environ.setdefault("RLRUN_SUITE_TMP_ROOT", tempfile.gettempdir())
    SUITE_TMP.append(tempfile.mkdtemp(prefix="rls", dir=root))
    for var in ("TMPDIR", "RAY_TMPDIR"):
        os.environ[var] = SUITE_TMP[0]
    tempfile.tempdir = SUITE_TMP[0]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(SUITE_TMP[0], "inductor")
    if not hasattr(config, "workerinput"):  # the controller, before any worker or test process starts
        _compile_sources()


def _compile_sources() -> None:
    """Bytecode for rlrun and the tests, once. With ``PYTHONDONTWRITEBYTECODE=1`` (set on this machine)
    Python writes no ``__pycache__``, so each of the ~370 processes of the suite that import rlrun (runs, Ray
    workers, MLflow writers, rlrun-eval) compiled its sources again: 2.3 s of CPU to import the trainer's
    modules against 1.85 s with bytecode present (2026-11-26). Python still reads bytecode it finds, and
    checks it against the source's mtime and size, so an edited file is compiled afresh, never stale."""
    import compileall

    for folder in ("rlrun", "tests"):
        compileall.compile_dir(REPO / folder, quiet=1)


# The modules that take longest (test time on two pytest-xdist workers, 2026-11-26), run first: each
# module is one unit of work (``xdist_group`` below), handed to the workers in collection order (with
# ``--no-loadscope-reorder``, pyproject.toml: by default xdist hands them out by their number of tests,
# and the 1-test soak and 2-test cluster modules ran last, one worker idle beside them for ~100 s), and
# the longest first keeps one long module from being the last thing the suite waits for.
LONGEST_FIRST = ("test_readme", "test_learning_continuous", "test_serving", "test_worker_set", "test_sweep",
                 "test_recurrent", "test_offline", "test_learning", "test_multi_agent", "test_bad_input", "test_soak",
                 "test_pending", "test_cluster", "test_faults", "test_callbacks", "test_runner", "test_cnn")


# modules that share a session fixture run on the same worker, so it is built once
SAME_WORKER = {"test_ope": "test_offline"}  # `recorded`: a trained run and its recorded episodes


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # a stable sort: the tests of a module keep their order
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
    # ``--dist loadgroup`` (pyproject.toml): one group per module, so a module's tests run in order on one
    # worker and its module fixtures are built once
    for item in items:
        item.add_marker(pytest.mark.xdist_group(SAME_WORKER.get(item.path.stem, item.path.stem)))


def pytest_unconfigure(config):
    tempfile.tempdir = None
    for d in SUITE_TMP:
        shutil.rmtree(d, ignore_errors=True)


def left_in_suite_tmp() -> list[str]:
    """What the suite's temp dir holds beyond the expected: files the tests or their processes left."""
    return sorted(set(os.listdir(SUITE_TMP[0])) - SUITE_TMP_EXPECTED)


# what tools keep in the checkout they run in: pytest's cache (and pytest-benchmark's, where that plugin is
# installed), and ruff's and mypy's, as tests/test_readme.py runs the README's lint commands there
CHECKOUT_EXPECTED = {".pytest_cache", ".benchmarks", ".ruff_cache", ".mypy_cache"}


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_tmp():
    """The suite and the processes it starts leave no temp file behind, and nothing in the checkout: a test
    whose process wrote into its working directory (the checkout, where pytest runs) left ``mlruns/`` there
    unseen, as .gitignore hides it (tests/test_mlflow_writer.py until 2026-11-30)."""
    before = set(os.listdir(REPO))
    yield
    new = left_in_suite_tmp()
    assert not new, f"left in the suite's temp dir {SUITE_TMP[0]} by the test suite: {new}"
    added = sorted(set(os.listdir(REPO)) - before - CHECKOUT_EXPECTED)
    assert not added, f"left in the checkout {REPO} by the test suite (a test wrote into its working dir): {added}"


@pytest.fixture(autouse=True)
def fresh_mlflow_connections():
    """After each test, close the SQLite connections MLflow keeps open in this process. MLflow caches one
    engine per store URI (``SqlAlchemyStore._engine_map``), and pytest deletes a passed test's ``tmp_path``
    and gives its name to the next test of the same prefix: a client of the next test's
    ``<tmp_path>/mlflow.db`` then read the deleted file of the previous one through the cached engine
    (``test_the_atari_presets_run_record_checkpoint_and_resume...[ppo_breakout]`` found none of its runs'
    metrics after the ``dqn_breakout`` case, 2026-11-27). The store objects MLflow caches per URI (its
    tracking store registry) hold their engine too, so they go as well (``test_rerun``'s multi-agent case
    read the ``dqn_cartpole`` case's deleted store through one).

    ``mlflow.set_tracking_uri`` (which some tests call, as a user would) also sets ``MLFLOW_TRACKING_URI`` in
    this process's environment, which every later subprocess inherits: ``rlrun-report`` in
    ``test_rerun`` then looked for its runs in ``test_export``'s deleted store (CI, 2026-11-27). Both go
    back to what they were before the test."""
    uri_before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    if utils is not None and getattr(utils, "_tracking_uri", None) != uri_before:
        utils.set_tracking_uri(uri_before)  # None unsets the variable too
    if uri_before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = uri_before
    registry = sys.modules.get("mlflow.tracking._tracking_service.registry")
    cached = getattr(getattr(registry, "TrackingStoreRegistry", None), "_get_store_with_resolved_uri", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
    store = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")
    engines = getattr(getattr(store, "SqlAlchemyStore", None), "_engine_map", None)
    if isinstance(engines, dict):
        for engine in engines.values():
            engine.dispose()
        engines.clear()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(args, cwd, timeout=600, env=None, base_env=None):
    """Run the real `python -m rlrun` in ``cwd``; returns the CompletedProcess. ``base_env``: the
    environment to start from instead of ``os.environ`` (a copy taken before something changes it)."""
    full_env = {**(os.environ if base_env is None else base_env), "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlrun", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def isolated(argv, fake_lan=False):
    """``argv`` run in a fresh network namespace whose only interface is loopback, so the Ray
    processes a test starts can only be reached on 127.0.0.1. ``fake_lan`` adds a veth pair inside the
    namespace (192.0.2.1, TEST-NET-1, default route; packets reach nothing outside) so that a program
    sees a "LAN" address it could wrongly bind to, as on a real machine."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return list(argv)
    setup = "ip link set lo up"
    if fake_lan:
        setup += (" && ip link add lan0 type veth peer name lan1 && ip addr add 192.0.2.1/24 dev lan0"
                  " && ip link set lan0 up && ip link set lan1 up && ip route add default dev lan0")
    return ["unshare", "--net", "sh", "-c", f'{setup} && exec "$@"', "sh", *argv]


def on_ray_cluster(command, port):
    """argv: start a 2-CPU Ray head on ``port``, run the shell ``command`` against it, stop the head
    and exit with the command's status (90: the head did not start). In a loopback-only namespace."""
    ray_tmp = tempfile.mkdtemp(prefix="rt")  # short: Ray's socket paths have a length limit
    # RAY_TMPDIR, and no --temp-dir: `ray start` writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster
    # and `address=auto` reads it from there. (With --temp-dir=X it writes X/ray_current_cluster, which
    # auto never reads: Ray then takes any GCS process it sees on the machine, and may find another test's
    # cluster - in another network namespace, unreachable - when tests run in parallel.)
    script = textwrap.dedent(f"""
        set -u
        export RAY_TMPDIR={ray_tmp}
        ray start --head --port={port} --num-cpus=2 --include-dashboard=false --disable-usage-stats \\
            >/dev/null 2>&1 || exit 90
        {command}
        rc=$?
        # stop only this head's processes (their command lines name its temp dir): `ray stop --force`
        # would kill every Ray process on the machine
        for sig in TERM KILL; do
            for pid in $(pgrep -f -- "{ray_tmp}"); do [ "$pid" != "$$" ] && kill -$sig "$pid" 2>/dev/null; done
            sleep 2
        done
        rm -rf "{ray_tmp}"
        exit $rc
    """)
    return isolated(["bash", "-c", script])


def eval_cli(args, cwd, env=None):
    """Run the real ``rlrun-eval`` in ``cwd``; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlrun.app.eval_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=full_env)


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    """The offline tests' data: a trained ppo_cartpole run (``run``) whose sampled batches were
    recorded while it trained (``replay/ppo``), 100 episodes of its final policy with sampled actions
    (``data``), and 300 episodes of a 1-iteration run's nearly uniform policy (``replay/random``)."""
    d = tmp_path_factory.mktemp("offline")
    p = run_cli(["+experiment=ppo_cartpole", "tracking=none", f"output_dir={d / 'run'}", f"output={d / 'replay/ppo'}"],
                d)
    assert p.returncode == 0, p.stderr
    p = run_cli(["+experiment=ppo_cartpole", "tracking=none", f"output_dir={d / 'random'}",
                 "stop.training_iteration=1"], d)
    assert p.returncode == 0, p.stderr
    p = eval_cli([f"checkpoint={d / 'random'}", "episodes=300", "explore=true", f"output={d / 'replay/random'}",
                  "log=false", f"out={d / 'eval-random'}"], d)
    assert p.returncode == 0, p.stderr
    p = eval_cli([f"checkpoint={d / 'run'}", "episodes=100", "explore=true", f"output={d / 'data'}", "log=false",
                  f"out={d / 'eval'}"], d)
    assert p.returncode == 0, p.stderr
    assert "recorded 100 episodes" in p.stdout, p.stdout
    return d


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` for a process a test will send Ctrl-C (SIGINT): SIGINT back to its default, as a
    terminal's foreground process has it. A suite started in the background by a non-interactive shell
    (``.ci/run &``) inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def without_module(tmp_path, *modules: str) -> dict[str, str]:
    """An env for ``run_cli`` in which ``modules`` (and their submodules) are not there, as where an extra
    is not installed: a ``sitecustomize`` on PYTHONPATH puts a finder first that says so for them."""
    blocked = tmp_path / "blocked"
    blocked.mkdir(parents=True, exist_ok=True)
    (blocked / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import sys

        class _NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if any(name == m or name.startswith(m + ".") for m in {list(modules)!r}):
                    raise ModuleNotFoundError(f"No module named '{{name}}'", name=name)
                return None

        sys.meta_path.insert(0, _NotInstalled())
        """))
    return {"PYTHONPATH": f"{blocked}{os.pathsep}{REPO}"}


def dqn_policy_with_another_target(obs_space, action_space, model_config, algo_config, **kw):
    """A DQN policy whose target net is the online net moved a little (seeded), so that double Q's
    choice and the target's values matter in a test of one step."""
    import torch

    from rlrun.algos.algorithm import make_policy

    p = make_policy("dqn", obs_space, action_space, model_config=model_config, algo_config=algo_config, **kw)
    with torch.no_grad():
        for t in p.state.target_model.parameters():
            t.add_(0.1 * torch.randn(t.shape, generator=torch.Generator().manual_seed(t.numel())))
    return p


def autograd_step(policy, mb):
    """The policy's loss on ``mb`` and its gradient by autograd (``.grad`` of every parameter)."""
    policy.optimizer.zero_grad()
    out = policy.loss_fn(policy, policy.model, policy.dist_class, mb)
    out.total.backward()
    return out


def assert_the_same_dqn_step(hand, ref, out, out_ref, mb, mb_ref) -> None:
    """A DQN loss's hand-derived step (``hand``, ``out``, minibatch ``mb``) against autograd's (``ref``,
    ``out_ref``, ``mb_ref``): the same loss, TD errors (the priorities' input), stats, and every
    parameter's gradient, to float rounding; every parameter gets one."""
    import torch

    from rlrun.data.batch import SampleBatch

    assert float(out.total) == pytest.approx(float(out_ref.total), rel=1e-5)
    torch.testing.assert_close(mb[SampleBatch.TD_ERROR], mb_ref[SampleBatch.TD_ERROR], rtol=1e-5, atol=1e-6)
    for k in ("q_mean", "target_mean"):
        assert float(out.stats[k]) == pytest.approx(float(out_ref.stats[k]), rel=1e-5, abs=1e-6)
    for (name, p), q in zip(hand.model.named_parameters(), ref.model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        scale = float(q.grad.abs().max())
        assert scale > 0, name  # every parameter gets a gradient (the test would miss a dropped one)
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-5, atol=1e-6 * scale, msg=name)


def assert_a_nan_reward_leaves_the_weights(policy, mb) -> None:
    """One NaN n-step reward in ``mb``: ``learn_on_minibatch`` stops before the optimizer step with one
    clear error, and every weight stays as it was (a hand-derived gradient as much as autograd's)."""
    import copy

    import torch

    from rlrun.core.errors import NonFiniteLossError
    from rlrun.data.batch import SampleBatch

    before = copy.deepcopy(policy.model.state_dict())
    mb[SampleBatch.NSTEP_REWARDS][3] = float("nan")
    with pytest.raises(NonFiniteLossError, match="train/loss/total is nan"):
        policy.learn_on_minibatch(mb)
    for k, v in policy.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def rlrun_cmd(*args):
    return [sys.executable, "-m", "rlrun", *args]


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(list(args), tmp_path, **kw)


@pytest.fixture
def refuse(tmp_path):
    """For commands the CLI refuses before it trains: ``rlrun`` called in this process (tests/inprocess.py),
    in ``tmp_path``; the same exit status and output as ``cli``, ~10x sooner."""
    from tests.inprocess import cli_in_process

    return lambda *args: cli_in_process(list(args), tmp_path)


def run_summary(stdout: str) -> dict[str, str]:
    """The end-of-run summary a run prints (rlrun/tracking/progress.py ``Summary``): ``stopped`` (the reason),
    ``final`` (return), ``steps``, ``output``, ``checkpoint``, ``run_name``, ``run_id``, ``browse``."""
    lines = stdout.strip().splitlines()
    start = max(i for i, ln in enumerate(lines) if ln.startswith("rlrun: stopped: "))
    out = {"stopped": lines[start][len("rlrun: stopped: "):]}
    for ln in lines[start + 1:]:
        key, _, value = ln.strip().partition(" ")
        out[key] = value.strip()
    out["final"] = out["return"].split("final ")[1].split(",")[0] if "final " in out["return"] else "nan"
    out["steps"] = (out.pop("env", None) or out.pop("rows")).split()[1].replace(",", "")  # env steps / rows read
    if "MLflow" in out and out["MLflow"].endswith("(being created)"):  # the run id came after the summary
        m = re.fullmatch(r"run '(.*)' in experiment '(.*)' \(being created\)", out["MLflow"])
        out["run_name"], out["experiment"] = m[1], m[2]
        out["run_id"] = run_of_output_dir(out["browse"].split("--backend-store-uri ")[1], out["output"])
    elif "MLflow" in out:
        m = re.fullmatch(r"run '(.*)' \((\w+)\) in experiment '(.*)'", out["MLflow"])
        out["run_name"], out["run_id"], out["experiment"] = m[1], m[2], m[3]
    return out


def run_of_output_dir(uri: str, output_dir: str) -> str:
    """The id of the newest MLflow run of ``output_dir`` (by its ``rlrun.output_dir`` tag)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    (run, *_) = client.search_runs(exp_ids, f"tags.`rlrun.output_dir` = '{output_dir}'",
                                   order_by=["attributes.start_time DESC"])
    return run.info.run_id


def trained_and_restored(overrides: list[str], tmp_path: Path, iterations: int = 2):
    """A trainer after ``iterations``, its last result, and another (seed 7) restored from its checkpoint:
    what a resume of an off-policy learner's state is checked on. The caller stops both."""
    from rlrun import make_trainer
    from rlrun.training.checkpoint import load_checkpoint, save_checkpoint

    a = make_trainer(overrides)
    for _ in range(iterations):
        result = a.train()
    path = save_checkpoint(tmp_path / "ck", a.get_state(), {"algo": a.config.name}, {})
    b = make_trainer([*overrides, "seed=7"])
    b.set_state(load_checkpoint(path).state)
    return a, result, b


def assert_same_losses_and_stop(a, b, batch, stages) -> None:
    """Each loss stage gives ``a`` and ``b`` the same total on ``batch`` (weights, targets and temperature
    restored alike); then both trainers stop."""
    import torch

    for stage in stages:
        la, lb = (stage(t.policy, t.policy.model, t.policy.dist_class, batch) for t in (a, b))
        assert torch.equal(la.total, lb.total), stage.__name__
    a.stop()
    b.stop()


def plugin_module(monkeypatch, tmp_path: Path, name: str):
    """tests/plugins/<name>.py imported with what it registers kept for this test only (and copied to
    ``tmp_path``, the launch directory, so that a run's Ray workers import it too)."""
    import importlib

    from rlrun.core.registry import ENVS
    from rlrun.sources.plugins import load_builtins

    plugins = Path(__file__).parent / "plugins"
    shutil.copy(plugins / f"{name}.py", tmp_path)
    monkeypatch.setattr(ENVS, "_entries", dict(ENVS._entries))
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.delitem(sys.modules, name, raising=False)
    load_builtins()
    return importlib.import_module(name)


def assert_sequences_replay(policy, batch, max_seq_len: int) -> None:
    """Replaying each sequence of a recurrent policy's batch (cut at ``max_seq_len``) from its recorded
    state reproduces the values and action-distribution inputs the policy computed while acting."""
    import numpy as np
    import torch

    from rlrun.data.batch import SampleBatch as SB
    from rlrun.models.sequences import SequenceView, sequence_minibatch, sequence_starts

    starts, lens = sequence_starts(batch[SB.EPS_ID], batch[SB.T], max_seq_len)
    tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    mb = sequence_minibatch(tb, starts, lens, np.arange(len(starts)))
    with torch.no_grad():
        out = SequenceView(policy.model, mb)(mb[SB.OBS])
    torch.testing.assert_close(out.values, mb[SB.VF_PREDS])
    torch.testing.assert_close(out.dist_inputs, mb[SB.ACTION_DIST_INPUTS])
