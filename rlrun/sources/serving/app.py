"""The policy server's HTTP surface: an ASGI application served by uvicorn (HTTP parsed by
httptools) in a daemon thread of the trainer process.

Why uvicorn rather than the standard library's threaded server: one event-loop thread serves every
client over keep-alive connections (a thread per connection would compete with the learner for the
GIL on 2 cores), it caps concurrent connections (``max_clients``), and its HTTP parsing is
maintained and fast. The application itself is the plain ASGI callable below rather than a
starlette app: there is one route, and a request round trip (client and server in one process,
``get_action`` on a trivial policy) took 397 us with starlette and 358 us without (500 us with
uvicorn's pure-Python h11 parser instead of httptools). The listening socket is bound here first,
so a port in use is one clear error before training starts."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from rlrun.config.typed import ConfigError
from rlrun.sources.serving.episodes import EpisodeTable
from rlrun.sources.serving.protocol import RequestError, action_json, decode
from rlrun.sources.serving.wire import PREFIX, PROTOCOL, SERVER_HEADER

log = logging.getLogger("rlrun")


class PolicyServer:
    def __init__(self, host: str, port: int, token: str, table: EpisodeTable, spaces: tuple[Any, Any],
                 info: dict[str, Any], max_clients: int, max_request_bytes: int,
                 policy: Callable[[int | None], dict[str, Any]] | None = None, dist_size: int = 0) -> None:
        self.table = table
        self.spaces = spaces
        self.info = info
        self.policy = policy  # version -> the ``policy`` answer (local inference)
        self.dist_size = dist_size
        self.max_request_bytes = max_request_bytes
        self.server_id = uuid.uuid4().hex[:16]
        self._expected = f"Bearer {token}".encode()
        self.requests = 0
        self.rejected = 0
        self._sock = _bind(host, port)
        self.address = f"http://{host}:{self._sock.getsockname()[1]}"
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._max_clients = max_clients

    def start(self) -> None:
        import uvicorn

        config = uvicorn.Config(self, log_config=None, log_level="error", access_log=False, lifespan="off",
                                limit_concurrency=self._max_clients, timeout_keep_alive=60)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="rlrun-policy-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError(f"the policy server did not start on {self.address}")

    def stop(self, grace_s: float) -> None:
        """Answer 410 "run finished" for ``grace_s`` seconds, then close."""
        self.table.finish()
        if self._server is not None and self._thread is not None:
            time.sleep(grace_s)
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._sock.close()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI application: one request -> one JSON answer."""
        if scope["type"] != "http":
            return
        self.requests += 1
        status, answer = 200, {}
        try:
            answer = await self._answer(scope, receive)
        except RequestError as e:
            status, answer = e.status, {"error": e.reason}
        except Exception as e:  # a bug here must not stop training: answer 500 and log it
            log.exception("policy server: request failed")
            status, answer = 500, {"error": f"internal error: {type(e).__name__}"}
        if status != 200:
            self.rejected += 1
        data = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
            (SERVER_HEADER.encode(), self.server_id.encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _answer(self, scope: dict[str, Any], receive: Any) -> dict[str, Any]:
        path = str(scope["path"])
        if not path.startswith(PREFIX):
            raise RequestError(404, f"unknown path '{path[:40]}'; requests go to {PREFIX}<command> "
                                    f"(protocol version {PROTOCOL})")
        if scope["method"] != "POST":
            raise RequestError(405, f"{scope['method'][:10]} {path[:40]}: every command is a POST")
        headers = dict(scope["headers"])
        if not hmac.compare_digest(headers.get(b"authorization", b""), self._expected):
            raise RequestError(401, "missing or wrong token (Authorization: Bearer <token>)")
        body = await self._body(headers.get(b"content-length"), receive)
        command = path[len(PREFIX):]
        fields = decode(command, body, *self.spaces, dist_size=self.dist_size)
        if command in ("get_action", "log_action", "samples", "batch"):
            while self.table.backlogged:  # a train batch waits: let the trainer take it first
                await asyncio.sleep(0.002)
        return self._dispatch(command, fields)

    async def _body(self, declared: bytes | None, receive: Any) -> bytes:
        limit = self.max_request_bytes
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise RequestError(413, f"body of {declared[:20].decode(errors='replace')} bytes; the limit is "
                                    f"rollout.server.max_request_bytes={limit}")
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError(400, "the client disconnected mid-request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"body over rollout.server.max_request_bytes={limit}")
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    def _dispatch(self, command: str, f: dict[str, Any]) -> dict[str, Any]:
        t = self.table
        if command == "batch":  # in order; the first refusal stops it (protocol.py)
            answers = []
            for i, (cmd, fields) in enumerate(f["requests"]):
                try:
                    answers.append(self._dispatch(cmd, fields))
                except RequestError as e:
                    self.rejected += 1
                    return {"answers": answers, "failed": {"index": i, "status": e.status,
                                                           "error": f"requests[{i}] {cmd}: {e.reason}"}}
            return {"answers": answers}
        if command == "start_episode":
            return {"episode_id": t.start(f.get("episode_id"), f.get("training_enabled", True))}
        if command == "get_action":
            return {"action": action_json(t.act(f["episode_id"], f["observation"], None, f.get("reward", 0.0)),
                                          self.spaces[1])}
        if command == "log_action":
            t.act(f["episode_id"], f["observation"], f["action"], f.get("reward", 0.0))
        elif command == "log_returns":
            t.log_returns(f["episode_id"], f["reward"])
        elif command == "end_episode":
            t.end(f["episode_id"], f["observation"], f.get("truncated", False), f.get("reward", 0.0))
        elif command == "samples":
            t.add_rows(f["episode_id"], f["columns"], f["next_observation"], f["end"])
            if self.policy is not None:  # the weights' version: the client pulls newer ones at once
                return {"version": self.policy(-1)["version"]}
        elif command in ("info", "policy"):
            t.check_running()
            if command == "info":
                return self.info
            if self.policy is None:
                raise RequestError(404, "policy: this server does not serve weights")
            return self.policy(f.get("version"))
        return {}


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: uvicorn writes an answer's headers and body separately, and
    # with Nagle's algorithm the body then waits for the client's delayed ACK (44 ms per request here)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"rollout.server: cannot listen on {host}:{port} ({e.strerror or e}); "
                          "choose another rollout.server.port (0 picks a free one)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
