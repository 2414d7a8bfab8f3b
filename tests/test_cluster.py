"""A real two-node Ray cluster on this machine: a head and a second node whose processes do not see
the launch directory (a mount namespace hides it), as a second machine would not have the user's
files. Rollout workers spread over both nodes; a plugin package reaches the second node only through
``rollout.ray.runtime_env`` (``py_modules``); when the second node dies mid-run (every process of it
killed), the run goes on with its worker restarted on the head."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, isolated

PLUGIN = textwrap.dedent('''
    import gymnasium as gym

    from rlrun.core.registry import ENVS


    @ENVS.register("ShippedCartPole", vector=False)
    def shipped():
        return gym.make("CartPole-v1")
''')


def two_nodes(command: str, launch: str, port: int, tmp_root: str) -> list[str]:
    """argv: start a head (resource ``head_node``) and a second node (resource ``node2``; its processes
    have ``RLRUN_NODE2=<port>`` in their environment) that sees an empty ``launch``, run the shell
    ``command``, stop both nodes' processes by their ids (never ``ray stop --force``) and exit with the
    command's status (90/91: a node did not start)."""
    script = textwrap.dedent(f"""
        set -u
        export RAY_AUTH_MODE=token  # the head's token auth; a joining `ray start` does not turn it on itself
        T=$(mktemp -d {tmp_root}/rtXXXX)
        stop_nodes() {{
            for sig in TERM KILL; do
                for pid in $(pgrep -f -- "$T|address=127.0.0.1:{port}"); do
                    [ "$pid" != "$$" ] && kill -$sig "$pid" 2>/dev/null
                done
                sleep 2
            done
            rm -rf "$T"
        }}
        trap stop_nodes EXIT
        ray start --head --port={port} --num-cpus=2 --resources='{{"head_node": 2}}' --include-dashboard=false \\
            --disable-usage-stats --temp-dir=$T >/dev/null 2>&1 || exit 90
        # RLRUN_NODE2: every process of the second node carries it (its raylet, agents and workers)
        RLRUN_NODE2={port} unshare --mount sh -c "mount -t tmpfs none {launch} && exec ray start \\
            --address=127.0.0.1:{port} --num-cpus=2 --resources='{{\\"node2\\": 2}}' --disable-usage-stats" \\
            >/dev/null 2>&1 || exit 91
        {command}
    """)
    return isolated(["bash", "-c", script])


@pytest.mark.ray
def test_workers_on_two_nodes_and_a_plugin_shipped_by_runtime_env(tmp_path):
    launch = tmp_path / "launch"
    (launch / "shipped_plugin").mkdir(parents=True)
    (launch / "shipped_plugin" / "__init__.py").write_text(PLUGIN)
    args = ("+experiment=ppo_cartpole env.id=ShippedCartPole 'plugins=[shipped_plugin]' rollout=ray "
            "rollout.num_workers=2 rollout.ray.address=127.0.0.1:6396 rollout.ray.scheduling_strategy=SPREAD "
            "stop.training_iteration=2 progress=false")
    rlrun = f"{sys.executable} -m rlrun {args}"
    command = (f"{rlrun} tracking=none 2> control.err; echo $? > control.rc; "
               f"{rlrun} 'rollout.ray.runtime_env={{py_modules: [shipped_plugin]}}'")
    p = subprocess.run(two_nodes(command, str(launch), 6396, os.environ.get("RAY_TMPDIR", "/tmp")), cwd=launch,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900)
    # without runtime_env the worker on the second node cannot import the plugin: one line, exit 2
    control = (launch / "control.err").read_text().strip().splitlines()
    assert (launch / "control.rc").read_text().strip() == "2", control
    assert control[-1].startswith("rlrun: error: plugins[0]: cannot import module 'shipped_plugin'"), control
    assert not any("Traceback" in line for line in control), control
    # with it the run trains on both nodes, and MLflow names each worker's node
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    client = MlflowClient(tracking_uri=f"sqlite:///{launch / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    nodes = sorted(run.data.tags[f"ray.worker.{i}.node"].split(":")[0] for i in (1, 2))
    assert nodes == ["head_node", "node2"], run.data.tags
    assert run.data.metrics["workers/num_healthy"] == 2
    assert run.data.metrics["timesteps_total"] > 0


# run inside the cluster's namespace: start the run, kill every process of the second node once the run
# has trained an iteration there, wait for the run; what happened goes to files the test reads
KILL_NODE2 = textwrap.dedent('''
    import os, signal, subprocess, sys, time
    port, args = sys.argv[1], sys.argv[2:]
    run = subprocess.Popen([sys.executable, "-m", "rlrun", *args], stdout=subprocess.PIPE, text=True)
    node2 = lambda: [int(d) for d in os.listdir("/proc") if d.isdigit() and _marked(d)]
    def _marked(pid):
        try:
            return f"RLRUN_NODE2={port}".encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
        except OSError:
            return False
    out = []
    for line in run.stdout:
        out.append(line)
        if line.startswith("iter ") and not os.path.exists("killed"):  # iteration 1 done: workers on both nodes
            pids = node2()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            open("killed", "w").write(f"{len(pids)} at {line}")
    run.wait()
    open("run.out", "w").write("".join(out))
    time.sleep(1)
    open("left", "w").write(" ".join(map(str, node2())))
    sys.exit(run.returncode)
''')


@pytest.mark.ray
def test_a_node_that_dies_mid_run_costs_its_worker_a_restart_and_no_iteration(tmp_path):
    launch = tmp_path / "launch"
    launch.mkdir()
    (launch / "kill_node2.py").write_text(KILL_NODE2)
    args = ("+experiment=ppo_cartpole rollout=ray rollout.num_workers=2 rollout.ray.address=127.0.0.1:6397 "
            "rollout.ray.scheduling_strategy=SPREAD seed=0")
    p = subprocess.run(two_nodes(f"{sys.executable} kill_node2.py 6397 {args}", str(launch), 6397,
                                 os.environ.get("RAY_TMPDIR", "/tmp")),
                       cwd=launch, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                       timeout=900)
    out = (launch / "run.out").read_text() if (launch / "run.out").exists() else ""
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:], out[-2000:])
    killed = (launch / "killed").read_text()
    assert int(killed.split()[0]) >= 2, killed  # the node's raylet and its worker, at least
    assert (launch / "left").read_text() == "", "a process of the dead node is still running"
    # said what happened (the worker SPREAD put on the second node; restarted there again, before Ray has
    # marked the node dead, it fails once more and is restarted on the head)
    assert re.search(r"rollout worker [12] failed \(actor died: .*\); restarting it", out), out[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{launch / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.metrics["rollout/episode_return_mean"] >= 475
    iterations = [int(m.value) for m in client.get_metric_history(run.info.run_id, "training_iteration")]
    assert sorted(iterations) == list(range(1, max(iterations) + 1)), iterations  # no iteration lost
    restarts = [m.value for m in client.get_metric_history(run.info.run_id, "workers/num_restarts")]
    assert max(restarts) >= 1 and run.data.metrics["workers/num_healthy"] == 2
    # both workers on the head now: the one whose node died was restarted there
    assert [run.data.tags[f"ray.worker.{i}.node"].split(":")[0] for i in (1, 2)] == ["head_node", "head_node"]
