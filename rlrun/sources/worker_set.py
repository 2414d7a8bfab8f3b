"""WorkerSet: the local worker plus ``num_workers`` remote RolloutWorker Ray actors.

The training module that drives Ray (rlrun/sources/ray_instance.py starts and stops it;
serving/on_ray.py, which it calls, asks policy-server actors for their addresses), and only when
``num_workers > 0``. Synchronous sampling: every
healthy remote worker samples one fragment in parallel; results are ordered by worker index, so a
seed gives the same batch whatever finishes first. Weights go out with one ``ray.put`` per
iteration. A worker that dies (process killed, env raised, timed out) loses at most the fragment it
was sampling (counted), is restarted with the current weights, and the iteration goes on with the
healthy workers. Past ``max_worker_restarts`` restarts the run stops with ``WorkerFailure``.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError
from rlrun.core.errors import PluginError, RayConnectionError, WorkerFailure  # noqa: F401  # re-exported
from rlrun.core.registry import RegistryError
from rlrun.data.batch import SampleBatch
from rlrun.sources.filter_sync import make_filter_sync
from rlrun.sources.ray_instance import init_ray, shutdown_ray
from rlrun.sources.rollout_worker import EpisodeStats, PolicyFactory, WorkerBase, WorkerSpec
from rlrun.sources.worker_kinds import worker_class

if TYPE_CHECKING:
    from rlrun.sources.serving.on_ray import RayServers

# how a config or plugin error raised in a Ray worker's constructor reads in the RayActorError
CONSTRUCTOR_CONFIG_ERROR = re.compile(r"(ConfigError|RegistryError|PluginError): (.+)$", re.MULTILINE)
STANDARD_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory", "TPU"}
RESTART_SEED_STRIDE = 1_000_003  # a restarted worker's envs get fresh seeds, still determined by the run seed


def _first_and_last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"


def _raise_user_error(e: Any) -> None:
    """A remote worker's error that is the user's code breaking its contract (a callback raising, a
    plugin model's shapes): re-raised as itself, since restarting the worker would only repeat it."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, PluginError | WorkerFailure):  # WorkerFailure: e.g. a policy server no client feeds
        raise cause from None


class WorkerSet:
    """The workers of one run. With ``num_workers: 0`` only the local worker exists."""

    def __init__(self, cfg: RunConfig, policy_factory: PolicyFactory) -> None:
        self.cfg = cfg
        self.policy_factory = policy_factory
        self.launch_dir = policy_factory.launch_dir
        self.global_timestep = 0  # the learner's env-step count, sent to workers with the weights
        self.seed = cfg.seed  # the workers' envs' (reseed: a resumed run's)
        self.worker_cls = worker_class(cfg)
        self.num_workers = cfg.rollout.num_workers
        self._servers: RayServers | None = None  # the policy servers, when they are Ray workers
        self.local_worker = worker_class(cfg, local=True)(self._spec(cfg.seed, 0), policy_factory)
        self._filter_sync = make_filter_sync(cfg, self.local_worker)  # None: no observation filter
        self.num_worker_restarts = 0
        self.num_dropped_fragments = 0
        self._episodes = EpisodeStats([], [], {}, {})
        self._restarts_of: dict[int, int] = {}
        self._remote: dict[int, Any] = {}
        self._in_flight: dict[Any, int] = {}  # async sampling: request ref -> worker index
        self._collected: dict[int, int] = {}  # async sampling: fragments collected per worker
        self._ray_owned = False
        if self.num_workers > 0:
            self._start_remote()

    # ------------------------------------------------------------------ remote life cycle
    def _start_remote(self) -> None:
        import ray

        if self.cfg.rollout.server is not None:
            from rlrun.sources.serving.on_ray import RayServers

            self._servers = RayServers(self._spec(self.cfg.seed, 0))
        rc = self.cfg.rollout.ray
        self._ray_owned = init_ray(rc, self.launch_dir)
        # enable_task_events=False: Ray's GCS otherwise keeps an event record of every sample call (only
        # its dashboard and `ray list tasks` read them); capped at 10k (PRIVATE_SYSTEM_CONFIG) it still
        # grew +7.4 % after minute 5 of a 30-minute run (experiments/soak)
        options: dict[str, Any] = {"num_cpus": self.cfg.rollout.num_cpus_per_worker, "max_restarts": 0,
                                   "scheduling_strategy": rc.scheduling_strategy, "enable_task_events": False}
        self._actor_cls = ray.remote(**options)(self.worker_cls)
        for i in range(1, self.num_workers + 1):
            self._remote[i] = self._make_actor(i)
        try:
            self._wait_placed()
        except ConfigError:
            if self._servers is not None:
                self._servers.failed_to_start()
            raise
        if self._servers is not None:
            self._servers.started(self._remote)
        self.sync_weights()

    def _wait_placed(self) -> None:
        """Fail clearly instead of waiting forever when the cluster has no CPUs left for the actors
        (e.g. a sweep's Ray-launcher jobs hold them all)."""
        import ray

        timeout = self.cfg.rollout.ray.start_timeout_s
        refs = [a.__ray_ready__.remote() for a in self._remote.values()]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        self._raise_constructor_error(ready)
        if pending:
            total = ray.cluster_resources().get("CPU", 0)
            free = ray.available_resources().get("CPU", 0)
            for a in self._remote.values():
                ray.kill(a, no_restart=True)
            self._remote.clear()
            r = self.cfg.rollout
            raise WorkerFailure(
                f"rollout: only {len(ready)} of {len(refs)} rollout workers started within "
                f"rollout.ray.start_timeout_s={timeout:g}: the Ray cluster has {total:g} CPUs, {free:g} free, and each "
                f"worker asks for rollout.num_cpus_per_worker={r.num_cpus_per_worker:g}. Lower num_workers or "
                "num_cpus_per_worker (fractions are allowed), or, in a sweep with hydra/launcher=ray, run fewer jobs "
                "at once / give them fewer CPUs (hydra.launcher.ray.remote.num_cpus)"
            )

    def _raise_constructor_error(self, ready: list[Any]) -> None:
        """A worker whose constructor refused the config (a policy server's port is taken, a plugin
        its node cannot import): that one line (exit 2), not restarts that would only repeat it."""
        import ray
        from ray.exceptions import RayActorError

        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError as e:
                if m := CONSTRUCTOR_CONFIG_ERROR.search(str(e)):
                    for a in self._remote.values():
                        ray.kill(a, no_restart=True)
                    self._remote.clear()
                    cls = {"RegistryError": RegistryError, "PluginError": PluginError}.get(m[1], ConfigError)
                    raise cls(m[2].strip().strip("'\"")) from None
                raise WorkerFailure(f"rollout: a rollout worker failed to start: {_first_and_last_line(str(e))}") \
                    from None

    def _make_actor(self, index: int) -> Any:
        seed = self.seed + RESTART_SEED_STRIDE * self._restarts_of.get(index, 0)
        spec = self._spec(seed, index)
        if self._servers is not None:
            spec = self._servers.spec_for(spec)
        return self._actor_cls.remote(spec, self.policy_factory)

    def _spec(self, seed: int, index: int) -> WorkerSpec:
        c = self.cfg
        return WorkerSpec(c.env, c.rollout, seed, index, plugins=tuple(c.plugins), launch_dir=self.launch_dir,
                          callbacks=tuple(c.callbacks), record_next_obs=c.output is not None)

    def placement(self, timeout_s: float = 60.0) -> dict[str, str] | None:
        """``{worker index: node}`` of the remote workers, a node named by its custom resources (those
        given to ``ray start --resources``), or ``head``, and its id's first 8 characters; None when a
        worker does not answer within ``timeout_s`` (one just restarted, not placed yet)."""
        if not self._remote:
            return {}
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            ids = ray.get([w.node_id.remote() for _, w in sorted(self._remote.items())], timeout=timeout_s)
        except (GetTimeoutError, RayActorError):
            return None
        names = {}
        for n in ray.nodes():
            res = n.get("Resources", {})
            own = sorted(k for k in res if k not in STANDARD_RESOURCES and not k.startswith(("node:", "accelerator")))
            label = "+".join(own) or ("head" if "node:__internal_head__" in res else "node")
            names[n["NodeID"]] = f"{label}:{n['NodeID'][:8]}"
        return {str(i): names.get(nid, nid[:8]) for i, nid in zip(sorted(self._remote), ids, strict=True)}

    @property
    def ray_address(self) -> str | None:
        """GCS address of the Ray cluster the remote workers run on (None without Ray)."""
        if not self._remote:
            return None
        import ray

        return str(ray.get_runtime_context().gcs_address)

    @property
    def num_healthy_workers(self) -> int:
        return len(self._remote) if self.num_workers else 1

    def _restart(self, index: int, reason: str) -> None:
        import ray

        self.num_worker_restarts += 1
        if self.num_worker_restarts > self.cfg.rollout.max_worker_restarts:
            raise WorkerFailure(
                f"rollout worker {index} failed ({reason}); that is restart {self.num_worker_restarts}, past "
                f"rollout.max_worker_restarts={self.cfg.rollout.max_worker_restarts}"
            )
        logging.getLogger("rlrun").warning("rollout worker %d failed (%s); restarting it", index, reason)
        old = self._remote.pop(index, None)
        if old is not None:
            ray.kill(old, no_restart=True)
        self._restarts_of[index] = self._restarts_of.get(index, 0) + 1
        actor = self._make_actor(index)
        actor.set_weights.remote(self._weights_ref(), self._timestep(), self._filters())
        self._remote[index] = actor
        if self._servers is not None:
            self._servers.restarted(index, actor, self.cfg.rollout.ray.start_timeout_s)

    # ------------------------------------------------------------------ sampling
    def sample(self) -> list[SampleBatch]:
        """One fragment from every healthy worker (remote ones in parallel), in worker order."""
        if not self._remote:
            batch, eps = self.local_worker.sample_with_metrics()
            self._add(eps, remote=False)
            return [batch]
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        futures = [(i, w.sample_with_metrics.remote()) for i, w in sorted(self._remote.items())]
        out: list[SampleBatch] = []
        failed: list[tuple[int, str]] = []
        timeout = self.cfg.rollout.sample_timeout_s
        if self.cfg.rollout.server is not None:  # a policy server's own timeout says why (no clients), first
            timeout += 10.0
        for i, ref in futures:
            try:
                batch, eps = ray.get(ref, timeout=timeout)
            except RayActorError as e:
                failed.append((i, f"actor died: {_first_and_last_line(str(e))}"))
            except RayTaskError as e:
                _raise_user_error(e)
                failed.append((i, f"sample() raised {type(e.cause).__name__}: {e.cause}"))
            except GetTimeoutError:
                failed.append((i, f"sample() took longer than rollout.sample_timeout_s={timeout:g}"))
            else:
                out.append(batch)
                self._add(eps)
        for i, reason in failed:
            self.num_dropped_fragments += 1
            self._restart(i, reason)
        return out

    def sample_async(self, broadcast_interval: int = 1) -> list[SampleBatch]:
        """Whatever fragments have arrived (at least one), each remote worker always having one
        sample request in flight. A worker gets the learner's latest weights when every
        ``broadcast_interval``-th of its fragments is collected, before its next request.
        Without remote workers this is one synchronous local fragment."""
        if not self._remote:
            return self.sample()
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        for i, w in self._remote.items():  # (re)start requests for new or restarted workers
            if i not in self._in_flight.values():
                self._in_flight[w.sample_with_metrics.remote()] = i
        refs = list(self._in_flight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=self.cfg.rollout.sample_timeout_s)
        if not ready:
            i = self._in_flight[refs[0]]
            del self._in_flight[refs[0]]
            self.num_dropped_fragments += 1
            limit = self.cfg.rollout.sample_timeout_s
            self._restart(i, f"sample() took longer than rollout.sample_timeout_s={limit:g}")
            return []
        more, _ = ray.wait([r for r in refs if r not in ready], num_returns=len(refs) - len(ready), timeout=0)
        out: list[SampleBatch] = []
        for ref in sorted(ready + more, key=lambda r: self._in_flight[r]):
            i = self._in_flight.pop(ref)
            try:
                batch, eps = ray.get(ref)
            except (RayActorError, RayTaskError) as e:
                _raise_user_error(e)
                self.num_dropped_fragments += 1
                self._restart(i, f"{type(e).__name__}: {_first_and_last_line(str(e))}")
                continue
            out.append(batch)
            self._add(eps)
            self._collected[i] = self._collected.get(i, 0) + 1
            w = self._remote[i]
            if self._collected[i] % max(broadcast_interval, 1) == 0:
                w.set_weights.remote(self._weights_ref(), self._timestep(), self._filters())
            self._in_flight[w.sample_with_metrics.remote()] = i
        return out

    def _add(self, eps: EpisodeStats, remote: bool = True) -> None:
        self._episodes.returns.extend(eps.returns)
        self._episodes.lengths.extend(eps.lengths)
        assert self._episodes.policy_returns is not None and self._episodes.custom is not None
        for pid, returns in (eps.policy_returns or {}).items():
            self._episodes.policy_returns.setdefault(pid, []).extend(returns)
        for name, values in (eps.custom or {}).items():
            self._episodes.custom.setdefault(name, []).extend(values)
        if remote and self._filter_sync is not None:  # the local worker's filters are the learner's own
            self._filter_sync.merge(eps)

    def extra_metrics(self) -> dict[str, float]:
        """The workers' own counters (a policy server's requests, abandoned episodes), summed over
        the local worker and the remote ones (asked only if their class reports any)."""
        out = dict(self.local_worker.extra_metrics())
        if self._remote and self.worker_cls.extra_metrics is not WorkerBase.extra_metrics:
            for m in self._call_remotes("extra_metrics", 60.0):
                for k, v in m.items():
                    out[k] = out.get(k, 0.0) + v
        return out

    def reseed(self, seed: int) -> None:
        """Every worker's envs start afresh from ``seed`` (a resumed run's, ``trainer.resume_seed``); a worker
        restarted later takes its seeds from it too."""
        self.seed = seed
        self.local_worker.reseed(seed)
        self._call_remotes("reseed", 60.0, seed)  # a dead one is restarted by the next sample, from this seed

    def mark_interrupted(self) -> None:
        """The run stops without finishing: every worker is told before ``stop()`` (a policy server
        answers "retry", not "run finished")."""
        self.local_worker.mark_interrupted()
        self._call_remotes("mark_interrupted", 10.0)

    def _call_remotes(self, method: str, timeout: float, *args: Any) -> list[Any]:
        """``method(*args)``'s answers of the remote workers that gave one within ``timeout`` s; a dead or
        slow worker is skipped (sampling notices a dead one and restarts it)."""
        if not self._remote:
            return []
        import ray

        refs = [getattr(w, method).remote(*args) for w in self._remote.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        out = []
        for ref in ready:
            try:
                out.append(ray.get(ref))
            except Exception as e:  # say why, go on
                logging.getLogger("rlrun").warning("rollout worker %s failed: %s", method,
                                                   _first_and_last_line(str(e)))
        return out

    def get_metrics(self) -> EpisodeStats:
        """Episodes completed (on any worker) since the last call, with the callbacks' custom metrics."""
        out, self._episodes = self._episodes, EpisodeStats([], [], {}, {})
        return out

    def _filters(self) -> dict[str, Any] | None:
        """The learner's observation-filter statistics, sent to remote workers with the weights."""
        return self._filter_sync.state() if self._filter_sync is not None else None

    # ------------------------------------------------------------------ weights
    def _weights_ref(self) -> Any:
        import ray

        if self._ref is None:
            self._ref = ray.put(self.local_worker.get_weights())
        return self._ref

    _ref: Any = None

    def _timestep(self) -> int:
        return self.global_timestep

    def sync_weights(self, global_timestep: int | None = None, broadcast: bool = True) -> None:
        """Put the learner's weights in the object store once and send the reference to every
        remote worker (actor calls run in order, so the next sample() sees them). With
        ``broadcast=False`` (async sampling) the weights are only marked stale; ``sample_async``
        puts them once and hands them to workers as their fragments come in. ``global_timestep``
        (env steps sampled so far) goes with them: it drives the workers' schedules."""
        if global_timestep is not None:
            self.global_timestep = global_timestep
        if not self._remote:
            return  # the local worker shares the learner's policy object
        self._ref = None
        if not broadcast:
            return
        ref, filters = self._weights_ref(), self._filters()
        for w in self._remote.values():
            w.set_weights.remote(ref, self._timestep(), filters)

    def stop(self) -> None:
        """Stop every worker and, if this WorkerSet connected to Ray, disconnect (a private
        instance shuts down with it)."""
        self.local_worker.stop()
        if not self._remote and not self._ray_owned:
            return
        import ray

        s = self.cfg.rollout.server  # let policy servers answer "run finished" for their grace time
        self._call_remotes("stop", (s.finish_grace_s if s is not None else 0.0) + 10.0)
        for w in self._remote.values():
            ray.kill(w, no_restart=True)
        self._remote.clear()
        self._in_flight.clear()
        if self._ray_owned:
            shutdown_ray()
            self._ray_owned = False
