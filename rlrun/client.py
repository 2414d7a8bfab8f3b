"""PolicyClient: drive episodes of a run started with ``rollout=server`` from any Python process.

    from rlrun.client import PolicyClient
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
``upload_rows`` steps and at its end: no round trip per step. It pulls new weights when an upload's
answer says the learner has newer ones, and at least every ``update_interval_s`` seconds. That mode
imports torch and rlrun's policy code.

In remote mode (the default) it needs only the standard library and numpy (no torch): it speaks the
JSON protocol of ``rlrun/serving/protocol.py`` over one keep-alive HTTP connection per thread, so
several threads may drive episodes at once. A refused connection or a busy server (503) is retried with
exponential backoff for up to ``retry_s`` seconds. When the run ends every call raises
``RunFinished``; when the server restarted (a resumed run) calls on episodes it no longer knows
raise ``ServerRestarted``: start new episodes.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np

from rlrun.serving.wire import PROTOCOL, SERVER_HEADER, encode_array

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
                 update_interval_s: float = 10.0, upload_rows: int = 64) -> None:
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
        self._policy_copy: Any = None  # rlrun.serving.local.LocalPolicy
        self._pulled = 0.0
        self._server_version = 0  # the newest weights the server has announced
        self._rows: dict[str, list[list[Any]]] = {}  # local mode: recorded rows not yet uploaded, per episode

    # ------------------------------------------------------------------ the classic calls
    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        eid = str(self._call("start_episode", {"episode_id": episode_id, "training_enabled": training_enabled})
                  ["episode_id"])
        if self.inference == "local":
            with self._lock:
                self._rows[eid] = []
        return eid

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """The policy's action for ``observation`` (an int for a Discrete space, else a numpy array)."""
        if self.inference == "local":
            return self._act_locally(episode_id, observation, None)
        a = self._call("get_action", self._step(episode_id, observation))["action"]
        return np.asarray(a, dtype=np.float32) if isinstance(a, list) else a

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an action the client chose itself (off-policy data)."""
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
        if self.inference == "local":
            self._upload(episode_id, observation, "truncated" if truncated else "terminated")
            return
        self._call("end_episode", {**self._step(episode_id, observation), "truncated": bool(truncated)})

    # ------------------------------------------------------------------ local inference
    def _act_locally(self, episode_id: str, observation: Any, action: Any) -> Any:
        policy = self._policy()
        with self._lock:
            rows = self._rows.get(episode_id)
        if rows is None:
            raise RequestRejected(404, f"unknown or ended episode '{episode_id}' (start_episode first)")
        if len(rows) >= self.upload_rows:
            self._upload(episode_id, observation, None)
        chosen, logp, value, dist = policy.act(observation, action)
        with self._lock:
            self._rows[episode_id].append([np.asarray(observation, dtype=policy.obs_space.dtype), chosen, logp,
                                           value, dist, 0.0])
        if action is not None:
            return None
        space = policy.action_space
        return np.clip(chosen, space.low, space.high) if hasattr(space, "low") else int(chosen)

    def _policy(self) -> Any:
        now = time.monotonic()
        current = self._policy_copy is not None and self._policy_copy.version >= self._server_version
        if current and now - self._pulled < self.update_interval_s:
            return self._policy_copy
        self._pulled = now
        if self._policy_copy is None:
            from rlrun.serving.local import LocalPolicy  # torch: local mode only

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
        answer = self._call("samples", {"episode_id": episode_id, "end": end,
                                        "next_observation": _plain(np.asarray(next_obs)),
                                        "columns": {k: encode_array(v) for k, v in columns.items()}})
        self._server_version = int(answer.get("version", 0))

    def _step(self, episode_id: str, observation: Any) -> dict[str, Any]:
        with self._lock:
            reward = self._rewards.pop(episode_id, 0.0)
        msg = {"episode_id": episode_id, "observation": _plain(observation)}
        return {**msg, "reward": reward} if reward else msg

    def info(self) -> dict[str, Any]:
        """The server's protocol version and spaces."""
        return self._call("info", {})

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ------------------------------------------------------------------ transport
    def _call(self, command: str, message: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(message).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                status, payload, server_id = self._post(f"/v{PROTOCOL}/{command}", body, headers)
            except RETRY_ERRORS as e:
                self.close()
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
            if status == 410:
                raise RunFinished(reason or "the run has finished")
            if status == 404 and restarted:
                raise ServerRestarted(f"the policy server restarted; {reason}")
            if status == 503 and time.monotonic() + delay <= deadline:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            raise RequestRejected(status, reason)

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


def _plain(v: Any) -> Any:
    """numpy values -> JSON values."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v
