"""The policy servers of a ``rollout=server`` run whose servers are Ray workers (``num_workers > 0``).

The driver holds what every endpoint shares and what must outlive a worker: the one token (from the
driver's token file: a worker's node may not have it) and each worker's port once it listens, so a
restarted worker listens where its clients know it, also with ``port: 0``. WorkerSet asks this
object for each worker's spec and tells it when workers start or restart; the Ray calls here only
ask those actors for their addresses.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from rlrun.sources.serving.worker import announce_servers, server_token
from rlrun.sources.worker_base import WorkerSpec


class RayServers:
    def __init__(self, driver_spec: WorkerSpec) -> None:
        self._driver_spec = driver_spec
        self.token, self._token_path, self._fresh = server_token(driver_spec)
        self._ports: dict[int, int] = {}  # worker index -> the port it first listened on

    def spec_for(self, spec: WorkerSpec) -> WorkerSpec:
        """Worker ``spec.worker_index``'s spec: the shared token, and its earlier port if it had one."""
        spec = replace(spec, server_token=self.token)
        port = self._ports.get(spec.worker_index)
        return spec if port is None else replace(spec, server_port=port)

    def started(self, actors: dict[int, Any]) -> None:
        """Every worker listens: remember each one's port and print the endpoints."""
        import ray

        indices = sorted(actors)
        addresses = ray.get([actors[i].address.remote() for i in indices])
        self._ports = {i: int(a.rsplit(":", 1)[1]) for i, a in zip(indices, addresses, strict=True)}
        announce_servers(self._driver_spec, addresses, self._token_path, on_ray=True)

    def failed_to_start(self) -> None:
        """The workers could not start (e.g. a port is taken): a token file this run created for them
        is not left behind for nobody."""
        if self._fresh:
            self._token_path.unlink(missing_ok=True)

    def restarted(self, index: int, actor: Any, timeout: float) -> None:
        """Say where a restarted worker's server listens (its old port, see ``spec_for``)."""
        import ray

        try:
            address = ray.get(actor.address.remote(), timeout=timeout)
        except Exception:  # it failed again: the next sample() restarts it or stops the run
            return
        print(f"rlrun: policy server of Ray worker {index} restarted on {address}", file=sys.stderr, flush=True)
