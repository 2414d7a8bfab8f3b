"""The policy server's message format, version 1: JSON over HTTP, never pickle.

Every request is ``POST /v1/<command>`` with ``Authorization: Bearer <token>`` and a JSON object
body; every answer is a JSON object. Commands and their fields (all others are refused):

    start_episode  {episode_id?: str | null, training_enabled?: bool}     -> {episode_id}
    get_action     {episode_id, observation, reward?}                     -> {action}
    log_action     {episode_id, observation, action, reward?}             -> {}
    log_returns    {episode_id, reward: float, info?: object | null}      -> {}
    end_episode    {episode_id, observation, truncated?: bool, reward?}   -> {}
    info           {}                                                     -> {protocol, observation_space, ...}
    policy         {version?: int}                                        -> {version, config?, weights?}
    samples        {episode_id, columns, next_observation, end?}          -> {version}
    batch          {requests: [{command, ...its fields}, ...]}            -> {answers: [...], failed?}

``policy`` and ``samples`` serve local inference (the client runs the policy itself): ``policy``
returns the run's config and the weights (each ``{shape, dtype, data: base64 of the raw
little-endian values}``), or only ``version`` when the client already has it. ``samples`` uploads
finished rows of one episode: ``columns`` maps each of ``SAMPLE_COLUMNS`` to base64 raw values (obs
in the observation space's dtype, actions int64 or float32, the rest float32), all with the same
number of rows; ``next_observation`` is the observation after the last row; ``end`` is null (the
episode goes on), ``"terminated"`` or ``"truncated"``. Its answer names the current weights'
version, so a client pulls new weights as soon as the learner has them.

``batch`` carries up to ``MAX_BATCH`` requests of the episode commands (start_episode, get_action,
log_action, log_returns, end_episode, samples) in one round trip: a client driving many episodes
sends one request where it would send dozens. All are checked before any runs (one malformed
request refuses the whole batch with 400); they then run in order. ``answers`` holds the answer of
each request that ran; the first one the server refuses stops the batch, and ``failed`` says which
and why: ``{index, status, error}`` (the ones before it took effect, so after a 503 a client
resends from ``index``).

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

import base64
import json
import math
import re
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.sources.serving.wire import PREFIX as PREFIX  # re-exported
from rlrun.sources.serving.wire import PROTOCOL as PROTOCOL
from rlrun.sources.serving.wire import SERVER_HEADER as SERVER_HEADER

EPISODE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
FIELDS: dict[str, dict[str, bool]] = {  # command -> {field: required}
    "start_episode": {"episode_id": False, "training_enabled": False},
    "get_action": {"episode_id": True, "observation": True, "reward": False},
    "log_action": {"episode_id": True, "observation": True, "action": True, "reward": False},
    "log_returns": {"episode_id": True, "reward": True, "info": False},
    "end_episode": {"episode_id": True, "observation": True, "truncated": False, "reward": False},
    "info": {},
    "policy": {"version": False},
    "samples": {"episode_id": True, "columns": True, "next_observation": True, "end": False},
    "batch": {"requests": True},
}
BATCHABLE = ("start_episode", "get_action", "log_action", "log_returns", "end_episode", "samples")
MAX_BATCH = 1024
SAMPLE_COLUMNS = ("obs", "actions", "rewards", "action_logp", "vf_preds", "action_dist_inputs")
MAX_SAMPLE_ROWS = 100_000


class RequestError(Exception):
    """A request the server refuses: HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def decode(command: str, body: bytes, obs_space: gym.Space, action_space: gym.Space,
           dist_size: int = 0) -> dict[str, Any]:
    """The validated fields of one request body (observations and actions as numpy values;
    ``dist_size``: the policy's action-distribution inputs per row, for ``samples``)."""
    if command not in FIELDS:
        raise RequestError(404, f"unknown command '{command[:40]}'; known: {', '.join(FIELDS)}")
    try:
        msg = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"body is not JSON ({str(e)[:80]})") from None
    if not isinstance(msg, dict):
        raise RequestError(400, f"body must be a JSON object, got {type(msg).__name__}")
    if command == "batch":
        return {"requests": _batch_of(msg, obs_space, action_space, dist_size)}
    return _fields_of(command, msg, obs_space, action_space, dist_size)


