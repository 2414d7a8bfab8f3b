"""External applications (rlrun/serving/, rlrun/app/client.py): the protocol's checks, the episode table,
and real runs with ``rollout=server`` driven by client processes (experiments/external_env/driver.py)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from rlrun.sources.serving.episodes import EpisodeTable
from rlrun.sources.serving.protocol import RequestError, decode

from .conftest import REPO, free_port, run_cli

DRIVER = REPO / "experiments" / "external_env" / "driver.py"
OBS, ACT = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)


# ---------------------------------------------------------------------- the protocol and the table
@pytest.mark.parametrize(("command", "body", "status", "words"), [
    ("get_action", b"{not json", 400, "not JSON"),
    ("get_action", b"[1, 2]", 400, "JSON object"),
    ("get_action", b'{"episode_id": "e"}', 400, "'observation' is missing"),
    ("get_action", b'{"episode_id": "e", "observation": [0, 0, 0]}', 400, "shape [4]"),
    ("get_action", b'{"episode_id": "e", "observation": [0, 0, 0, "x"]}', 400, "list of numbers"),
    ("get_action", b'{"episode_id": "e", "observation": [0, 0, 0, 1e999]}', 400, "finite"),
    ("get_action", b'{"episode_id": "e/../x", "observation": [0, 0, 0, 0]}', 400, "episode_id"),
    ("get_action", b'{"episode_id": 5, "observation": [0, 0, 0, 0]}', 400, "episode_id"),
    ("get_action", b'{"episode_id": "e", "observation": [0, 0, 0, 0], "extra": 1}', 400, "unknown field 'extra'"),
    ("log_action", b'{"episode_id": "e", "observation": [0, 0, 0, 0], "action": 2}', 400, "[0, 2)"),
    ("log_action", b'{"episode_id": "e", "observation": [0, 0, 0, 0], "action": true}', 400, "integer"),
    ("log_returns", b'{"episode_id": "e", "reward": NaN}', 400, "finite"),
    ("log_returns", b'{"episode_id": "e", "reward": "1"}', 400, "finite number"),
    ("log_returns", b'{"episode_id": "e", "reward": 1, "info": [1]}', 400, "info"),
    ("end_episode", b'{"episode_id": "e", "observation": [0, 0, 0, 0], "truncated": 1}', 400, "true or false"),
    ("start_episode", b'{"training_enabled": "yes"}', 400, "true or false"),
    ("drop_tables", b"{}", 404, "unknown command"),
    ("batch", b'{"requests": []}', 400, "1 to 1024 requests"),
    ("batch", b'{"requests": {}}', 400, "must be a list"),
    ("batch", b'{"requests": [{"episode_id": "e"}]}', 400, "requests[0] needs a command"),
    ("batch", b'{"requests": [{"command": "policy"}]}', 400, "requests[0] needs a command among start_episode"),
    ("batch", b'{"requests": [{"command": "start_episode"}, {"command": "log_returns", "episode_id": "e", '
              b'"reward": NaN}]}', 400, "batch: requests[1]: log_returns: reward must be a finite number"),
    ("batch", b'{"requests": [], "more": 1}', 400, "the body is"),
])
def test_the_protocol_refuses_malformed_requests_with_one_line(command, body, status, words):
    with pytest.raises(RequestError) as e:
        decode(command, body, OBS, ACT)
    assert e.value.status == status and words in e.value.reason and "\n" not in e.value.reason


def test_the_protocol_decodes_a_valid_request():
    f = decode("get_action", b'{"episode_id": "a-1", "observation": [1, 2, 3, 4], "reward": 1.5}', OBS, ACT)
    assert f["episode_id"] == "a-1" and f["reward"] == 1.5
    assert f["observation"].dtype == np.float32 and f["observation"].tolist() == [1, 2, 3, 4]


def test_a_batch_runs_in_order_and_stops_at_the_first_refusal():
    """One round trip for many requests: each answered in order; a refusal stops the rest and names
    its index, so a client knows what took effect."""
    from types import SimpleNamespace

    from rlrun.sources.serving.app import PolicyServer

    t = table()
    server = SimpleNamespace(table=t, spaces=(OBS, ACT), rejected=0, policy=None, info={})
    server._dispatch = lambda command, fields: PolicyServer._dispatch(server, command, fields)
    obs = [0.0, 0.0, 0.0, 0.0]
    body = json.dumps({"requests": [{"command": "start_episode", "episode_id": "a"},
                                    {"command": "get_action", "episode_id": "a", "observation": obs},
                                    {"command": "get_action", "episode_id": "nope", "observation": obs},
                                    {"command": "start_episode", "episode_id": "b"}]}).encode()
    answer = PolicyServer._dispatch(server, "batch", decode("batch", body, OBS, ACT))
    assert [list(a) for a in answer["answers"]] == [["episode_id"], ["action"]]
    assert answer["failed"]["index"] == 2 and answer["failed"]["status"] == 404
    assert answer["failed"]["error"].startswith("requests[2] get_action: get_action: unknown or ended episode 'nope'")
    assert t.num_open == 1 and server.rejected == 1  # "b" never started


def sample_body(n=3, **change):
    """A valid ``samples`` body of n rows, with columns replaced by ``change``."""
    import base64

    cols = {"obs": np.zeros((n, 4), np.float32), "actions": np.ones(n, np.int64), "rewards": np.ones(n, np.float32),
            "action_logp": np.full(n, -0.7, np.float32), "vf_preds": np.zeros(n, np.float32),
            "action_dist_inputs": np.zeros((n, 2), np.float32)}
    cols.update(change)
    enc = {k: v if isinstance(v, str) else base64.b64encode(v.tobytes()).decode() for k, v in cols.items()}
    return json.dumps({"episode_id": "e", "columns": enc, "next_observation": [0, 0, 0, 0], "end": None}).encode()


@pytest.mark.parametrize(("change", "words"), [
    ({"obs": np.zeros((3, 3), np.float32)}, "'obs' has 2 rows"),  # 9 values: 2 rows and a bit
    ({"rewards": np.ones(2, np.float32)}, "'rewards' has 2 rows, others 3"),
    ({"vf_preds": np.array([0, np.nan, 0], np.float32)}, "'vf_preds' holds a non-finite"),
    ({"actions": np.array([0, 1, 2], np.int64)}, "outside [0, 2)"),
    ({"action_logp": "not base64!"}, "'action_logp' must be base64"),
])
def test_uploaded_samples_are_checked_column_by_column(change, words):
    if "obs" in change:
        words = "'obs' must be base64"  # 36 bytes are not a whole number of 16-byte rows
    with pytest.raises(RequestError) as e:
        decode("samples", sample_body(**change), OBS, ACT, dist_size=2)
    assert e.value.status == 400 and words in e.value.reason, e.value.reason


def test_uploaded_samples_become_complete_rows():
    f = decode("samples", sample_body(), OBS, ACT, dist_size=2)
    t = table()
    t.start("e", True)
    t.add_rows("e", f["columns"], f["next_observation"], None)
    (seg,) = t.take(3, timeout_s=1)  # every uploaded row is complete: the next observation came with them
    assert len(seg.rows) == 3 and not seg.terminated and seg.next_obs.tolist() == [0, 0, 0, 0]
    t.add_rows("e", f["columns"], np.ones(4, np.float32), "terminated")
    (seg,) = t.take(3, timeout_s=1)
    assert seg.terminated and seg.t0 == 3 and t.pop_episodes() == ([6.0], [6])
    with pytest.raises(RequestError) as e:
        decode("samples", sample_body().replace(b'"end": null', b'"end": "done"'), OBS, ACT, dist_size=2)
    assert "end must be" in e.value.reason


def table(timeout_s=60.0):
    return EpisodeTable(lambda obs, a: (1 if a is None else a, -0.5, 2.0, np.zeros(2, np.float32)), timeout_s, 10)


def test_the_table_hands_out_complete_rows_with_their_rewards_and_ends():
    t = table()
    a, b = t.start("a", True), t.start(None, True)
    for i in range(3):
        t.act(a, np.full(4, i, np.float32), reward=1.0 if i else 0.0)  # the reward of the previous action
    t.log_returns(a, 1.0)
    t.end(a, np.full(4, 9, np.float32), truncated=True)
    t.act(b, np.zeros(4, np.float32))
    t.act(b, np.ones(4, np.float32), action=0, reward=0.5)  # log_action
    segs = {s.eps_id: s for s in t.take(4, timeout_s=1)}
    sa, sb = segs[0], segs[1]
    assert [r[5] for r in sa.rows] == [1.0, 1.0, 1.0] and sa.truncated and not sa.terminated
    assert sa.next_obs.tolist() == [9] * 4
    assert len(sb.rows) == 1 and sb.rows[0][5] == 0.5 and sb.next_obs.tolist() == [1] * 4  # the cut: b goes on
    assert t.pop_episodes() == ([3.0], [3])
    with pytest.raises(RequestError) as e:
        t.act(a, np.zeros(4, np.float32))
    assert e.value.status == 404  # a has ended
    with pytest.raises(RequestError) as e:
        t.start(b, True)
    assert e.value.status == 409
    with pytest.raises(TimeoutError):
        t.take(5, timeout_s=0.1)  # b has one complete row, not 5


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_segments_postprocessed_together_match_each_on_its_own(algo):
    """``_fragments`` right-aligns segments of different lengths in one [T, S] fragment: every row's
    advantages (GAE) or n-step targets (DQN) must be those of its segment postprocessed alone."""
    from types import SimpleNamespace

    from rlrun.algos.algorithm import make_policy
    from rlrun.config.schemas import RolloutConfig
    from rlrun.sources.plugins import load_builtins
    from rlrun.sources.serving.episodes import Segment
    from rlrun.sources.serving.worker import ServerWorker

    load_builtins()
    obs_space, act_space = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    policy = make_policy(algo, obs_space, act_space)
    rng = np.random.default_rng(0)

    def segment(n, eps, terminated=False, truncated=False):
        rows = [(rng.normal(size=4).astype(np.float32), int(rng.integers(2)), -0.7, float(rng.normal()),
                 rng.normal(size=2).astype(np.float32), float(rng.normal())) for _ in range(n)]
        return Segment(eps, 3, rows, rng.normal(size=4).astype(np.float32), terminated, truncated)

    stub = SimpleNamespace(policy=policy, obs_space=obs_space, action_space=act_space,
                           spec=SimpleNamespace(record_next_obs=True, rollout=RolloutConfig()))
    segments = [segment(5, 0), segment(1, 1, terminated=True), segment(7, 2, truncated=True), segment(2, 3)]
    together = ServerWorker._fragments(stub, segments)
    alone = [ServerWorker._fragments(stub, [seg]) for seg in segments]
    assert len(together) == sum(len(b) for b in alone) == 15
    for key in together:
        np.testing.assert_allclose(together[key], np.concatenate([b[key] for b in alone]), rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    assert together["eps_id"].tolist() == [0] * 5 + [1] + [2] * 7 + [3] * 2
    assert together["t"].tolist()[:6] == [3, 4, 5, 6, 7, 3] and together["truncateds"][12]


def test_an_idle_episode_is_abandoned_and_its_rows_dropped():
    t = table(timeout_s=0.05)
    e = t.start("gone", True)
    for _ in range(5):
        t.act(e, np.zeros(4, np.float32))
    time.sleep(0.1)
    live = t.start("live", True)  # starting an episode reaps the idle one
    assert t.num_abandoned == 1 and t.num_open == 1
    for _ in range(3):
        t.act(live, np.zeros(4, np.float32))
    segs = t.take(2, timeout_s=1)
    assert [len(s.rows) for s in segs] == [2]  # only the live episode's rows


# ---------------------------------------------------------------------- real runs
SPACES_ONLY = ("env.id=null", "env.observation_space={type: Box, shape: [4]}",
               "env.action_space={type: Discrete, n: 2}")


class ServerRun:
    """``python -m rlrun ... rollout=server rollout.server.port=0`` in ``cwd``; the address is read
    from the line the server prints (``endpoints`` lines with policy servers on Ray workers)."""

    def __init__(self, cwd: Path, *args: str, port: int = 0, endpoints: int = 1) -> None:
        self.cwd = cwd
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, "-m", "rlrun", *args, "rollout=server",
                                      f"rollout.server.port={port}"],
                                     cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.stderr: list[str] = []
        self.addresses: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(self.addresses) < endpoints:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.stderr.append(line)
            if m := re.search(r"policy server listening on (http://\S+)", line):
                self.addresses.append(m[1])
        assert len(self.addresses) == endpoints, "".join(self.stderr)
        self.address = self.addresses[0]
        self.stdout: list[str] = []
        # both pipes drained by threads of their own (communicate() would race the stderr reader)
        self._drains = [threading.Thread(target=lambda pipe=pipe, into=into: into.extend(pipe), daemon=True)
                        for pipe, into in ((self.proc.stderr, self.stderr), (self.proc.stdout, self.stdout))]
        for drain in self._drains:
            drain.start()
        self.token = (cwd / "server.token").read_text().strip()

    def driver(self, seed: int, *extra: str, address: str | None = None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(DRIVER), "--address", address or self.address, "--token-file",
                                 str(self.cwd / "server.token"), "--seed", str(seed), *extra], cwd=self.cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})

    def wait(self, timeout: float = 600, code: int = 0) -> str:
        self.proc.wait(timeout=timeout)
        for drain in self._drains:
            drain.join(timeout=10)
        assert self.proc.returncode == code, "".join(self.stderr)[-3000:]
        return "".join(self.stdout)

    def metric(self, key: str) -> list[float]:
        return run_metric(self.cwd, key)


def run_metric(cwd: Path, key: str) -> list[float]:
    """``key``'s history in the only MLflow run of ``cwd/mlflow.db``."""
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def finished(driver: subprocess.Popen) -> dict:
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_ppo_learns_from_four_clients_running_the_policy_themselves(tmp_path):
    """Local inference: the clients pull the weights, act without a round trip, upload their rows
    (two of them play 8 episodes side by side with one batched forward pass a step)."""
    run = ServerRun(tmp_path, "+experiment=ppo_cartpole", "tracking.log_model=false")
    drivers = [run.driver(seed, "--inference", "local", "--episodes", "8" if seed >= 2 else "1") for seed in range(4)]
    out = run.wait()
    reports = [finished(d) for d in drivers]
    assert all(r["run_finished"] for r in reports), reports
    returns, steps = run.metric("rollout/episode_return_mean"), run.metric("timesteps_total")
    assert returns[-1] >= 475 and steps[-1] <= 150_000, (returns[-1], steps[-1], out[-1500:])


