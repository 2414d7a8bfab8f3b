"""rlrun algorithms as Ray Tune ``Trainable``s, the way RLlib's classic trainers were::

    from ray import tune
    from rlrun import PPOTrainer

    tune.run(PPOTrainer, config={"env": "CartPole-v1", "lr": tune.grid_search([1e-3, 3e-4])},
             stop={"episode_reward_mean": 450}, checkpoint_freq=5)

A trial's config is RLlib's (its keys translated as an RLlib file's are: ``rllib_files.translate``,
RLlib's defaults for the keys it leaves unset) plus rlrun keys with a dot (``"algo.lr"``,
``"tracking.tracking_uri"``); or, as ``rlrun +tune=...`` gives it (rlrun/app/tune_run.py), a
resolved rlrun config under ``"rlrun"`` with dotted keys on top. ``step`` is one training
iteration; its result holds rlrun's metrics and RLlib's names for the usual ones
(``episode_reward_mean``, ``env_runners/episode_return_mean``).

Each trial is one MLflow run, named after the trial, in one experiment (the Tune experiment's
name, or the rlrun config's): its params are the config it started with, ``hparams/<key>`` metrics
follow the trial's tuned values over the run, and a restore from another trial's checkpoint
(population-based training's exploit) is tagged ``rlrun.tune.exploit.<n>`` with the source trial,
its MLflow run and the values that changed. A trial restarted by Tune (PBT pauses it) continues
its MLflow run and history: the run key is derived from the trial's directory. Checkpoints are
Tune's (``save_checkpoint``/``load_checkpoint``: an rlrun checkpoint inside, also sent to the
MLflow run); ``rlrun-eval`` reads them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ray import tune

from rlrun.config.resources import MAX_TRIAL_CPUS
from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError

HOLDER_FILE = "actors"  # in a trial's output dir: the actors (processes) that took the trial up, a line each
_PROCESS = uuid.uuid4().hex[:12]
UNBOUNDED = 10**15  # an RLlib-style trial's own budget: Tune's ``stop`` ends it
CHECKPOINT_SUBDIR = "rlrun"  # in a Tune checkpoint dir: the rlrun checkpoint
RLLIB_NAMES = {"episode_reward_mean": "rollout/episode_return_mean",
               "env_runners/episode_return_mean": "rollout/episode_return_mean",
               "episode_len_mean": "rollout/episode_len_mean"}


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})  # a section the YAML left to its defaults
        if not isinstance(child, dict):
            raise ConfigError(f"tune config: {key}: {part} is not a section of the rlrun config")
        node = child
    node[last] = value


def config_with(base: Mapping[str, Any], values: Mapping[str, Any], launch: Path) -> RunConfig:
    """An rlrun config (plain data, interpolations unresolved: ``lr_schedule: [[0, ${algo.lr}], ...]``
    follows a mutated ``algo.lr``) with ``values`` (rlrun keys, dotted) set, resolved and validated."""
    from rlrun.app.compose import resolve_plain
    from rlrun.sources.plugins import load_plugins
    from rlrun.training.validate import build_config

    raw = copy.deepcopy(dict(base))
    for k, v in values.items():
        _set_dotted(raw, k, v)
    raw = resolve_plain(raw)
    load_plugins(list(raw.get("plugins") or []), search_dirs=[launch])
    return build_config(raw)


def _scalars(config: Mapping[str, Any]) -> dict[str, float]:
    """The config's numbers (what PBT perturbs), for the ``hparams/<key>`` metrics."""
    out: dict[str, float] = {}
    for k, v in config.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def _own_seed(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """``config`` with the trial's own ``seed``: the one it started with, kept in ``path``. PBT's exploit gives
    the trial the source trial's whole config, its seed too; with the source's weights, RNG states and env
    seeds, the trial would replay the source's episodes until their values pulled them apart (two trials of a
    fresh-clone CI run tied to the sixth decimal at the round after an exploit). Tune's own ``seed`` key for
    RLlib-style configs, rlrun's (``tune.param_space.seed``) for ``tune=pbt``: the same top-level key."""
    if "seed" not in config:
        return config
    if path.is_file():
        return {**config, "seed": json.loads(path.read_text())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config["seed"], default=int))  # (numpy ints from Tune's samplers)
    return config


