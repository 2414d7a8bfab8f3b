"""Starting, joining and stopping Ray for this process (light: imports Ray only when called)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from rlrun.config.schemas import RayConfig
from rlrun.config.typed import ConfigError
from rlrun.core.errors import RayConnectionError
from rlrun.core.liveness import process_start

RUNTIME_ENV_KEYS = ("py_modules", "working_dir", "excludes", "env_vars", "pip", "uv", "conda", "config")


def runtime_env(rc: RayConfig, launch_dir: str | Path | None) -> dict[str, Any] | None:
    """``rollout.ray.runtime_env`` with local ``py_modules`` / ``working_dir`` paths made absolute
    (relative ones are under the launch dir) and checked to exist. Raises ``ConfigError``."""
    if rc.runtime_env is None:
        return None
    env = dict(rc.runtime_env)
    unknown = sorted(set(env) - set(RUNTIME_ENV_KEYS))
    if unknown:
        raise ConfigError(f"rollout.ray.runtime_env: unknown key '{unknown[0]}'; known: {', '.join(RUNTIME_ENV_KEYS)}")
    base = Path(launch_dir or os.getcwd())

    def local(path: Any, key: str) -> str:
        if not isinstance(path, str) or not path:
            raise ConfigError(f"rollout.ray.runtime_env.{key}: expected a path or URI, got {path!r}")
        if "://" in path:
            return path  # a remote package Ray downloads itself
        full = (base / path).resolve()
        if not full.exists():
            raise ConfigError(f"rollout.ray.runtime_env.{key}: {full} does not exist")
        return str(full)

    if "working_dir" in env:
        env["working_dir"] = local(env["working_dir"], "working_dir")
    if "py_modules" in env:
        mods = env["py_modules"]
        if not isinstance(mods, list | tuple):
            raise ConfigError(f"rollout.ray.runtime_env.py_modules: expected a list of paths, got {mods!r}")
        env["py_modules"] = [local(m, f"py_modules[{i}]") for i, m in enumerate(mods)]
    return env


def init_ray(rc: RayConfig, launch_dir: str | Path | None = None) -> bool:
    """Start a private local Ray instance or join ``rc.address``, with ``rc.runtime_env`` for every
    worker of this job. Returns True if we connected (and so must shut down); False if Ray was
    already initialised by the caller."""
    import ray

    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    env = runtime_env(rc, launch_dir)
    if env is not None:
        quiet["runtime_env"] = env
    if rc.address is None:
        # private instance on loopback; 127.0.0.1 also keeps Ray from probing the network for its IP
        keep_on_loopback()
        ray.init(num_cpus=rc.num_cpus or os.cpu_count(), include_dashboard=False,
                 _node_ip_address="127.0.0.1", _temp_dir=private_temp_dir(),
                 _system_config=dict(PRIVATE_SYSTEM_CONFIG),
                 **quiet)
        return True
    _check_reachable(rc.address)
    try:
        ray.init(address=rc.address, **quiet)
    except ConnectionError as e:
        hint = ("; a cluster with token authentication (Ray's default for `ray start --head`) needs "
                "RAY_AUTH_MODE=token here too" if not os.environ.get("RAY_AUTH_MODE") else "")
        raise RayConnectionError(f"rollout.ray.address: cannot join Ray cluster '{rc.address}': {e}{hint}") from None
    return True


# Ray's GCS keeps an event record of every task (each call of a worker's sample is one), up to 100k by
# default: a long run's GCS grew 147 -> 384 MB over 30 min before it levelled off (experiments/soak,
# 2026-11-26). A private instance has no dashboard to show them: the newest 10k are plenty. Ray adds
# its session's spilling directory to the dict it is given: each init gets a copy.
PRIVATE_SYSTEM_CONFIG = {"task_events_max_num_task_in_gcs": 10_000}


def keep_on_loopback() -> None:
    """Make a private Ray instance listen on 127.0.0.1 only. Ray 2.60 turns ``_node_ip_address=127.0.0.1``
    into the machine's routable address (``resolve_ip_for_localhost``), so GCS, raylet, workers and the
    agents listened on ``::``, ``0.0.0.0`` or the LAN address (12 of 13 sockets, measured). Ray keeps
    everything on loopback when "clusters are disabled" - its default on macOS/Windows - which one
    environment variable sets for every process it starts; the driver reads the constant it was
    imported with, so that is set too. Measured after: every listening socket on 127.0.0.1
    (``tests/test_worker_set.py``)."""
    os.environ[LOOPBACK_ENV] = "0"
    # "Token authentication is enabled for this Ray cluster..." on every run: Ray 2.60's default (token
    # auth on, token in ~/.ray/auth_token) is what we want for a private instance, so no need to say it
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_OWN_TEMP_DIRS: list[str] = []


def private_temp_dir() -> str:
    """A temp root of this process's own for a private Ray instance (its session dir: logs, sockets,
    spilled objects), removed by ``shutdown_ray``: Ray would otherwise leave a ``/tmp/ray/session_*``
    behind every run. Short, under ``$RAY_TMPDIR`` or the system temp dir (Ray's socket paths have a
    length limit). The dirs of rlrun processes that were killed (a process-group SIGKILL leaves no time
    to clean up) are removed here by the next run."""
    base = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())
    for old in base.glob("rlrun-ray-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and process_start(int(pid)) is None:
            shutil.rmtree(old, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"rlrun-ray-{os.getpid()}-", dir=base)
    _OWN_TEMP_DIRS.append(path)
    return path


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail in seconds, not minutes, when ``host:port`` has nothing listening (Ray retries long). For
    ``auto``, the address Ray would pick: the last ``ray start`` under ``$RAY_TMPDIR``, else any GCS
    process it sees on this machine - which may belong to another user's cluster, or sit in a network
    namespace this process cannot reach (Ray then retried for minutes, measured: 600 s)."""
    said = f"'{address}'"
    if address == "auto":
        found = _auto_address()
        if found is None:
            return  # Ray says there is no cluster, in its own words
        address, said = found, f"'auto' (Ray found '{found}')"
    if address.startswith("ray://") or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as e:
        raise RayConnectionError(
            f"rollout.ray.address: no Ray cluster at {said} ({e}); start one with `ray start --head` "
            "or set rollout.ray.address=null for a private local instance"
        ) from None


def _auto_address() -> str | None:
    """The ``host:port`` Ray 2.60 resolves ``address=auto`` to, or None where it finds none."""
    from ray._private import services

    try:
        return services.get_ray_address_from_environment("auto", None)
    except Exception:  # a private Ray helper: if it changes or fails, ray.init says what it finds
        return None


def shutdown_ray() -> None:
    """``ray.shutdown()``, minus the second it waits for the autoscaler monitor of a local instance we
    started: that process ignores SIGTERM until Ray's 1 s timeout; it holds nothing, so it is killed."""
    import ray

    if not ray.is_initialized():
        return
    try:  # private attributes; without them only the second is lost
        node = ray._private.worker._global_node
        if node is not None and node.head:
            for info in node.all_processes.get("monitor", []):
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception:
        pass
    ray.shutdown()
    while _OWN_TEMP_DIRS:
        shutil.rmtree(_OWN_TEMP_DIRS.pop(), ignore_errors=True)