def bad_requests(address: str, token: str) -> list[tuple[int, str]]:
    """Malformed, unauthenticated, oversized and out-of-order requests; (status, error) of each."""
    host, port = address.removeprefix("http://").split(":")
    auth = {"Authorization": f"Bearer {token}"}
    cases = [
        ("POST", "/v1/get_action", b'{"episode_id": "nope", "observation": [0, 0, 0, 0]}', auth),  # unknown episode
        ("POST", "/v1/get_action", b'{"episode_id": "x", "observation": [0, 0, 0, 0]}', {}),  # no token
        ("POST", "/v1/get_action", b"{}", {"Authorization": "Bearer wrong"}),
        ("POST", "/v1/get_action", b"x" * 2_000_000, auth),  # oversized
        ("POST", "/v1/start_episode", b'{"episode_id": ' + b'"a' * 40 + b'"}', auth),
        ("POST", "/v1/log_returns", b'{"episode_id": "nope", "reward": 1}', auth),
        ("POST", "/v1/end_episode", b'{"episode_id": "nope", "observation": [0, 0, 0, 0]}', auth),
        ("POST", "/v2/get_action", b"{}", auth),
        ("GET", "/v1/get_action", b"", auth),
        ("POST", "/v1/get_action", b'{"episode_id": "e", "observation": [[0, 0, 0, 0]]}', auth),
        ("POST", "/v1/get_action", bytes(range(256)), auth),
    ]
    out = []
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    for method, path, body, headers in cases:
        conn.request(method, path, body, headers)
        resp = conn.getresponse()
        data = resp.read()
        out.append((resp.status, data.decode(errors="replace")))
        if resp.getheader("connection") == "close":
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
    # out of order: a reward before the first action, a second start of an open episode
    conn.request("POST", "/v1/start_episode", b'{"training_enabled": false}', auth)
    started = json.loads(conn.getresponse().read())
    if "episode_id" not in started:  # 410: the run has finished
        conn.close()
        return out
    eid = started["episode_id"].encode()
    conn.request("POST", "/v1/log_returns", b'{"episode_id": "' + eid + b'", "reward": 1}', auth)
    resp = conn.getresponse()
    out.append((resp.status, resp.read().decode()))
    conn.request("POST", "/v1/start_episode", b'{"episode_id": "order"}', auth)
    conn.getresponse().read()
    conn.request("POST", "/v1/log_returns", b'{"episode_id": "order", "reward": 1}', auth)
    resp = conn.getresponse()
    out.append((resp.status, resp.read().decode()))
    conn.request("POST", "/v1/start_episode", b'{"episode_id": "order"}', auth)
    resp = conn.getresponse()
    out.append((resp.status, resp.read().decode()))
    conn.close()
    return out


