"""ServerWorker: the rollout worker of ``rollout=server``. Its ``sample()`` returns rows of the
episodes external clients drive through the policy server, postprocessed exactly as a vector-env
worker's fragment (GAE, n-step, ...): each episode's segment is a one-column time-major fragment; a
truncated episode gets the worker's dummy row whose V bootstraps it, a cut one bootstraps from V of
the next observation.

The server answers from its own copy of the policy (in the HTTP thread), refreshed with the
learner's weights at every ``sample()``, the same schedule remote workers get weights on.

On Ray workers (``rollout.num_workers: N``) every remote worker is a ServerWorker with its own
endpoint, on ``port + i - 1`` for worker ``i`` (each on any free port with ``port: 0``); they use
the driver's token, and the trainer prints every address. The learner's local worker then serves
nothing.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.typed import ConfigError, to_dict
from rlrun.core.errors import WorkerFailure
from rlrun.data.batch import SampleBatch
from rlrun.data.spaces import space_to_json
from rlrun.envs.make import env_spaces
from rlrun.policy.policy import DEFAULT_POLICY_ID, PolicyMap
from rlrun.sources.callbacks import CallbackList
from rlrun.sources.serving.app import PolicyServer
from rlrun.sources.serving.episodes import EpisodeTable, Segment
from rlrun.sources.serving.local import act_one
from rlrun.sources.serving.wire import PROTOCOL, encode_array
from rlrun.sources.worker_base import VALID, EpisodeStats, PolicyFactory, WorkerBase, WorkerSpec, finish_fragment

SB = SampleBatch


class ServerWorker(WorkerBase):
    def __init__(self, spec: WorkerSpec, policy_factory: Callable[[gym.Space, gym.Space], PolicyMap]) -> None:
        self.spec = spec
        s = spec.rollout.server
        assert s is not None
        # declared, or from one env copy built for its spaces only: the clients own the environments
        self.obs_space, self.action_space = env_spaces(spec.env)
        for what, space in (("observation", self.obs_space), ("action", self.action_space)):
            if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete):
                raise ConfigError(f"rollout.server: env '{spec.env.id}' has a {type(space).__name__} {what} space; "
                                  "the policy server takes Box and Discrete spaces")
        self.policy_map = policy_factory(self.obs_space, self.action_space)
        self.policy = self.policy_map[DEFAULT_POLICY_ID]
        self._actor = policy_factory(self.obs_space, self.action_space)[DEFAULT_POLICY_ID]
        self._actor_lock = threading.Lock()
        self._version = 0  # of the weights the server acts with (local clients pull newer ones)
        self._sync_actor()
        self.callbacks = CallbackList(spec.callbacks)
        self._episodes = EpisodeStats([], [])
        self.explore = True
        self.env_steps_sampled = 0
        self.fragment_length = int(spec.rollout.rollout_fragment_length) * int(spec.rollout.num_envs_per_worker)
        token, token_path, fresh = server_token(spec)
        self.table = EpisodeTable(self._act, s.episode_timeout_s, s.max_episodes, max_backlog=self.fragment_length)
        info = {"protocol": PROTOCOL, "observation_space": space_to_json(self.obs_space),
                "action_space": space_to_json(self.action_space), "env_id": spec.env.id}
        self._config = to_dict(policy_factory.cfg) if isinstance(policy_factory, PolicyFactory) else None
        self._payload: dict[str, Any] = {}
        port = s.port + spec.worker_index - 1 if s.port and spec.worker_index else s.port
        if spec.server_port is not None:
            port = spec.server_port
        try:
            self.server = PolicyServer(s.host, port, token, self.table, (self.obs_space, self.action_space), info,
                                       s.max_clients, s.max_request_bytes, policy=self._policy_payload,
                                       dist_size=self.policy.dist_class.required_inputs(self.action_space))
        except ConfigError as e:  # e.g. the port is taken: a token nobody will use is not left behind
            if fresh:
                token_path.unlink(missing_ok=True)
            if spec.worker_index and s.port:
                raise ConfigError(f"{e} (Ray worker {spec.worker_index} of rollout.num_workers listens on "
                                  f"rollout.server.port + {spec.worker_index - 1})") from None
            raise
        self.server.start()
        if spec.worker_index == 0:  # a Ray worker's endpoint is printed by the trainer (announce_servers)
            announce_servers(spec, [self.server.address], token_path, on_ray=False)

    def _sync_actor(self) -> None:
        with self._actor_lock:
            self._actor.set_weights(self.policy.get_weights())
            self._actor.global_timestep = self.policy.global_timestep
            self._version += 1

    def _policy_payload(self, version: int | None) -> dict[str, Any]:
        """The ``policy`` answer: the run's config and the current weights (local inference)."""
        with self._actor_lock:
            if version in (self._version, -1):  # -1: only the version
                return {"version": self._version}
            if self._payload.get("version") != self._version:
                weights = {k: {"shape": list(v.shape), "dtype": str(v.dtype), "data": encode_array(v)}
                           for k, v in self._actor.get_weights().items()}
                self._payload = {"version": self._version, "config": self._config, "weights": weights,
                                 "global_timestep": self._actor.global_timestep}
            return self._payload

    def _act(self, obs: Any, action: Any) -> tuple[Any, float, float, np.ndarray]:
        """(action, logp, V(s), dist inputs) for one observation; the client's action if it chose one."""
        with self._actor_lock:
            return act_one(self._actor, np.asarray(obs), action, self.explore)

    def sample(self) -> SampleBatch:
        """At least ``rollout_fragment_length`` complete rows from the clients' episodes."""
        self._sync_actor()
        timeout = self.spec.rollout.sample_timeout_s
        try:
            segments = self.table.take(self.fragment_length, timeout)
        except TimeoutError as e:
            raise WorkerFailure(f"rollout=server: {e} (rollout.sample_timeout_s); are clients connected to "
                                f"{self.server.address}?") from None
        batch = self._fragments(segments)
        returns, lengths = self.table.pop_episodes()
        self._episodes.returns.extend(returns)
        self._episodes.lengths.extend(lengths)
        self.env_steps_sampled += len(batch)
        if self.callbacks:
            self.callbacks.call("on_sample_end", worker=self, samples=batch)
        return batch

    def _fragments(self, segments: list[Segment]) -> SampleBatch:
        """The segments as the columns of one ``[T, S]`` time-major fragment, postprocessed and
        flattened. Each column is right-aligned (its padding comes first), so its last row is the
        fragment's: a cut bootstraps from ``last_values`` exactly as a worker's fragment does, and no
        recursion ever runs from a real row into padding. A truncated segment ends with the dummy
        row whose V bootstraps it. (One postprocessing pass and one value forward for all segments:
        per segment they took 25% of the trainer's time with 128 local-inference episodes, py-spy.)"""
        p = self.policy
        lens = [len(seg.rows) + int(seg.truncated) for seg in segments]
        T, S = max(lens), len(segments)
        next_obs = np.stack([np.asarray(seg.next_obs, dtype=self.obs_space.dtype) for seg in segments])
        terminated = np.array([seg.terminated for seg in segments])
        truncated = np.array([seg.truncated for seg in segments])
        boot = np.where(terminated, 0.0, p.compute_values(next_obs, [])).astype(np.float32)
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        frag = SampleBatch({
            SB.OBS: np.zeros((T, S, *next_obs.shape[1:]), next_obs.dtype),
            SB.ACTIONS: np.zeros((T, S, *(self.action_space.shape or ())), np.int64 if discrete else np.float32),
            SB.REWARDS: np.zeros((T, S), np.float32), SB.ACTION_LOGP: np.zeros((T, S), np.float32),
            SB.VF_PREDS: np.zeros((T, S), np.float32), SB.TERMINATEDS: np.zeros((T, S), bool),
            SB.TRUNCATEDS: np.zeros((T, S), bool), SB.EPS_ID: np.zeros((T, S), np.int64),
            SB.ACTION_DIST_INPUTS: np.zeros((T, S, self.policy.dist_class.required_inputs(self.action_space)),
                                            np.float32),
            SB.T: np.zeros((T, S), np.int64), VALID: np.zeros((T, S), bool)})
        for s, seg in enumerate(segments):
            t, a = len(seg.rows), T - lens[s]  # rows a .. a + t - 1 are the segment's
            for key, column in zip((SB.OBS, SB.ACTIONS, SB.ACTION_LOGP, SB.VF_PREDS, SB.ACTION_DIST_INPUTS,
                                    SB.REWARDS), zip(*seg.rows, strict=True), strict=True):
                frag[key][a:a + t, s] = column
            frag[SB.EPS_ID][:, s] = seg.eps_id
            frag[SB.T][a:, s] = seg.t0 + np.arange(T - a)
            frag[VALID][a:a + t, s] = True
            frag[SB.TERMINATEDS][T - 1, s] = seg.terminated
            if seg.truncated:  # the dummy row: the final observation and its value
                frag[SB.TRUNCATEDS][T - 2, s] = True
                frag[SB.OBS][T - 1, s] = next_obs[s]
                frag[SB.VF_PREDS][T - 1, s] = boot[s]
        return finish_fragment(p, frag, next_obs, None, self.spec.record_next_obs,
                               np.where(terminated | truncated, 0.0, boot))

    def extra_metrics(self) -> dict[str, float]:
        return {"workers/num_abandoned_episodes": float(self.table.num_abandoned),
                "server/open_episodes": float(self.table.num_open), "server/requests": float(self.server.requests),
                "server/rejected_requests": float(self.server.rejected)}

    def address(self) -> str:
        return self.server.address

    def mark_interrupted(self) -> None:
        self.table.interrupted = True  # clients get 503 "retry" (the run may resume), not 410 "finished"

    def stop(self) -> None:
        s = self.spec.rollout.server
        self.server.stop(s.finish_grace_s if s is not None else 0.0)

    def __repr__(self) -> str:
        server = getattr(self, "server", None)  # Ray shows a worker whose constructor failed too
        return f"ServerWorker({server.address if server else 'not listening'})"


