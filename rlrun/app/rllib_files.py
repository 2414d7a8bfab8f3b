"""RLlib's tuned-example files (``<name>: {env, run, stop, config}``) and ``rllib train`` arguments ->
rlrun runs: ``translate`` gives one experiment's overrides (``rllib_config.py`` holds the key tables),
``to_experiment_yaml`` the equivalent rlrun experiment file a user migrates to once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rlrun.app.rllib_config import (
    ALGOS,
    IGNORED,
    KEYS,
    OFF_POLICY,
    RENAMED,
    WORKER_CPU_KEYS,
    Context,
    Translation,
    check_cpus,
    env_id,
    fmt,
)
from rlrun.app.rllib_defaults import RLLIB_DEFAULTS, STOP_KEYS, VISION_DEFAULTS
from rlrun.app.rllib_images import CONV_MODELS, atari_images, atari_pairs
from rlrun.config.typed import ConfigError
from rlrun.core.errors import suggest

SPEC_KEYS = ("env", "run", "stop", "config", "checkpoint_freq", "checkpoint_at_end", "num_samples", "local_dir",
             "storage_path", "keep_checkpoints_num")


def load_experiments(path: str | Path) -> dict[str, dict[str, Any]]:
    """The experiments of an RLlib YAML file, checked for shape (one line naming the file and key)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected RLlib's format, a mapping <name>: {{env, run, stop, config}}; "
                          f"got {type(data).__name__}")
    for name, spec in data.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: {name}: expected a mapping with run, env, stop, config; got {spec!r}")
        for k in spec:
            if k not in SPEC_KEYS:
                raise ConfigError(f"{path}: {name}.{k}: not a key of an RLlib experiment{suggest(k, SPEC_KEYS)}")
    return data


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _grid(config: Mapping[str, Any], prefix: str = "") -> dict[str, list[Any]]:
    """``{"lr": {"grid_search": [...]}}`` anywhere in the config -> ``{"lr": [...]}`` (dotted keys)."""
    out: dict[str, list[Any]] = {}
    for k, v in config.items():
        if isinstance(v, Mapping) and "grid_search" in v:
            out[prefix + k] = list(v["grid_search"])
        elif isinstance(v, Mapping):
            out.update(_grid(v, f"{prefix}{k}."))
    return out


def translate(spec: Mapping[str, Any], name: str = "experiment") -> Translation:
    """One RLlib experiment -> rlrun overrides (RLlib's defaults for the keys it leaves unset). An
    ``env: {grid_search: [...]}`` is a sweep over ``env.id`` where every env translates alike."""
    user = spec.get("config") or {}
    if not isinstance(user, Mapping):
        raise ConfigError(f"{name}.config: expected a mapping of RLlib config keys, got {user!r}")
    user = {**{RENAMED[k]: v for k, v in user.items() if k in RENAMED},
            **{k: v for k, v in user.items() if k not in RENAMED}}
    env = spec["env"] if "env" in spec else user.get("env")  # RLlib's: the experiment's env over the config's
    if not (isinstance(env, Mapping) and "grid_search" in env):
        return _translate(spec, name, user, env)
    envs = env["grid_search"]
    if not isinstance(envs, list) or not envs:
        raise ConfigError(f"{name}.env.grid_search: expected a list of env ids, got {envs!r}")
    each = [_translate(spec, name, {k: v for k, v in user.items() if k != "env"}, e) for e in envs]
    first = each[0]
    rest = [[o for o in tr.overrides if not o.startswith("env.id=")] for tr in each]
    for e, tr, other in zip(envs[1:], each[1:], rest[1:], strict=True):
        if other != rest[0]:
            a, b = next(((x, y) for x, y in zip(rest[0], other, strict=False) if x != y), (rest[0], other))
            raise ConfigError(f"{name}.env.grid_search: {envs[0]} and {e} need different rlrun settings ({a} against "
                              f"{b}); give each an experiment of its own")
        first.notes += [n for n in tr.notes if n not in first.notes]
    ids = ",".join(dict.fromkeys(next(o for o in tr.overrides if o.startswith("env.id="))[7:] for tr in each))
    first.sweep_params = {"env.id": ids, **first.sweep_params}
    first.overrides = [f"env.id={ids}" if o.startswith("env.id=") else o for o in first.overrides]
    first.sweep = True
    return first