@pytest.mark.slow
def test_ppo_learns_from_four_remote_clients_while_10k_bad_requests_arrive(tmp_path):
    """The acceptance run: 4 client processes in remote mode (no torch imported) drive CartPole to a
    100-episode mean of 475 within 150k env steps and see a clean "run finished". Meanwhile a fuzzer
    sends over 10,000 malformed, unauthenticated, oversized and out-of-order requests: each gets a
    4xx, the server's memory does not grow, and training is not disturbed (it still meets the target)."""
    import psutil

    run = ServerRun(tmp_path, "+experiment=ppo_cartpole", "tracking.log_model=false")
    assert stat.S_IMODE((tmp_path / "server.token").stat().st_mode) == 0o600
    drivers = [run.driver(seed) for seed in range(4)]
    answers: list[tuple[int, str]] = []
    rss: list[float] = []

    def fuzz():
        server = psutil.Process(run.proc.pid)
        try:
            # 10,000 and a few more, then no more: they arrive while the run trains (here 10,200 in its
            # first 17 s of 27), and a fuzzer that ran on to the end took CPU from the training beside it
            while run.proc.poll() is None and len(answers) < 10_200:
                answers.extend(bad_requests(run.address, run.token))
                if len(answers) % 2000 < 15:
                    rss.append(server.memory_info().rss / 2**20)
        except (OSError, psutil.Error):
            pass  # the run has ended

    fuzzer = threading.Thread(target=fuzz, daemon=True)
    fuzzer.start()
    out = run.wait()
    fuzzer.join(timeout=60)
    reports = [finished(d) for d in drivers]
    assert all(r["run_finished"] for r in reports), reports  # a clean "run finished" answer
    assert not any(r["torch_imported"] for r in reports), reports
    returns, steps = run.metric("rollout/episode_return_mean"), run.metric("timesteps_total")
    assert returns[-1] >= 475 and steps[-1] <= 150_000, (returns[-1], steps[-1], out[-1500:])
    bad = [a for a in answers if not 400 <= a[0] < 500 or "\n" in a[1]]
    assert len(answers) >= 10_000 and not bad, (len(answers), bad[:3])
    assert {400, 401, 404, 405, 409, 413} <= {s for s, _ in answers}
    assert run.metric("server/rejected_requests")[-1] >= 10_000  # counted by the server (logged before the end)
    assert len(rss) >= 3 and max(rss[1:]) - rss[1] < 30, rss  # MiB, after the first 2,000 requests