def _batch_of(msg: dict[str, Any], obs_space: gym.Space, action_space: gym.Space,
              dist_size: int) -> list[tuple[str, dict[str, Any]]]:
    """``[(command, fields)]`` of a batch, every request checked."""
    if set(msg) != {"requests"}:
        raise RequestError(400, f"batch: the body is {{\"requests\": [...]}}, got fields {sorted(map(str, msg))[:5]}")
    requests = msg["requests"]
    if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_BATCH:
        raise RequestError(400, f"batch: requests must be a list of 1 to {MAX_BATCH} requests, got "
                                f"{_show(requests) if not isinstance(requests, list) else f'{len(requests)} requests'}")
    out = []
    for i, r in enumerate(requests):
        command = r.get("command") if isinstance(r, dict) else None
        if command not in BATCHABLE:
            raise RequestError(400, f"batch: requests[{i}] needs a command among {', '.join(BATCHABLE)}, got "
                                    f"{_show(command)}")
        try:
            out.append((command, _fields_of(command, {k: v for k, v in r.items() if k != "command"}, obs_space,
                                            action_space, dist_size)))
        except RequestError as e:
            raise RequestError(e.status, f"batch: requests[{i}]: {e.reason}") from None
    return out


def _fields_of(command: str, msg: dict[str, Any], obs_space: gym.Space, action_space: gym.Space,
               dist_size: int) -> dict[str, Any]:
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
    if "version" in msg:
        v = msg["version"]
        if isinstance(v, bool) or not isinstance(v, int):
            raise RequestError(400, f"{command}: version must be an integer, got {_show(v)}")
        out["version"] = v
    if command == "samples":
        out["next_observation"] = value_of(msg["next_observation"], obs_space, "samples: next_observation")
        end = msg.get("end")
        if end not in (None, "terminated", "truncated"):
            raise RequestError(400, f"samples: end must be null, \"terminated\" or \"truncated\", got {_show(end)}")
        out["end"] = end
        out["columns"] = columns_of(msg["columns"], obs_space, action_space, dist_size)
    return out


def column_specs(obs_space: gym.Space, action_space: gym.Space, dist_size: int) -> dict[str, tuple[Any, tuple]]:
    """``samples`` columns: name -> (dtype, shape of one row)."""
    discrete = isinstance(action_space, gym.spaces.Discrete)
    return {"obs": (np.dtype(obs_space.dtype), tuple(obs_space.shape or ())),
            "actions": (np.dtype(np.int64 if discrete else np.float32), tuple(action_space.shape or ())),
            "rewards": (np.dtype(np.float32), ()), "action_logp": (np.dtype(np.float32), ()),
            "vf_preds": (np.dtype(np.float32), ()), "action_dist_inputs": (np.dtype(np.float32), (dist_size,))}


def columns_of(cols: Any, obs_space: gym.Space, action_space: gym.Space, dist_size: int) -> dict[str, np.ndarray]:
    """Uploaded rows, checked: every column present, the same number of rows, finite, actions in the space."""
    if not isinstance(cols, dict) or set(cols) != set(SAMPLE_COLUMNS):
        got = sorted(cols) if isinstance(cols, dict) else _show(cols)
        raise RequestError(400, f"samples: columns must be an object with exactly {', '.join(SAMPLE_COLUMNS)}; "
                                f"got {got}")
    out, rows = {}, None
    for name, (dtype, shape) in column_specs(obs_space, action_space, dist_size).items():
        data = cols[name]
        try:
            raw = base64.b64decode(data, validate=True) if isinstance(data, str) else None
        except ValueError:
            raw = None
        size = dtype.itemsize * math.prod(shape)
        if raw is None or len(raw) % size:
            raise RequestError(400, f"samples: column '{name}' must be base64 of {dtype} values, {size} bytes a row")
        a = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(-1, *shape)
        if rows is None:
            rows = len(a)
        if len(a) != rows or not 0 < rows <= MAX_SAMPLE_ROWS:
            raise RequestError(400, f"samples: column '{name}' has {len(a)} rows, others {rows} (1 to "
                                    f"{MAX_SAMPLE_ROWS} rows a request)")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise RequestError(400, f"samples: column '{name}' holds a non-finite number")
        out[name] = a
    acts = out["actions"]
    if isinstance(action_space, gym.spaces.Discrete) and not ((acts >= action_space.start).all()
                                                              and (acts < action_space.start + action_space.n).all()):
        raise RequestError(400, f"samples: an action is outside [{action_space.start}, "
                                f"{action_space.start + action_space.n})")
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


def action_json(action: Any, space: gym.Space) -> Any:
    """An action as JSON; a Box action clipped to the space's bounds (training keeps the sample)."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high).tolist()
    return int(action)


def _show(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, bytes) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