def server_token(spec: WorkerSpec) -> tuple[str, Path, bool]:
    """(token, token file, whether this call created the file): the driver's token a Ray worker got
    in its spec, or the one in ``rollout.server.token_file`` (created if missing)."""
    s = spec.rollout.server
    assert s is not None
    path = Path(spec.launch_dir or os.getcwd()) / s.token_file
    if spec.server_token is not None:
        return spec.server_token, path, False
    fresh = not path.exists()
    return load_or_create_token(path), path, fresh


def announce_servers(spec: WorkerSpec, addresses: list[str], token_path: Path, on_ray: bool) -> None:
    """One stderr line per endpoint (tests and users read the address from it), and a warning when
    the servers are reachable from other machines."""
    s = spec.rollout.server
    assert s is not None
    if s.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"rlrun: warning: rollout.server.host={s.host}: the policy server is reachable from other "
              "machines; anyone holding the token can drive episodes", file=sys.stderr, flush=True)
    for i, address in enumerate(addresses):
        where = f" (Ray worker {i + 1})" if on_ray else ""
        print(f"rlrun: policy server listening on {address}{where} (token in {token_path})", file=sys.stderr,
              flush=True)


def load_or_create_token(path: Path) -> str:
    """The server's token: read from ``path`` (which must not be readable by others), or a fresh one
    written there with mode 0600."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(f"rollout.server.token_file: {path} is readable or writable by others (mode "
                              f"{mode:04o}); chmod 600 it") from None
        token = path.read_text().strip()
        if len(token) < 16 or not token.isprintable() or " " in token:
            raise ConfigError(f"rollout.server.token_file: {path} must hold one token of at least 16 printable "
                              "characters without spaces") from None
        return token
    except OSError as e:
        raise ConfigError(f"rollout.server.token_file: cannot create {path} ({e.strerror or e})") from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