# run inside a network namespace of its own (conftest.isolated): the trainer, its Ray workers and the
# clients, which reach the Ray workers' policy servers on that namespace's 127.0.0.1
ON_RAY_WORKERS = """
import json, socket, subprocess, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.test_serving import ServerRun, finished
cwd = Path({cwd!r})
args = ["+experiment=ppo_cartpole", "stop.timesteps_total=8192", "tracking.log_model=false", "rollout.num_workers=2"]
taken = socket.socket()
taken.bind(("127.0.0.1", 9901))  # worker 2's port (9900 + 1) is taken
taken.listen(1)
refused = subprocess.run([sys.executable, "-m", "rlrun", *args, "tracking=none", "rollout=server",
                          "rollout.server.port=9900"], cwd=cwd,
                         capture_output=True, text=True, env={{**__import__("os").environ, "PYTHONPATH": {repo!r}}})
taken.close()
token_left = (cwd / "server.token").exists()
run = ServerRun(cwd, *args, port=9900, endpoints=2)
# two clients on each endpoint: remote inference on worker 1's, local inference on worker 2's
drivers = [run.driver(s, *(("--inference", "local") if i else ()), address=a)
           for i, a in enumerate(run.addresses) for s in (0, 1)]
run.wait()
print(json.dumps({{"refused": [refused.returncode, refused.stderr], "token_left": token_left,
                  "addresses": run.addresses, "reports": [finished(d) for d in drivers]}}))
"""


