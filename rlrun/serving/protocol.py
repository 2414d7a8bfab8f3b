"""The policy server's message format, version 1: JSON over HTTP, never pickle.

Every request is ``POST /v1/<command>`` with ``Authorization: Bearer <token>`` and a JSON object
body; every answer is a JSON object. Commands and their fields (all others are refused):

    start_episode  {episode_id?: str | null, training_enabled?: bool}     -> {episode_id}
    get_action     {episode_id, observation, reward?}                     -> {action}
    log_action     {episode_id, observation, action, reward?}             -> {}
    log_returns    {episode_id, reward: float, info?: object | null}      -> {}
    end_episode    {episode_id, observation, truncated?: bool, reward?}   -> {}
    info           {}                                                     -> {protocol, observation_space, ...}

``reward`` on get_action, log_action and end_episode is the reward of the episode's previous action
(what ``log_returns`` would have sent): ``PolicyClient`` sends it that way, one request per step
instead of two.

Observations and actions are (nested) JSON lists of the space's shape, or an int for a Discrete
space. Errors are 4xx with ``{"error": "<one line>"}``: 400 malformed, 401 token, 404 unknown
command or episode, 409 out of order (e.g. an action before ``start_episode``), 410 the run has
finished, 413 too large, 503 too many open episodes. Every answer carries the header
``x-rlrun-server``: an id that changes when the server restarts.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import gymnasium as gym
import numpy as np

PROTOCOL = 1
PREFIX = f"/v{PROTOCOL}/"
SERVER_HEADER = "x-rlrun-server"
EPISODE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
FIELDS: dict[str, dict[str, bool]] = {  # command -> {field: required}
    "start_episode": {"episode_id": False, "training_enabled": False},
    "get_action": {"episode_id": True, "observation": True, "reward": False},
    "log_action": {"episode_id": True, "observation": True, "action": True, "reward": False},
    "log_returns": {"episode_id": True, "reward": True, "info": False},
    "end_episode": {"episode_id": True, "observation": True, "truncated": False, "reward": False},
    "info": {},
}


class RequestError(Exception):
    """A request the server refuses: HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def decode(command: str, body: bytes, obs_space: gym.Space, action_space: gym.Space) -> dict[str, Any]:
    """The validated fields of one request body (observations and actions as numpy values)."""
    if command not in FIELDS:
        raise RequestError(404, f"unknown command '{command[:40]}'; known: {', '.join(FIELDS)}")
    try:
        msg = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"body is not JSON ({str(e)[:80]})") from None
    if not isinstance(msg, dict):
        raise RequestError(400, f"body must be a JSON object, got {type(msg).__name__}")
    fields = FIELDS[command]
    for key in msg:
        if key not in fields:
            raise RequestError(400, f"{command}: unknown field '{str(key)[:40]}'; known: {', '.join(fields) or 'none'}")
    for key, required in fields.items():
        if required and key not in msg:
            raise RequestError(400, f"{command}: field '{key}' is missing")
    out: dict[str, Any] = {}
    if "episode_id" in msg and (msg["episode_id"] is not None or command != "start_episode"):
        eid = msg["episode_id"]
        if not isinstance(eid, str) or not EPISODE_ID.match(eid):
            raise RequestError(400, f"{command}: episode_id must be 1-64 characters of A-Z a-z 0-9 _ . : -, got "
                                    f"{_show(eid)}")
        out["episode_id"] = eid
    for key in ("training_enabled", "truncated"):
        if key in msg:
            if not isinstance(msg[key], bool):
                raise RequestError(400, f"{command}: {key} must be true or false, got {_show(msg[key])}")
            out[key] = msg[key]
    if "observation" in msg:
        out["observation"] = value_of(msg["observation"], obs_space, f"{command}: observation")
    if "action" in msg:
        out["action"] = value_of(msg["action"], action_space, f"{command}: action")
    if "reward" in msg:
        r = msg["reward"]
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
            raise RequestError(400, f"{command}: reward must be a finite number, got {_show(r)}")
        out["reward"] = float(r)
    if "info" in msg and msg["info"] is not None and not isinstance(msg["info"], dict):
        raise RequestError(400, f"{command}: info must be a JSON object or null, got {_show(msg['info'])}")
    return out


def value_of(v: Any, space: gym.Space, what: str) -> Any:
    """A JSON value as an element of ``space`` (Box or Discrete), or RequestError naming the problem."""
    if isinstance(space, gym.spaces.Discrete):
        if isinstance(v, bool) or not isinstance(v, int) or not space.start <= v < space.start + space.n:
            raise RequestError(400, f"{what} must be an integer in [{space.start}, {space.start + space.n}), "
                                    f"got {_show(v)}")
        return int(v)
    assert isinstance(space, gym.spaces.Box)
    try:
        a = np.asarray(v, dtype=np.float64)
    except (ValueError, TypeError):
        raise RequestError(400, f"{what} must be a list of numbers of shape {list(space.shape)}, got {_show(v)}") \
            from None
    if a.shape != space.shape:
        raise RequestError(400, f"{what} must have shape {list(space.shape)}, got {list(a.shape)}")
    if not np.isfinite(a).all():
        raise RequestError(400, f"{what} must hold finite numbers, got {_show(v)}")
    return a.astype(space.dtype)


def space_json(space: gym.Space) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    assert isinstance(space, gym.spaces.Box)
    return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype)}


def action_json(action: Any, space: gym.Space) -> Any:
    """An action as JSON; a Box action clipped to the space's bounds (training keeps the sample)."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high).tolist()
    return int(action)


def _show(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, bytes) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