def _holder() -> str:
    """This process, as a trial's holder file names it (a pid alone could be another process's later)."""
    return f"{os.getpid()}-{_PROCESS}"


class RLrunTrainable(tune.Trainable):
    """A Tune Trainable that trains one rlrun algorithm (``algo``: an RLlib run name, e.g. "PPO", or a
    trainer class from ``build_trainer``); ``trainable(algo)`` makes one."""

    algo: ClassVar[Any] = None

    def setup(self, config: dict[str, Any]) -> None:
        from rlrun.app.run_hooks import RecordIteration, RunHook, TagWorkerNodes
        from rlrun.app.runner import make_trainer_from, start_run

        self.launch = Path(os.environ.get("TUNE_ORIG_WORKING_DIR") or os.getcwd()).resolve()
        storage = getattr(self, "_storage", None)
        trial_dir = Path(storage.trial_fs_path) if storage is not None else Path(self.logdir)
        out_dir = trial_dir / "rlrun"  # the trial's output dir: its run's files, seed and exploit count
        config = _own_seed(config, out_dir / "tune_seed")
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / HOLDER_FILE, "a") as f:  # this actor has the trial's MLflow run now
            f.write(_holder() + "\n")
        self._trial, self._config = str(self.trial_id), copy.deepcopy(config)
        experiment = storage.experiment_dir_name if storage is not None else None
        cfg, self.own_stop = self._run_config(config, experiment)
        self.hparams = _scalars({k: v for k, v in config.items() if k != "rlrun"})
        run_name = cfg.tracking.run_name or (self.trial_name if storage is not None else None)
        cfg = dataclasses.replace(cfg, output_dir=str(out_dir), progress=False,
                                  tracking=dataclasses.replace(cfg.tracking, run_name=run_name))
        # the trial's own name: a trial Tune restarts (PBT) continues its MLflow run and history
        run_key = hashlib.md5(str(trial_dir).encode()).hexdigest() if storage is not None else None
        tags = {"rlrun.tune.trial_id": str(self.trial_id), "rlrun.tune.trial_dir": str(trial_dir)}
        self.ctx = start_run(cfg, self.launch, None, extra_tags=tags, run_key=run_key)
        self.ctx.history_start = 0  # the trial's curve: all of its iterations
        self.ctx.status = "FINISHED"  # Tune stops a trial at its end and when PBT pauses it
        self.ctx.reason = "stopped by Tune"
        try:
            self.ctx.trainer = make_trainer_from(self.ctx.cfg, self.launch)
        except BaseException:
            self.ctx.status = "FAILED"
            self.cleanup()
            raise
        self.hooks: list[RunHook] = [RecordIteration(), *([TagWorkerNodes()] if cfg.rollout.num_workers > 0 else [])]

    def _run_config(self, config: Mapping[str, Any], experiment: str | None) -> tuple[RunConfig, bool]:
        """The trial's validated rlrun config, and whether its own ``stop`` ends the trial (an rlrun
        config's does; with RLlib's keys Tune's ``stop`` does, as in RLlib)."""
        from rlrun.app.compose import compose
        from rlrun.app.rllib_config import fmt
        from rlrun.app.rllib_files import last_wins

        config = dict(config)
        base = config.pop("rlrun", None)
        if base is not None:  # every other key is an rlrun key (seed, algo.lr)
            return config_with(base, config, self.launch), True
        dotted = {k: config.pop(k) for k in list(config) if "." in k}
        overrides = [*self._rllib_overrides(config, experiment), "progress=false", f"stop.timesteps_total={UNBOUNDED}",
                     *(f"{'++' if k.startswith('stop.') else ''}{k}={fmt(v)}" for k, v in dotted.items())]
        return compose(last_wins(overrides), str(self.launch)), False

    def _rllib_overrides(self, config: dict[str, Any], experiment: str | None) -> list[str]:
        from rlrun.app.rllib import ClassicTrainer
        from rlrun.app.rllib_files import translate

        name = experiment or "tune"
        if isinstance(self.algo, type) and issubclass(self.algo, ClassicTrainer):
            self.algo.register()
            return [*self.algo.overrides_for(config), "tracking=mlflow", f"tracking.experiment_name={name}"]
        tr = translate({"run": self.algo, "env": config.pop("env", "CartPole-v1"), "config": config}, name)
        if tr.sweep:
            raise ConfigError("tune config: grid_search inside a trial's config; give it to Tune "
                              "(tune.grid_search at the top of the config)")
        return [o for o in tr.overrides if not o.lstrip("+").startswith("stop.")]

    def step(self) -> dict[str, Any]:
        from rlrun.app.runner import evaluate_last, stop_reason

        ctx = self.ctx
        assert ctx.trainer is not None
        try:
            ctx.result = ctx.trainer.train()
            met = stop_reason(ctx.cfg.stop, ctx.result) if self.own_stop else None
            if met:  # (Tune's own stop and its schedulers end a trial after this step: not known here)
                evaluate_last(ctx.cfg, ctx.trainer, ctx.result)
            for hook in self.hooks:
                hook.after_iteration(ctx, ctx.trainer, ctx.result)
        except BaseException as e:  # Tune reports it and stops the trial: its MLflow run says why
            ctx.status, ctx.reason = "FAILED", f"failed: {type(e).__name__}: {e}"
            with contextlib.suppress(Exception):
                ctx.tracker.set_tags({"rlrun.error": f"{type(e).__name__}: {e}"[:5000]})
            raise
        ctx.tracker.log_metrics({f"hparams/{k}": v for k, v in self.hparams.items()},
                                int(ctx.result["timesteps_total"]) + ctx.step_offset)
        result: dict[str, Any] = dict(ctx.result)
        for rllib, ours in RLLIB_NAMES.items():
            if ours in result:
                result[rllib] = result[ours]
        if met:  # the trial's end: its record complete now (final checkpoint, model, curve, run ended), not
            # when Tune stops or caches the actor (at the end of a population Tune kills actors after 10 s)
            ctx.reason = met
            result["done"], result["stop_reason"] = True, met  # its own stop, not the scheduler's
            self._finish(final_checkpoint=True)
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        from rlrun.app.run_files import RUN_KEY_META, RUN_NAME_META
        from rlrun.core.metrics import STOP_COUNTERS
        from rlrun.core.provenance import version_tags
        from rlrun.training.checkpoint import save_checkpoint

        ctx = self.ctx
        assert ctx.trainer is not None
        finished = getattr(self, "_finished", False)  # Tune's checkpoint_at_end after the trial's own end
        if not finished:
            ctx.tracker.wait_started()  # the checkpoint names its MLflow run (an exploiting trial tags it)
        state = ctx.trainer.get_state()
        counters = state.get("counters") or {}  # the trainer's (a trial restored and saved before a step has no result)
        meta = {"algo": ctx.cfg.algo.name, "env": ctx.cfg.env.label, "mlflow_run_id": ctx.tracker.run_id,
                RUN_KEY_META: ctx.run_key, RUN_NAME_META: ctx.run_name, "tune_trial_id": str(self.trial_id),
                "tune_hparams": self.hparams, "tune_step_offset": ctx.step_offset,
                **{k: counters.get(k, ctx.result.get(k)) for k in STOP_COUNTERS}, **version_tags()}
        path = save_checkpoint(Path(checkpoint_dir) / CHECKPOINT_SUBDIR, state, meta, ctx.config_dict, ctx.history)
        storage = getattr(self, "_storage", None)  # Tune's name for it: checkpoint_<its index>
        index = getattr(storage, "current_checkpoint_index", None)
        name = f"checkpoint_{index + 1:06d}" if isinstance(index, int) else f"iter_{ctx.trainer.iteration:06d}"
        if not finished:  # (a finished trial's run holds its final checkpoint already)
            ctx.tracker.log_artifacts(path, f"checkpoints/{name}")
            ctx.tracker.wait_uploaded(path)  # Tune moves the dir away when this returns

    def load_checkpoint(self, checkpoint: Any) -> None:
        import torch

        from rlrun.training.checkpoint import load_checkpoint
        from rlrun.training.trainer import resume_seed

        ctx = self.ctx
        assert ctx.trainer is not None
        ckpt = load_checkpoint(Path(checkpoint) / CHECKPOINT_SUBDIR)
        ctx.trainer.set_state(ckpt.state)
        source = ckpt.meta.get("tune_trial_id")
        if source is None or source == str(self.trial_id):
            ctx.step_offset = int(ckpt.meta.get("tune_step_offset") or 0)
            return
        # another trial's checkpoint (PBT's exploit). Its RNG states are the source's: this trial draws its own
        # actions and minibatches from its own seed (as its envs, reseeded by set_state: trainer.resume_seed)
        seed = resume_seed(ctx.trainer.cfg.seed, ctx.trainer.timesteps_total)
        torch.manual_seed(seed)
        for policy in ctx.trainer.policies.values():
            policy.reseed(seed)
        # its env-step count is the source's; this trial's MLflow steps go on from its own last one, so its
        # curves never step back over what it trained before
        own_last = max((step for _, step, _ in ctx.history.rows()), default=0)
        steps = ckpt.meta.get("timesteps_total")
        ctx.step_offset = max(0, own_last - int(steps)) if isinstance(steps, int | float) else 0
        was = ckpt.meta.get("tune_hparams") or {}
        changes = ", ".join(f"{k} {was.get(k, float('nan')):g} -> {v:g}" for k, v in self.hparams.items()
                            if was.get(k) != v)
        n = self._exploit_count()
        # where on its curve it took the other's: just past its own last step (a step MLflow already holds for
        # this run would be taken for a redone iteration and skipped)
        ctx.tracker.log_metrics({"tune/exploits": float(n)}, own_last + 1)
        ctx.tracker.set_tags({
            "rlrun.tune.restored_from_trial": source,
            "rlrun.tune.restored_from_run": str(ckpt.meta.get("mlflow_run_id")),
            f"rlrun.tune.exploit.{n}": (
                f"restored trial {source}'s checkpoint (MLflow run {ckpt.meta.get('mlflow_run_id')}, iteration "
                f"{ckpt.meta.get('training_iteration', '?')}, {ckpt.meta.get('timesteps_total', '?')} env steps); "
                f"{changes or 'same values'}"),
        })

    def _exploit_count(self) -> int:
        """This trial's exploits so far, this one included (earlier actors of the trial tagged theirs)."""
        tags_file = Path(self.ctx.out_dir) / "exploits"
        n = int(tags_file.read_text()) + 1 if tags_file.is_file() else 1
        tags_file.write_text(str(n))
        return n

    def cleanup(self) -> None:
        self._finish(final_checkpoint=False)

    def _finish(self, final_checkpoint: bool) -> None:
        from rlrun.app.runner import finish_run

        ctx = getattr(self, "ctx", None)
        if ctx is not None and not getattr(self, "_finished", False):
            self._finished = True
            if self._holds_trial():
                finish_run(ctx, final_checkpoint=final_checkpoint)
                return
            # Tune resumed the trial in another actor while this one sat in its actor cache: that actor has the
            # trial's run now, so this one lets go of it (no end state, no final record) and stops its workers
            ctx.history.close()
            try:
                if ctx.trainer is not None:
                    ctx.trainer.stop()
            finally:
                ctx.tracker.end("")  # no end state: the writer stays for this actor's next trial

    def _holds_trial(self) -> bool:
        """Whether this actor is the last that took up its trial (an actor Tune cached may not be)."""
        path = Path(self.ctx.out_dir) / HOLDER_FILE
        return not path.is_file() or path.read_text().splitlines()[-1:] == [_holder()]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Tune's ``reuse_actors=True`` (``tune.run``'s argument; ``rlrun ... tune=`` does not set it): this actor
        now trains ``new_config`` for the trial Tune has set (the same one resumed, or another), saving an actor's
        start (imports, the MLflow writer: seconds). The previous trial's run ends, or is let go where that trial
        went on in another actor meanwhile; the new one starts or continues."""
        if str(self.trial_id) == self._trial and new_config == self._config and self._holds_trial():
            return True  # the same trial again, unchanged: its trainer (and its envs' episodes) go on
        self.cleanup()
        self._finished = False
        self.setup(copy.deepcopy(new_config))
        return True

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> Any:
        """One CPU for the trial (RLlib's ``num_cpus_for_driver`` or its newer names: a share, 0.5 runs two
        trials a CPU), and for each Ray rollout worker (RLlib's ``num_workers``, rlrun's ``rollout.num_workers``)
        its CPUs (RLlib's ``num_cpus_per_worker`` or ``num_cpus_per_env_runner``, rlrun's
        ``rollout.num_cpus_per_worker``; 1 unless set), as the worker actors ask for them."""
        from ray.tune import PlacementGroupFactory

        from rlrun.app.rllib_config import DRIVER_CPU_KEYS, WORKER_CPU_KEYS, check_cpus

        own = 1.0
        for key in DRIVER_CPU_KEYS:
            if key in config:
                check_cpus(key, config[key], MAX_TRIAL_CPUS)
                own = float(config[key])
                break
        workers = config.get("rollout.num_workers", config.get("num_env_runners", config.get("num_workers", 0)))
        cpus_key = next((k for k in ("rollout.num_cpus_per_worker", *WORKER_CPU_KEYS) if k in config), None)
        per = config[cpus_key] if cpus_key else 1.0
        if "rlrun" in config:
            rollout = config["rlrun"].get("rollout") or {}
            if "rollout.num_workers" not in config:
                workers = rollout.get("num_workers") or 0
            if cpus_key is None and "num_cpus_per_worker" in rollout:
                cpus_key, per = "rollout.num_cpus_per_worker", rollout["num_cpus_per_worker"]
        check_cpus(str(cpus_key), per, MAX_TRIAL_CPUS, "a number of CPUs per rollout worker")
        n = int(workers) if isinstance(workers, int | float) else 0
        return PlacementGroupFactory([{"CPU": own}] + [{"CPU": float(per)}] * n)


def trainable(algo: Any) -> type[RLrunTrainable]:
    """A Tune Trainable class for ``algo``: an RLlib run name rlrun has ("PPO", "DQN", "SAC", ...) or a
    trainer class from ``build_trainer``."""
    from rlrun.app.rllib import ClassicTrainer
    from rlrun.app.rllib_config import ALGOS
    from rlrun.core.errors import suggest

    if isinstance(algo, type) and issubclass(algo, ClassicTrainer):
        name = algo.__name__
    elif isinstance(algo, str) and algo in ALGOS:
        name = f"{algo}Trainer"
    else:
        raise ConfigError(f"trainable: {algo!r} is not an RLlib algorithm name rlrun has"
                          f"{suggest(str(algo), list(ALGOS))} or a class from build_trainer")
    return type(name, (RLrunTrainable,), {"algo": algo, "__module__": __name__})


PGTrainer = trainable("PG")
A2CTrainer = trainable("A2C")
PPOTrainer = trainable("PPO")
APPOTrainer = trainable("APPO")
DQNTrainer = trainable("DQN")
SACTrainer = trainable("SAC")
TD3Trainer = trainable("TD3")
DDPGTrainer = trainable("DDPG")
