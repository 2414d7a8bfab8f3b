"""A real two-node Ray cluster on this machine: a head and a second node whose processes do not see
the launch directory (a mount namespace hides it), as a second machine would not have the user's
files. Rollout workers spread over both nodes; a plugin package reaches the second node only through
``rollout.ray.runtime_env`` (``py_modules``)."""

from __future__ import annotations

import os
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
    """argv: start a head (resource ``head_node``) and a second node (resource ``node2``) that sees an
    empty ``launch``, run the shell ``command``, stop both nodes' processes by their ids (never
    ``ray stop --force``) and exit with the command's status (90/91: a node did not start)."""
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
        unshare --mount sh -c "mount -t tmpfs none {launch} && exec ray start --address=127.0.0.1:{port} \\
            --num-cpus=2 --resources='{{\\"node2\\": 2}}' --disable-usage-stats" >/dev/null 2>&1 || exit 91
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
