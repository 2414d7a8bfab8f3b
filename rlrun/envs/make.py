"""Environment creation: registered env names or any gymnasium id, always as a vector env.

An ENVS entry is a callable ``(num_envs: int, **kwargs) -> gymnasium.vector.VectorEnv`` (or a plain
``(**kwargs) -> gymnasium.Env`` registered with ``vector=False``, which rlrun wraps in a
SyncVectorEnv). Vector envs must use gymnasium's default next-step autoreset; see workers.py.
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Sequence
from importlib.util import find_spec
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.extras import install_hint
from rlrun.core.errors import PluginError, one_line
from rlrun.core.registry import ENVS, RegistryError, suggest
from rlrun.data.spaces import MaskedBox
from rlrun.envs.action_mask import pack_action_mask, probe_actions
from rlrun.envs.wrappers import all_vectorised, parse_wrappers, single_env_wrappers, wrap_env, wrap_vector_env

# gymnasium ids that another package registers when imported (the package is imported on first use)
ENV_PACKAGES = {"MiniGrid-": "minigrid", "BabyAI-": "minigrid", "ALE/": "ale_py"}
# ale-py's ids of the gym era (BreakoutNoFrameskip-v4, PongDeterministic-v4, Pong-ram-v0: RLlib's tuned files)
LEGACY_ATARI = re.compile(r"[A-Z][A-Za-z]*(-ram)?(NoFrameskip|Deterministic|(?<=-ram))-v[04]")
# ... and its plain ids (Pong-v4, Breakout-v0), which only ale-py can register where it is installed
PLAIN_ATARI = re.compile(r"[A-Z][A-Za-z]*-v[04]")


def env_package(env_id: str) -> str | None:
    """The package that registers ``env_id`` when imported: ``module:EnvId`` (gymnasium's own syntax), a
    known prefix, or ale-py for the gym era's Atari ids."""
    if ":" in env_id:
        return None if env_id.startswith("pettingzoo:") else env_id.split(":", 1)[0]
    module = next((m for prefix, m in ENV_PACKAGES.items() if env_id.startswith(prefix)), None)
    if module is None and LEGACY_ATARI.fullmatch(env_id):
        return "ale_py"
    if module is None and PLAIN_ATARI.fullmatch(env_id) and env_id not in gym.registry and find_spec("ale_py"):
        return "ale_py"  # not when it is missing: CartPole-v4 is a typo, not an Atari game to install
    return module


def import_env_package(env_id: str) -> None:
    """Import the package that registers ``env_id`` (``env_package``), if any; RegistryError when it is missing."""
    module = env_package(env_id)
    if module is None:
        return
    try:
        package = importlib.import_module(module)
    except ImportError as e:
        fix = install_hint(module)
        raise RegistryError(f"env.id: '{env_id}' needs the {module} package, which cannot be imported ({e}); "
                            f"{fix}") from None
    if module == "ale_py":  # the emulator's banner on stderr at each env made: its warnings and errors only
        package.ALEInterface.setLoggerMode(package.LoggerMode.Warning)


def declared_spaces(env: Any) -> tuple[gym.Space, gym.Space] | None:
    """``env.observation_space`` and ``env.action_space`` as declared in the config (both or neither;
    ``check_env_config`` has checked them), or None when the env's own spaces are used."""
    from rlrun.data.spaces import space_from_config

    if env.observation_space is None or env.action_space is None:
        return None
    return (space_from_config(env.observation_space, "env.observation_space"),
            space_from_config(env.action_space, "env.action_space"))


def env_spaces(env: Any) -> tuple[gym.Space, gym.Space]:
    """The (single) observation and action spaces of ``env`` (an EnvConfig): the declared ones, or
    those of one env copy built for the purpose."""
    declared = declared_spaces(env)
    if declared is not None:
        return declared
    vec = env_from_config(env, 1)
    try:
        return vec.single_observation_space, vec.single_action_space
    finally:
        vec.close()


def check_env_config(cfg: Any) -> None:
    """Declared spaces parse, come in pairs, and a run without an env (``env.id: null``) asks nothing
    of one: no sampling, no online evaluation, no multi-agent env. Raises ``ConfigError``."""
    from rlrun.config.multi_agent import is_multi_agent_env
    from rlrun.config.offline import SAMPLER, parse_input
    from rlrun.config.typed import ConfigError
    from rlrun.data.spaces import space_from_config

    e = cfg.env
    declared = []
    for key, data in (("env.observation_space", e.observation_space), ("env.action_space", e.action_space)):
        try:
            declared.append(None if data is None else space_from_config(data, key))
        except ValueError as err:
            raise ConfigError(str(err)) from None
    obs, act = declared
    if isinstance(obs, MaskedBox) and not (isinstance(act, gym.spaces.Discrete) and act.n == obs.mask_size):
        raise ConfigError(f"env.observation_space: a MaskedBox of {obs.mask_size} mask entries needs "
                          f"env.action_space: {{type: Discrete, n: {obs.mask_size}}}; got {act}")
    if (e.observation_space is None) != (e.action_space is None):
        missing = "env.action_space" if e.action_space is None else "env.observation_space"
        raise ConfigError(f"{missing}: missing; declare both spaces or neither")
    if e.shuffle_seats and not is_multi_agent_env(e.id):
        has = f"env.id {e.id} has one agent" if e.id else "env.id is null"
        raise ConfigError(f"env.shuffle_seats: true needs a multi-agent env whose agents swap seats; {has}")
    if e.id is not None:
        return
    sampled = any(s == SAMPLER for s, _ in parse_input(cfg.input)) and cfg.rollout.server is None
    needs = [
        (e.observation_space is None, "env.id: null (no env) needs declared spaces: env.observation_space="
                                      "{type: Box, shape: [4]} env.action_space={type: Discrete, n: 2}"),
        (sampled, f"input: {cfg.input!r} samples from the env and env.id is null; give input=<dir of Parquet "
                  "files> (or rollout=server)"),
        (cfg.rollout.num_workers > 0 and cfg.rollout.server is None,
         f"rollout.num_workers: {cfg.rollout.num_workers} rollout workers and env.id is null: nothing to "
         "sample; set 0"),
        (cfg.evaluation.interval > 0, f"evaluation.interval: {cfg.evaluation.interval}: evaluation runs on the "
                                      "env and env.id is null; set evaluation.interval=0"),
        (bool(cfg.multiagent.policies), "multiagent: a multi-agent run needs its env (env.id is null)"),
        (bool(e.wrappers), f"env.wrappers: {e.wrappers!r} wrap an env and env.id is null"),
    ]
    for bad, message in needs:
        if bad:
            raise ConfigError(message)


def check_env_id(env_id: str) -> None:
    """Fail with known names if ``env_id`` is neither registered with rlrun nor with gymnasium."""
    if env_id in ENVS or env_id.startswith("pettingzoo:"):
        return
    import_env_package(env_id)
    if env_id in gym.registry or (":" in env_id and env_id.split(":", 1)[1] in gym.registry):
        return
    gym_ids = sorted(gym.registry)
    known = ENVS.names() + gym_ids
    raise RegistryError(
        f"env.id: unknown env '{env_id}'{suggest(env_id, known)}. rlrun envs: "
        f"{', '.join(ENVS.names()) or '(none)'}; gymnasium ids include {', '.join(gym_ids[:12])}, ... "
        "(a plugin module may register more: `plugins: [my_envs]`)"
    )


def env_from_config(env: Any, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies of the configured env (an ``EnvConfig``: id, kwargs, vectorisation, wrappers)."""
    return make_vector_env(env.id, num_envs, env.kwargs, env.vectorize, env.wrappers)


def make_vector_env(
    env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None, vectorize: str = "auto",
    wrappers: Sequence[Any] = (),
) -> gym.vector.VectorEnv:
    """Build ``num_envs`` copies of ``env_id`` stepped as one vector env, wrapped by ``wrappers``
    (``env.wrappers`` entries, see rlrun/envs/wrappers.py).

    ``vectorize='auto'`` uses the env's own numpy-vectorised implementation when gymnasium has one
    (CartPole-v1: ~10x faster than stepping Python envs in a loop) and a SyncVectorEnv otherwise;
    with wrappers, only when every one of them has a vector form. ``'envpool'``: EnvPool's C++ pool
    (rlrun/envs/envpool.py, optional package). Observations that carry an action mask are packed
    after the wrappers (rlrun/envs/action_mask.py).
    """
    return pack_action_mask(_vector_env(env_id, num_envs, kwargs, vectorize, wrappers))


def _vector_env(env_id: str, num_envs: int, kwargs: dict[str, Any] | None, vectorize: str,
                wrappers: Sequence[Any]) -> gym.vector.VectorEnv:
    kwargs = dict(kwargs or {})
    if vectorize != "envpool":  # EnvPool's ids are its own (Breakout-v5, not ALE/Breakout-v5): checked there
        check_env_id(env_id)
    specs = parse_wrappers(wrappers)
    vector_ok = all_vectorised(specs)
    if env_id in ENVS:
        entry = ENVS.entry(env_id)
        try:
            if entry.info.get("vector", True):
                if not vector_ok:
                    raise RegistryError(f"{_single_only(specs)} has no vector form, and rlrun env '{env_id}' is a "
                                        "vector env; use wrappers that have one (mask_observation, clip_reward, "
                                        "flatten_observation) or register the env with vector=False")
                return wrap_vector_env(entry.obj(num_envs, **kwargs), specs)
            creator = entry.obj
            return gym.vector.SyncVectorEnv([lambda: wrap_env(creator(**kwargs), specs) for _ in range(num_envs)])
        except TypeError as e:
            raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None
    env_id = env_id.split(":", 1)[1] if ":" in env_id else env_id  # module:EnvId, its module imported above
    if vectorize == "envpool":
        from rlrun.envs.envpool import EnvPoolVectorEnv

        if not vector_ok:
            own = ENVPOOL_OWN.get(_first_single(specs).name, "use env.vectorize=auto or sync")
            raise RegistryError(f"{_single_only(specs)} has no vector form; with env.vectorize=envpool every wrapper "
                                f"needs one ({own})")
        return wrap_vector_env(EnvPoolVectorEnv(env_id, num_envs, kwargs), specs)
    spec = gym.spec(env_id)
    if str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        route_mujoco_warnings()
    mode = vectorize
    if mode == "auto":
        mode = "vector_entry_point" if spec.vector_entry_point is not None and vector_ok else "sync"
    elif mode == "vector_entry_point" and not vector_ok:
        raise RegistryError(f"{_single_only(specs)} has no vector form; with env.vectorize=vector_entry_point every "
                            "wrapper needs one (use env.vectorize=auto or sync)")
    try:
        if mode == "vector_entry_point":
            return wrap_vector_env(gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **kwargs), specs)
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, wrappers=single_env_wrappers(specs),
                            **kwargs)
    except TypeError as e:
        raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None


# what EnvPool's Atari envs do themselves in place of a wrapper that has no vector form
ENVPOOL_OWN = {"atari_preprocessing": "EnvPool's Atari envs preprocess their frames themselves: noop_max, frame_skip, "
                                      "img_height, img_width, gray_scale and stack_num in env.kwargs",
               "frame_stack": "EnvPool's Atari envs stack frames themselves: env.kwargs.stack_num",
               "episodic_life": "EnvPool's Atari envs have it: env.kwargs.episodic_life=true",
               "fire_reset": "EnvPool's Atari envs fire at each reset themselves (use_fire_reset, on by default)"}


def _first_single(specs: Sequence[Any]) -> Any:
    """The first wrapper listed that has no vector form."""
    return next(s for s in specs if not all_vectorised([s]))


def _single_only(specs: Sequence[Any]) -> str:
    s = _first_single(specs)
    return f"{s.key}: wrapper '{s.name}'"


def _mujoco_warning(message: str) -> None:
    warnings.warn(f"MuJoCo: {message.strip()}", RuntimeWarning, stacklevel=2)


def route_mujoco_warnings() -> None:
    """MuJoCo's own warning handler prints each warning and appends it to ``MUJOCO_LOG.TXT`` in the
    working directory (HalfCheetah-v5 warns of a deprecated compiler attribute once per env copy);
    routed through Python's ``warnings`` instead, each message is said once and no file is left in
    the user's directory."""
    try:
        import mujoco
    except ImportError:
        return  # making the env will say how to install it
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


# gymnasium's envs whose simulator one of rlrun's extras installs: entry-point prefix -> (simulator, its module)
GYMNASIUM_EXTRAS = {"gymnasium.envs.mujoco": ("MuJoCo", "mujoco"), "gymnasium.envs.box2d": ("Box2D", "Box2D")}


def _missing_extra(env_id: str, e: Exception) -> tuple[str, str] | None:
    """``(simulator, module)`` when ``env_id`` is one of gymnasium's MuJoCo or Box2D envs and making it
    failed for want of a module; else None."""
    if not isinstance(e, ImportError | gym.error.DependencyNotInstalled):
        return None
    spec = gym.envs.registry.get(env_id)
    entry = str(spec.entry_point) if spec is not None else ""
    return next((v for prefix, v in GYMNASIUM_EXTRAS.items() if entry.startswith(prefix)), None)


def probe_env(env_id: str, kwargs: dict[str, Any] | None = None, vectorize: str = "auto", steps: int = 3,
              wrappers: Sequence[Any] = ()) -> tuple[gym.Space, gym.Space]:
    """Build one copy of the env, reset it and take a few random steps, checking the gymnasium API
    (5-tuple steps, observations of the declared shape, one scalar reward per sub-env) before any
    training starts. Raises ``PluginError`` naming the env and what is wrong. Returns the (single)
    observation and action spaces."""
    try:
        env = make_vector_env(env_id, 1, kwargs, vectorize, wrappers)
    except (RegistryError, PluginError):
        raise
    except Exception as e:
        missing = _missing_extra(env_id, e)
        if missing is not None:
            sim, module = missing
            raise PluginError(f"env.id: {env_id} is a {sim} env, and {sim} is not installed here ({one_line(e)}); "
                              f"{install_hint(module)}") from None
        what = "env.wrappers" if wrappers else "env.id"
        raise PluginError(f"{what}: creating {env_id} with {kwargs or {}}{' and its wrappers' if wrappers else ''} "
                          f"failed: {one_line(e)}") from None
    try:
        _probe(env, f"{env_id} (env.kwargs {kwargs})" if kwargs else env_id, steps)
        obs_space = env.single_observation_space
        if not isinstance(obs_space, gym.spaces.Box | gym.spaces.Discrete):
            raise PluginError(f"env.id: {env_id} has a {type(obs_space).__name__} observation space; rlrun's models "
                              "take Box or Discrete observations, or a Dict of one and an 'action_mask': add a wrapper "
                              "(env.wrappers: [flatten_observation], or [minigrid_image] for MiniGrid)")
        return obs_space, env.single_action_space
    finally:
        env.close()


def probe_env_config(env: Any) -> tuple[gym.Space, gym.Space]:
    """``probe_env`` for an EnvConfig, whose declared spaces (if any) must be the env's; with
    ``env.id: null`` the declared spaces themselves."""
    from rlrun.data.spaces import same_space

    declared = declared_spaces(env)
    if env.id is None:
        assert declared is not None
        return declared
    spaces = probe_env(env.id, env.kwargs, env.vectorize, wrappers=env.wrappers)
    for key, ours, theirs in zip(("env.observation_space", "env.action_space"), declared or (), spaces, strict=False):
        if not same_space(ours, theirs):
            raise PluginError(f"{key}: declared {ours} but {env.id} has {theirs}")
    return spaces


def _probe(env: gym.vector.VectorEnv, env_id: str, steps: int) -> None:
    shape = env.single_observation_space.shape
    try:
        out = env.reset(seed=0)
        _check_obs(out[0], shape, env_id, "reset()")
        obs = out[0]
        for _ in range(steps):
            res = env.step(probe_actions(env, obs))
            obs = res[0]
            if len(res) != 5:
                raise PluginError(f"env.id: {env_id}.step() returned {len(res)} values, gymnasium's API has 5 "
                                  "(obs, reward, terminated, truncated, info); an old gym env?")
            _check_obs(res[0], shape, env_id, "step()")
            if np.shape(res[1]) != (1,):
                raise PluginError(f"env.id: {env_id}.step() returned a reward of shape {np.shape(res[1])[1:]}, "
                                  "expected one number per step")
    except PluginError:
        raise
    except Exception as e:  # the vector wrapper failing on the env's output: same root causes
        raise PluginError(f"env.id: {env_id} does not follow gymnasium's reset/step API: {one_line(e)}") from None


def _check_obs(obs: Any, shape: tuple[int, ...] | None, env_id: str, where: str) -> None:
    got = np.shape(obs)[1:]
    if shape is not None and got != tuple(shape):
        raise PluginError(f"env.id: {env_id}.{where} returned observations of shape {got}, its observation_space "
                          f"says {tuple(shape)}")