@pytest.mark.slow
def test_policy_servers_on_two_ray_workers(tmp_path):
    """``rollout.num_workers=2``: each Ray worker serves its own endpoint (port, port + 1) with the
    driver's token; clients of both train one policy, get a clean "run finished", and the servers'
    counters are summed over the workers. A taken port of worker 2 is one line, exit 2, and leaves
    no fresh token behind."""
    from .conftest import isolated

    code = ON_RAY_WORKERS.format(repo=str(REPO), cwd=str(tmp_path))
    proc = subprocess.run(isolated([sys.executable, "-c", code]), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    code_, err = out["refused"]
    assert code_ == 2 and err.strip().splitlines() == [
        "rlrun: error: rollout.server: cannot listen on 127.0.0.1:9901 (Address already in use); choose another "
        "rollout.server.port (0 picks a free one) (Ray worker 2 of rollout.num_workers listens on "
        "rollout.server.port + 1)"], err
    assert not out["token_left"]
    assert out["addresses"] == ["http://127.0.0.1:9900", "http://127.0.0.1:9901"]
    reports = out["reports"]
    assert all(r["run_finished"] and r["steps"] > 0 for r in reports), reports
    assert run_metric(tmp_path, "workers/num_healthy")[-1] == 2
    assert run_metric(tmp_path, "timesteps_total")[-1] >= 8192
    # remote-inference requests of worker 1's two clients alone are one per step at least, less the ones
    # sent after the last iteration's counters were read (the clients go on while the last batch trains:
    # 74 of 4,610 once, on a loaded machine)
    assert run_metric(tmp_path, "server/requests")[-1] >= 0.9 * (reports[0]["steps"] + reports[1]["steps"])
    assert not run_metric(tmp_path, "workers/num_abandoned_episodes")  # logged once it is not 0
    assert run_metric(tmp_path, "server/open_episodes")[-1] >= 4  # the four clients' episodes, summed


@pytest.mark.slow
def test_a_client_killed_mid_episode_loses_only_that_episode(tmp_path):
    # no env on the server's side (spaces declared): the clients own the only ones
    run = ServerRun(tmp_path, "+experiment=ppo_cartpole", "stop.timesteps_total=8192", "tracking.log_model=false",
                    "rollout.server.episode_timeout_s=1", *SPACES_ONLY)
    victim = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from rlrun.app.client import PolicyClient
c = PolicyClient({run.address!r}, token={run.token!r})
e = c.start_episode()
for _ in range(20):
    c.get_action(e, [0.0, 0.0, 0.0, 0.0])
print("mid-episode", flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert victim.stdout.readline().strip() == "mid-episode"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    driver = run.driver(1, "--episodes", "4")  # remote: a batch request for four episodes' actions
    run.wait()
    report = finished(driver)
    assert report["run_finished"] and not report["torch_imported"]
    assert run.metric("workers/num_abandoned_episodes")[-1] == 1
    # every episode the surviving client finished was trained on and counted, except the ones that
    # ended while the last batch trained (rows past the last cut are never trained on): two per env slot,
    # plus the client's episode rate times the last iteration's time (16 of 288 once under CI load)
    times = run.metric("time_total_s")
    last_iteration_s = times[-1] - times[-2] if len(times) > 1 else times[-1]
    allowed = 8 + report["episodes"] / report["seconds"] * last_iteration_s
    assert run.metric("episodes_total")[-1] >= report["episodes"] - allowed, \
        (run.metric("episodes_total"), times, report)


@pytest.mark.slow
def test_a_resumed_run_tells_its_clients_to_start_new_episodes(tmp_path):
    """SIGTERM mid-run: clients get "retry" (503) instead of "finished", keep retrying while the run is
    down, and the resumed run's server (a new id) tells them their episode is gone; they start new
    ones and the resumed run trains to its budget."""
    port = free_port()
    args = ["+experiment=ppo_cartpole", "tracking.log_model=false", "stop.timesteps_total=8192",
            "checkpoint.every_n_iters=1", "++stop={rollout/episode_return_mean: null}"]
    first = ServerRun(tmp_path, *args, port=port)
    driver = first.driver(0)
    # a second client held mid-episode across the cut: the driver's own cut may fall between two of its
    # episodes (its retried call a start_episode, which the new server answers), so its restarts are 0 or 1
    held = subprocess.Popen([sys.executable, "-c", f"""
import sys
from rlrun.app.client import PolicyClient, ServerRestarted
c = PolicyClient({first.address!r}, token_file={str(tmp_path / "server.token")!r})
e = c.start_episode()
for _ in range(3):
    c.get_action(e, [0.0, 0.0, 0.0, 0.0])
print("mid-episode", flush=True)
sys.stdin.readline()
try:
    c.get_action(e, [0.0, 0.0, 0.0, 0.0])
    print("answered")
except ServerRestarted as err:
    print("restarted:", err)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert held.stdout.readline().strip() == "mid-episode"
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("outputs/*/*/checkpoints/iter_000003")) and time.monotonic() < deadline:
        time.sleep(0.2)
    first.proc.send_signal(signal.SIGTERM)
    first.wait(timeout=120, code=143)  # SIGTERM: final checkpoint, exit 143
    assert driver.poll() is None and held.poll() is None  # not told the run had finished
    second = ServerRun(tmp_path, *args, "resume=latest", port=port)
    out, _ = held.communicate("go\n", timeout=60)  # its episode's next step goes to the resumed run's server
    assert out.startswith("restarted: the policy server restarted; get_action: unknown or ended episode"), out
    second.wait()
    report = finished(driver)
    assert report["run_finished"] and report["restarts"] in (0, 1), report
    assert second.metric("timesteps_total")[-1] >= 8192


def test_server_settings_are_checked_before_training(tmp_path):
    p = run_cli(["+experiment=ppo_cartpole", "rollout=server", "rollout.batch_mode=complete_episodes"], tmp_path)
    assert p.returncode == 2 and "rollout.batch_mode: rollout=server hands out episodes" in p.stderr, p.stderr
    token = tmp_path / "open.token"
    token.write_text("x" * 32)
    token.chmod(0o644)
    p = run_cli(["+experiment=ppo_cartpole", "rollout=server", "rollout.server.port=0",
                 f"rollout.server.token_file={token}", "tracking=none"], tmp_path)
    assert p.returncode == 2 and "readable or writable by others (mode 0644)" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    import socket

    with socket.socket() as taken:  # the port is in use: one line, and no fresh token file left behind
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = run_cli(["+experiment=ppo_cartpole", "rollout=server", f"rollout.server.port={port}", "tracking=none",
                     "rollout.server.token_file=fresh.token"], tmp_path)
    assert p.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "fresh.token").exists(), p.stderr


@pytest.mark.parametrize("share", [False, True])
def test_one_step_acting_matches_torch(share):
    """act_one (the server's and the local client's step) acts in numpy for the built-in MLP: the
    log-probability of a client's own action, values and logits are torch's, and sampled actions
    follow the policy's probabilities."""
    from rlrun.app.cli import compose
    from rlrun.sources.plugins import load_builtins
    from rlrun.sources.rollout_worker import make_policy_factory
    from rlrun.sources.serving.local import act_one

    load_builtins()
    cfg = compose(["+experiment=ppo_cartpole", f"model.vf_share_layers={str(share).lower()}"])
    policy = make_policy_factory(cfg)(OBS, ACT)["default_policy"]
    assert policy._numpy is not None
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    with torch.inference_mode():
        ref = policy.model(torch.as_tensor(obs))
        logp_ref = torch.log_softmax(ref.dist_inputs, -1).numpy()
    for i in range(5):
        for a in (0, 1):
            _, logp, value, logits = act_one(policy, obs[i], a)
            assert float(logp) == pytest.approx(float(logp_ref[i, a]), abs=1e-5)
            assert float(value) == pytest.approx(float(ref.values[i]), abs=1e-5)
            assert np.allclose(logits, ref.dist_inputs[i], atol=1e-5)
    p1 = np.exp(logp_ref[0, 1])
    assert np.mean([act_one(policy, obs[0])[0] for _ in range(20_000)]) == pytest.approx(p1, abs=0.015)