def _translate(spec: Mapping[str, Any], name: str, user: Mapping[str, Any], env_name: Any) -> Translation:
    """``translate`` for one env."""
    tr = Translation()
    run = spec.get("run")
    if run not in ALGOS:
        raise ConfigError(f"{name}.run: {run!r} is not an algorithm rlrun has{suggest(str(run), list(ALGOS))}; "
                          f"rlrun has: {', '.join(ALGOS)}")
    grid = _grid(user)
    env = env_id(env_name, tr.notes, f"{name}.env")
    images = atari_images(env, user.get("env_config") or {})
    config = _merge(_merge(_merge(RLLIB_DEFAULTS["common"], RLLIB_DEFAULTS[run]),
                           {"model": VISION_DEFAULTS} if images else {}), user)
    ctx = Context(run, env, tr.notes, tr.ignored, images)
    groups = list(ALGOS[run])
    pairs: list[tuple[str, Any]] = [("env.id", env), ("tracking.experiment_name", name)]
    for key, value in config.items():
        if key in IGNORED:
            if key in user:
                tr.ignored.append(key)
            continue
        if key not in KEYS:
            raise ConfigError(f"{name}.config.{key}: not an RLlib key rlrun supports{suggest(key, list(KEYS))}")
        if isinstance(value, Mapping) and "grid_search" in value:
            value = value["grid_search"][0]  # its values become the sweep below
        pairs += KEYS[key](value, ctx)
    _one_activation(pairs, run, tr.notes)
    if run in ("TD3", "DDPG"):  # target smoothing: RLlib's target_noise counts only with smooth_target_policy
        smooth = config.get("smooth_target_policy", run == "TD3")
        pairs.append(("algo.target_noise", config.get("target_noise", 0.2) if smooth else 0.0))
    if not config.get("use_huber"):  # RLlib's huber_threshold means nothing without use_huber
        pairs = [p for p in pairs if p[0] != "loss.huber_delta"]
    if run == "DQN":  # RLlib's Q-net: the fcnet torso (or vision net), then `hiddens` (relu) before the Q heads
        model = config.get("model") or {}
        torso = [] if ctx.images else model.get("fcnet_hiddens", [])
        pairs += [("model.hiddens", [*torso, *config.get("hiddens", [])]), ("model.activation", "relu")]
        if model.get("fcnet_activation", "relu") != "relu" and not ctx.images:
            tr.notes.append(f"DQN's torso activation {model['fcnet_activation']!r} is relu in rlrun's Q-net (one "
                            "activation for all its layers)")
    if ctx.images:
        if ("__model_group__", "lstm") in pairs:
            raise ConfigError(f"{name}.config.model.use_lstm: not supported on Atari frames (rlrun's lstm model "
                              "takes vectors)")
        pairs += atari_pairs(env, config, user, tr.notes)
        groups = [CONV_MODELS.get(g, g) for g in groups]
    if ("__model_group__", "lstm") in pairs:
        groups = [g for g in groups if not g.startswith("model=")] + ["model=lstm"]
    pairs = [p for p in pairs if p[0] != "__model_group__"]
    pairs += _sampling(config, run, user, tr)
    tr.overrides = [*groups, *(f"{'++' if isinstance(v, Mapping) else ''}{k}={fmt(v)}" for k, v in pairs  # ++: new
                               if v is not None or k.startswith(("algo.", "model."))),  # keys of a mapping
                    *_stop(spec.get("stop") or {}, name, tr.notes)]
    tr.overrides = last_wins(tr.overrides)
    _sweep(tr, grid, ctx, name)
    return tr


def _sweep(tr: Translation, grid: Mapping[str, list[Any]], ctx: Context, name: str) -> None:
    """The file's ``grid_search`` keys as a Hydra sweep of ``tr``, each value translated as the key's own would be."""
    for key, values in grid.items():
        top, *rest = key.split(".")
        if top in IGNORED:  # framework: {grid_search: [tf, torch]}: one run (listed as ignored)
            continue
        each = [KEYS[top](_nest(rest, v), ctx) if top in KEYS else [] for v in values]
        targets = {p[0] for pairs_v in each for p in pairs_v}
        if len(targets) != 1 or any(len(p) != 1 for p in each):
            raise ConfigError(f"{name}.config.{key}: grid_search is supported on keys that are one rlrun key")
        target = targets.pop()
        tr.overrides = [o for o in tr.overrides if not o.lstrip("+").startswith(target + "=")]
        tr.sweep_params[target] = ",".join(fmt(p[0][1]) for p in each)
        tr.overrides.append(f"{target}={tr.sweep_params[target]}")
        tr.sweep = True


