"""PolicyClient: drive episodes of a run started with ``rollout=server`` from any Python process.

    from rlrun.app.client import PolicyClient
    client = PolicyClient("http://127.0.0.1:9900", token_file="server.token")
    eid = client.start_episode()
    obs, _ = env.reset()
    while True:
        action = client.get_action(eid, obs)            # or client.log_action(eid, obs, my_action)
        obs, reward, terminated, truncated, _ = env.step(action)
        client.log_returns(eid, reward)
        if terminated or truncated:
            client.end_episode(eid, obs, truncated=truncated)
            break

With ``inference="local"`` the client runs the policy itself and uploads each episode's rows every
``upload_rows`` steps and at its end: no round trip per step. Starts and uploads go out in order
from a background thread, so a step never waits for the network; what the server refuses there is
raised by the next call (``flush()`` waits for all of it). ``get_actions`` acts for many episodes
in one forward pass. It pulls new weights when an upload's
answer says the learner has newer ones, and at least every ``update_interval_s`` seconds. That mode
imports torch and rlrun's policy code.

In remote mode (the default) it needs only the standard library and numpy (no torch): it speaks the
JSON protocol of ``rlrun/sources/serving/protocol.py`` over one keep-alive HTTP connection per thread, so
several threads may drive episodes at once. A refused connection or a busy server (503) is retried with
exponential backoff for up to ``retry_s`` seconds. When the run ends every call raises
``RunFinished``; when the server restarted (a resumed run) calls on episodes it no longer knows
raise ``ServerRestarted``: start new episodes.
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlrun.envs.action_mask import packed, packed_rows
from rlrun.sources.serving.wire import PROTOCOL, SERVER_HEADER, encode_array

SEND_BATCH = 32  # local mode: queued starts and uploads sent together in one request, at most
RETRY_ERRORS = (OSError, http.client.HTTPException)  # refused, reset, timed out, cut mid-answer


class RunFinished(Exception):
    """The run has finished: the server takes no more experience."""


class ServerRestarted(Exception):
    """The server restarted (e.g. the run resumed); its episodes before the restart are gone."""


class RequestRejected(Exception):
    """The server refused a request (4xx/5xx); ``status`` and the server's one-line ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class PolicyClient:
    def __init__(self, address: str, token: str | None = None, token_file: str | Path | None = None,
                 inference: str = "remote", timeout_s: float = 30.0, retry_s: float = 60.0,
                 update_interval_s: float = 10.0, upload_rows: int = 64, max_pending_rows: int = 256) -> None:
        if inference not in ("remote", "local"):
            raise ValueError(f"PolicyClient: inference must be 'remote' or 'local', got {inference!r}")
        if (token is None) == (token_file is None):
            raise ValueError("PolicyClient: pass token= or token_file= (the run's rollout.server.token_file)")
        self.token = token if token is not None else Path(token_file).read_text().strip()  # type: ignore[arg-type]
        url = urllib.parse.urlsplit(address if "//" in address else f"http://{address}")
        if url.scheme != "http" or not url.hostname or not url.port:
            raise ValueError(f"PolicyClient: address must look like http://127.0.0.1:9900, got {address!r}")
        self.host, self.port = url.hostname, url.port
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.server_id: str | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._rewards: dict[str, float] = {}  # logged returns not yet sent, per episode
        self.inference = inference
        self.update_interval_s = update_interval_s
        self.upload_rows = upload_rows
        self._policy_copy: Any = None  # rlrun.app.client_local.LocalPolicy
        self._pulled = 0.0
        self._server_version = 0  # the newest weights the server has announced
        self._rows: dict[str, list[list[Any]]] = {}  # local mode: recorded rows not yet uploaded, per episode
        # local mode: start_episode and uploads go out in order from a background thread, so stepping
        # never waits for the server (that wait was 22% of a client's time, py-spy). At most
        # max_pending_rows rows are queued or in flight; past that the caller waits, as it does while
        # the server holds answers back for a waiting train batch. Rows acted with old weights stay
        # few: with 2,048 pending rows PPO missed its learning target (466 at 150k env steps), with
        # 512 one seed of three did; with 256 all three met it (87k-99k), at ~19k instead of ~24k env
        # steps/s for 4 clients x 32 episodes (experiments/external_env).
        self._outbox: queue.Queue[tuple[int, str, dict[str, Any], int] | None] = queue.Queue()
        self.max_pending_rows = max_pending_rows
        self._pending = threading.Condition()
        self._pending_rows = 0
        self._sender: threading.Thread | None = None
        self._failure: Exception | None = None  # what the sender met; raised by the next call
        self._generation = 0  # raising a failure starts a new one: what was queued before is dropped

    # ------------------------------------------------------------------ the classic calls
    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        if self.inference == "local":
            eid = episode_id or uuid.uuid4().hex
            self._send("start_episode", {"episode_id": eid, "training_enabled": training_enabled})
            with self._lock:
                self._rows[eid] = []
            return eid
        eid = str(self._call("start_episode", {"episode_id": episode_id, "training_enabled": training_enabled})
                  ["episode_id"])
        return eid

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """The policy's action for ``observation`` (an int for a Discrete space, else a numpy array)."""
        observation = packed(observation)  # a Dict with an action mask: rlrun/envs/action_mask.py
        if self.inference == "local":
            return self._act_locally(episode_id, observation, None)
        a = self._call("get_action", self._step(episode_id, observation))["action"]
        return np.asarray(a, dtype=np.float32) if isinstance(a, list) else a

    def get_actions(self, episode_ids: Sequence[str], observations: Any) -> np.ndarray:
        """``get_action`` for several episodes at once: ``observations`` is [N, ...], one per episode
        id; returns N actions. One round trip in remote mode (a ``batch`` request); with local
        inference one forward pass. A simulator that runs many episodes side by side should use it."""
        observations = packed_rows(observations)
        if self.inference != "local":
            answers = self._batch([("get_action", self._step(e, o))
                                   for e, o in zip(episode_ids, observations, strict=True)])
            return np.asarray([a["action"] for a in answers], dtype=None)
        self._raise_failure()
        policy = self._policy()
        obs = np.array(observations, dtype=policy.obs_space.dtype)
        if len(obs) != len(episode_ids):
            raise ValueError(f"get_actions: {len(episode_ids)} episode ids, {len(obs)} observations")
        for eid, o in zip(episode_ids, obs, strict=True):
            self._make_room(eid, o)
        actions, logp, values, dist = policy.act_batch(obs)
        with self._lock:
            for i, eid in enumerate(episode_ids):
                self._rows[eid].append([obs[i], actions[i], logp[i], values[i], dist[i], 0.0])
        space = policy.action_space
        return np.clip(actions, space.low, space.high) if hasattr(space, "low") else actions

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an action the client chose itself (off-policy data)."""
        observation = packed(observation)
        if self.inference == "local":
            self._act_locally(episode_id, observation, action)
            return
        self._call("log_action", {**self._step(episode_id, observation), "action": _plain(action)})

    def log_returns(self, episode_id: str, reward: float, info: dict[str, Any] | None = None) -> None:
        """Reward for the episode's last action (several calls add up). Sent with the episode's next
        call, so a step costs one request; ``info`` is not sent."""
        with self._lock:
            rows = self._rows.get(episode_id)
            if rows:  # local mode
                rows[-1][5] += float(reward)
            else:
                self._rewards[episode_id] = self._rewards.get(episode_id, 0.0) + float(reward)

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """The episode ended at ``observation``: terminated, or ``truncated`` (cut by a time limit)."""
        observation = packed(observation)
        if self.inference == "local":
            self._upload(episode_id, observation, "truncated" if truncated else "terminated")
            return
        self._call("end_episode", {**self._step(episode_id, observation), "truncated": bool(truncated)})

    # ------------------------------------------------------------------ local inference
    def _act_locally(self, episode_id: str, observation: Any, action: Any) -> Any:
        self._raise_failure()
        policy = self._policy()
        self._make_room(episode_id, observation)
        chosen, logp, value, dist = policy.act(observation, action)
        with self._lock:
            self._rows[episode_id].append([np.asarray(observation, dtype=policy.obs_space.dtype), chosen, logp,
                                           value, dist, 0.0])
        if action is not None:
            return None
        space = policy.action_space
        return np.clip(chosen, space.low, space.high) if hasattr(space, "low") else int(chosen)

    def _make_room(self, episode_id: str, observation: Any) -> None:
        """Local mode, before an episode's next row: upload its rows once ``upload_rows`` wait."""
        with self._lock:
            rows = self._rows.get(episode_id)
        if rows is None:
            raise RequestRejected(404, f"unknown or ended episode '{episode_id}' (start_episode first)")
        if len(rows) >= self.upload_rows:
            self._upload(episode_id, observation, None)

    def _policy(self) -> Any:
        now = time.monotonic()
        current = self._policy_copy is not None and self._policy_copy.version >= self._server_version
        if current and now - self._pulled < self.update_interval_s:
            return self._policy_copy
        self._pulled = now
        if self._policy_copy is None:
            from rlrun.app.client_local import LocalPolicy  # torch: local mode only

            self._policy_copy = LocalPolicy(self.info(), self._call("policy", {}))
        else:
            self._policy_copy.update(self._call("policy", {"version": self._policy_copy.version}))
        return self._policy_copy

    def _upload(self, episode_id: str, next_obs: Any, end: str | None) -> None:
        with self._lock:
            rows = self._rows.pop(episode_id, None) if end else self._rows.get(episode_id)
            if rows is None:
                raise RequestRejected(404, f"unknown or ended episode '{episode_id}' (start_episode first)")
            if end is None:
                self._rows[episode_id] = []
        if not rows:
            return
        p = self._policy_copy
        discrete = not hasattr(p.action_space, "low")
        obs, actions, logp, values, dist, rewards = zip(*rows, strict=True)
        columns = {"obs": np.asarray(obs, p.obs_space.dtype),
                   "actions": np.asarray(actions, np.int64 if discrete else np.float32),
                   "rewards": np.asarray(rewards, np.float32), "action_logp": np.asarray(logp, np.float32),
                   "vf_preds": np.asarray(values, np.float32), "action_dist_inputs": np.asarray(dist, np.float32)}
        self._send("samples", {"episode_id": episode_id, "end": end, "next_observation": _plain(np.asarray(next_obs)),
                               "columns": {k: encode_array(v) for k, v in columns.items()}}, len(rows))

    def _send(self, command: str, message: dict[str, Any], rows: int = 0) -> None:
        """Local mode: queue a request for the sender thread (after raising what it met before),
        waiting while ``max_pending_rows`` rows are queued or in flight."""
        self._raise_failure()
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, name="rlrun-client-sender", daemon=True)
            self._sender.start()
        with self._pending:
            while self._pending_rows and self._pending_rows + rows > self.max_pending_rows:
                self._pending.wait()
            self._pending_rows += rows
        self._outbox.put((self._generation, command, message, rows))

    def _send_loop(self) -> None:
        """Send what is queued, everything waiting at once as one ``batch`` request (in order)."""
        while True:
            items = [self._outbox.get()]
            while items[-1] is not None and len(items) < SEND_BATCH:
                try:
                    items.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            try:
                # what was queued before a failure was raised belongs to episodes that are gone
                live = [(it[1], it[2]) for it in items if it is not None and it[0] == self._generation]
                if live:
                    for (command, _), answer in zip(live, self._batch(live), strict=False):
                        if command == "samples":
                            self._server_version = int(answer.get("version", 0))
            except Exception as e:  # run finished, server restarted, refused: the caller's next call raises it
                with self._lock:
                    if items[0] is not None and items[0][0] == self._generation:
                        self._failure = self._failure or e
            finally:
                with self._pending:
                    self._pending_rows -= sum(it[3] for it in items if it is not None)
                    self._pending.notify_all()
                for _ in items:
                    self._outbox.task_done()
            if items[-1] is None:
                return

    def _raise_failure(self) -> None:
        with self._lock:
            failure, self._failure = self._failure, None
            if failure is not None:
                self._rows.clear()  # the server dropped or finished every episode of this client
                self._generation += 1
        if failure is not None:
            raise failure

    def flush(self) -> None:
        """Local mode: wait until every queued start and upload has been answered; raises what the
        server refused meanwhile (``RunFinished``, ``ServerRestarted``, ``RequestRejected``)."""
        if self._sender is not None:
            self._outbox.join()
        self._raise_failure()

    def _step(self, episode_id: str, observation: Any) -> dict[str, Any]:
        with self._lock:
            reward = self._rewards.pop(episode_id, 0.0)
        msg = {"episode_id": episode_id, "observation": _plain(observation)}
        return {**msg, "reward": reward} if reward else msg

    def info(self) -> dict[str, Any]:
        """The server's protocol version and spaces."""
        return self._call("info", {})

    def close(self) -> None:
        """Close this thread's connection; in local mode also stop the sender (after what it holds)."""
        if self._sender is not None and threading.current_thread() is not self._sender:
            self._outbox.put(None)
            self._sender.join(timeout=self.timeout_s)
            self._sender = None
        self._drop_connection()

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ------------------------------------------------------------------ transport
    def _batch(self, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """``[(command, message)]`` in one round trip (the protocol's ``batch``); their answers. A
        refusal raises as the single request's would; after a 503 the rest is resent with backoff."""
        answers: list[dict[str, Any]] = []
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            parts = ",".join(json.dumps({"command": c, **m}) for c, m in requests)
            before = self.server_id
            payload = self._call("batch", {}, f'{{"requests": [{parts}]}}'.encode())
            answers += payload.get("answers", [])
            failed = payload.get("failed")
            if failed is None:
                return answers
            i, status, reason = int(failed["index"]), int(failed["status"]), str(failed["error"])
            requests = requests[i:]
            if status == 503 and time.monotonic() + delay <= deadline:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            raise _refusal(status, reason, before is not None and before != self.server_id)

    def _call(self, command: str, message: dict[str, Any], body: bytes | None = None) -> dict[str, Any]:
        body = json.dumps(message).encode() if body is None else body
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                status, payload, server_id = self._post(f"/v{PROTOCOL}/{command}", body, headers)
            except RETRY_ERRORS as e:
                self._drop_connection()
                if time.monotonic() + delay > deadline:
                    raise ConnectionError(f"policy server {self.host}:{self.port}: {e} (retried for "
                                          f"{self.retry_s:g} s)") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            restarted = self.server_id is not None and server_id is not None and server_id != self.server_id
            self.server_id = server_id or self.server_id
            if status == 200:
                return payload
            reason = str(payload.get("error", "")) if isinstance(payload, dict) else ""
            if status == 503 and time.monotonic() + delay <= deadline:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            raise _refusal(status, reason, restarted)

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, str | None]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms delayed-ACK stalls
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        data = resp.read()
        try:
            payload = json.loads(data) if data else {}
        except ValueError:
            payload = {"error": data[:200].decode(errors="replace")}
        return resp.status, payload, resp.getheader(SERVER_HEADER)


def _refusal(status: int, reason: str, restarted: bool) -> Exception:
    """The exception for a refused request: the run finished, the server restarted, or rejected."""
    if status == 410:
        return RunFinished(reason or "the run has finished")
    if status == 404 and restarted:
        return ServerRestarted(f"the policy server restarted; {reason}")
    return RequestRejected(status, reason)


def _plain(v: Any) -> Any:
    """numpy values -> JSON values."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v