def _one_activation(pairs: list[tuple[str, Any]], run: str, notes: list[str]) -> None:
    """Say which activation rlrun's model takes where the file gives its networks different ones (SAC's Q and
    policy models, TD3's actor and critics: rlrun's twin-Q models have one for all)."""
    acts = list(dict.fromkeys(v for k, v in pairs if k == "model.activation"))
    if len(acts) > 1:
        notes.append(f"the file's networks have different activations ({', '.join(acts)}); rlrun's {run} model has "
                     f"one for all of them: {acts[-1]}")


def last_wins(overrides: list[str]) -> list[str]:
    """Each key once, with its last value (Hydra refuses a key overridden twice)."""
    return list({o.split("=", 1)[0].lstrip("+"): o for o in overrides}.values())


def _nest(path: list[str], value: Any) -> Any:
    """``value`` under the dotted ``path`` (``model.fcnet_hiddens`` -> ``{"fcnet_hiddens": value}``)."""
    for part in reversed(path):
        value = {part: value}
    return value


def _training_step(config: Mapping[str, Any], run: str, batch: int, native_rows: int, tr: Translation
                   ) -> tuple[int, int]:
    """RLlib's fragments stored and updates made per off-policy training step. DQN's and SAC's weigh them by
    ``training_intensity`` (``calculate_rr_weights``: the natural ratio's rows count the local worker as a
    sampler too); TD3's and DDPG's (SimpleQ's step) make one of each and take no intensity."""
    intensity = config.get("training_intensity")
    if run in ("TD3", "DDPG"):
        if intensity:
            tr.notes.append(f"training_intensity {intensity}: RLlib's {run} ignores it (one update per sampled "
                            "fragment), and so does rlrun's translation")
        return 1, 1
    if not intensity:
        return 1, 1
    weight = float(intensity) / (batch / native_rows)
    return (max(1, round(1 / weight)), 1) if weight < 1 else (1, round(weight))


# the keys _sampling reads: a grid_search over one of them would set several rlrun keys at once
SAMPLING_KEYS = ("num_workers", "num_env_runners", "num_envs_per_worker", "num_envs_per_env_runner",
                 "rollout_fragment_length", "train_batch_size", "min_sample_timesteps_per_iteration")


def _sampling_keys(config: Mapping[str, Any], run: str) -> tuple[str, ...]:
    """``SAMPLING_KEYS`` and, for an off-policy run, the ones its training step reads too."""
    if run not in OFF_POLICY:
        return SAMPLING_KEYS
    auto = config.get("rollout_fragment_length", "auto") == "auto"  # RLlib's auto fragment is n_step
    return (*SAMPLING_KEYS, "training_intensity", *(("n_step",) if auto else ()),
            *(("target_network_update_freq",) if run == "SAC" else ()))


def _sampling(config: Mapping[str, Any], run: str, user: Mapping[str, Any], tr: Translation) -> list[tuple[str, Any]]:
    """Workers, sub-envs, fragment and batch sizes: RLlib's meaning in rlrun's terms."""
    grid = next((k for k in _sampling_keys(config, run) if isinstance(config.get(k), Mapping)), None)
    if grid is not None:
        older = " / ".join(old for old, new in RENAMED.items() if new == grid)
        raise ConfigError(f"config.{grid}{f' ({older})' if older else ''}: grid_search is not supported "
                          "on the sampling keys (each value sets several rlrun keys); give each value an experiment "
                          "of its own")
    workers = int(config.get("num_env_runners", config.get("num_workers", 0)) or 0)
    envs = int(config.get("num_envs_per_env_runner", config.get("num_envs_per_worker", 1)) or 1)
    out: list[tuple[str, Any]] = []
    if "num_workers" in user or "num_env_runners" in user:
        if workers:
            out += [("rollout", "ray"), ("rollout.num_workers", workers)]
            out += _worker_cpus(user, tr)
    elif workers:  # RLlib's default workers: as many env copies in-process (the same samples)
        envs *= workers
        workers = 0
    out.append(("rollout.num_envs_per_worker", envs))
    frag = config.get("rollout_fragment_length", "auto")
    batch = int(config.get("train_batch_size", 200))
    per_round = envs * max(workers, 1)
    if run in OFF_POLICY:  # RLlib's train_batch_size is the SGD minibatch
        frag = int(config.get("n_step", 1)) if frag == "auto" else int(frag)  # RLlib's "auto" here: n_step
        stores, updates = _training_step(config, run, batch, frag * envs * (workers + 1), tr)
        # RLlib's training step, rlrun's round: a fragment from each copy (``stores`` times), then ``updates``
        # updates of train_batch_size rows; repeated until min_sample_timesteps_per_iteration env steps
        round_rows = frag * per_round * stores
        intensity = updates * batch / round_rows  # rlrun's: replayed rows per env step
        iteration = int(config.get("min_sample_timesteps_per_iteration") or 0)
        out += [("algo.sgd_minibatch_size", batch), ("algo.training_intensity", intensity),
                ("algo.train_batch_size", round_rows), ("rollout.rollout_fragment_length", "auto")]
        if iteration > round_rows:
            out.append(("min_sample_timesteps_per_iteration", iteration))
        if run == "SAC":  # RLlib's target update: after every update (0), else at the first update of a training
            # step once that many env steps have passed since the last, so every ceil(freq / round_rows) steps;
            # rlrun's counts updates
            freq = int(config.get("target_network_update_freq") or 0)
            out.append(("algo.target_network_update_freq", math.ceil(freq / round_rows) * updates if freq else 1))
        return out
    if config.get("min_sample_timesteps_per_iteration"):  # on-policy: RLlib repeats its step until that many
        out.append(("min_sample_timesteps_per_iteration", int(config["min_sample_timesteps_per_iteration"])))
    if frag == "auto":
        if batch % per_round:
            tr.notes.append(f"train_batch_size {batch} is not a multiple of {per_round} env copies: "
                            f"using {math.ceil(batch / per_round) * per_round}")
            batch = math.ceil(batch / per_round) * per_round
        return [*out, ("rollout.rollout_fragment_length", "auto"), ("algo.train_batch_size", batch)]
    round_rows = int(frag) * per_round
    if batch % round_rows:  # RLlib samples whole rounds until it has train_batch_size rows
        tr.notes.append(f"train_batch_size {batch} is not a multiple of rollout_fragment_length x env copies = "
                        f"{round_rows}: using {math.ceil(batch / round_rows) * round_rows}, as RLlib samples")
        batch = math.ceil(batch / round_rows) * round_rows
    return [*out, ("rollout.rollout_fragment_length", int(frag)), ("algo.train_batch_size", batch)]


def _worker_cpus(user: Mapping[str, Any], tr: Translation) -> list[tuple[str, Any]]:
    """RLlib's CPUs per rollout worker as the Ray actors' ``rollout.num_cpus_per_worker`` (no longer ignored)."""
    key = next((k for k in WORKER_CPU_KEYS if k in user), None)
    if key is None:
        return []
    value = user[key]
    check_cpus(key, value, what="a positive number of CPUs per rollout worker")
    tr.ignored = [k for k in tr.ignored if k not in WORKER_CPU_KEYS]
    return [("rollout.num_cpus_per_worker", value)]


def _stop(stop: Any, name: str, notes: list[str]) -> list[str]:
    if not isinstance(stop, Mapping):
        raise ConfigError(f"{name}.stop: expected a mapping such as {{episode_reward_mean: 150}}, got {stop!r}")
    if not stop:  # RLlib would train until interrupted; a run here needs an end
        notes.append("no stop criteria: rlrun's default applies (stop.timesteps_total=100000)")
        return []
    out = ["stop.timesteps_total=null"]
    for key, value in stop.items():
        if key not in STOP_KEYS:
            raise ConfigError(f"{name}.stop.{key}: not a stop key rlrun supports{suggest(key, list(STOP_KEYS))}; "
                              f"supported: {', '.join(STOP_KEYS)}")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{name}.stop.{key}: expected a number, got {value!r}")
        target = STOP_KEYS[key]
        out.append(f"++stop.{target.replace('/', '.')}={value}" if "/" in target else f"stop.{target}={value}")
    return out


def to_experiment_yaml(overrides: list[str], sweep_params: Mapping[str, str] | None = None) -> str:
    """The rlrun experiment file (``+experiment=<name>`` in a config dir's ``experiment/``) that
    composes what ``overrides`` do; swept keys go to Hydra's sweeper (``rlrun -m +experiment=...``)."""
    defaults: list[dict[str, str]] = []
    keys: dict[str, Any] = {}
    if sweep_params:
        keys["hydra"] = {"sweeper": {"params": dict(sweep_params)}}
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key in (sweep_params or {}):
            continue
        if "." not in key and key in ("algo", "loss", "model", "env", "rollout", "tracking"):
            defaults.append({f"override /{key}": value})
            continue
        node = keys
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(value) if value else None
    head = "# @package _global_\n# written by rlrun-rllib from an RLlib experiment; run with +experiment=<this file>\n"
    return head + yaml.safe_dump({"defaults": defaults, **keys}, sort_keys=False)
