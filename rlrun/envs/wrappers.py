"""Env wrappers from YAML: ``env.wrappers: [name, {name: frame_stack, stack_size: 4}, ...]``.

A WRAPPERS entry is a callable ``(env: gymnasium.Env, **kwargs) -> gymnasium.Env`` (a wrapper class
is one) applied to each sub-env, in the order listed, in training, evaluation and ``rlrun-eval``
alike. An entry may also register ``vector=(vector_env, **kwargs) -> VectorEnv``: when every listed
wrapper has one, the wrappers are applied to the whole vector env, so a numpy-vectorised env
(CartPole-v1) keeps its speed; otherwise the sub-envs are built one by one and wrapped each.
User code registers more: ``WRAPPERS.register("my_wrapper")`` in a ``plugins:`` module.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import vector as vw

from rlrun.core.registry import WRAPPERS, RegistryError


class WrapperSpec(NamedTuple):
    name: str
    kwargs: dict[str, Any]
    key: str  # where it was written: env.wrappers[2]


def parse_wrappers(items: Sequence[Any]) -> list[WrapperSpec]:
    """``env.wrappers`` entries (a name, or a mapping with ``name`` and the wrapper's arguments) ->
    specs with known names and arguments the wrapper accepts; ``RegistryError`` names the entry."""
    out = []
    for i, item in enumerate(items):
        key = f"env.wrappers[{i}]"
        if isinstance(item, str):
            name, kwargs = item, {}
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            name, kwargs = item["name"], {k: v for k, v in item.items() if k != "name"}
        else:
            raise RegistryError(f"{key}: expected a wrapper name or {{name: <wrapper>, <argument>: <value>, ...}}, "
                                f"got {item!r}")
        entry = WRAPPERS.entry(name, f"{key}.name")
        _check_arguments(entry.obj, kwargs, f"{key} ({name})")
        out.append(WrapperSpec(name, kwargs, key))
    _check_lives_order([s.name for s in out])
    return out


def _check_lives_order(names: list[str]) -> None:
    """episodic_life counts whole games: what skips frames or ends episodes goes below it, FIRE above."""
    if "episodic_life" not in names:
        return
    at = names.index("episodic_life")
    for i, name in enumerate(names):
        if name == "fire_reset" and i < at:
            raise RegistryError(f"env.wrappers: fire_reset (env.wrappers[{i}]) comes before episodic_life "
                                f"(env.wrappers[{at}]); put it after, so that FIRE starts each life, not only each "
                                "game")
        if name in ("atari_preprocessing", "time_limit") and i > at:
            raise RegistryError(f"env.wrappers: {name} (env.wrappers[{i}]) comes after episodic_life "
                                f"(env.wrappers[{at}]); put it before, so that episodic_life sees whole games")


def _check_arguments(fn: Callable[..., Any], kwargs: dict[str, Any], where: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the env probe will tell
        return
    params = list(sig.parameters.values())[1:]  # the first is the env
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for k in kwargs:
        if k not in names:
            raise RegistryError(f"{where}: unknown argument '{k}'; it takes {', '.join(names) or 'no arguments'}")
    missing = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and p.name not in kwargs]
    if missing:
        raise RegistryError(f"{where}: missing argument {', '.join(missing)}")


def all_vectorised(specs: Sequence[WrapperSpec]) -> bool:
    return all(WRAPPERS.entry(s.name).info.get("vector") is not None for s in specs)


def wrap_env(env: gym.Env, specs: Sequence[WrapperSpec]) -> gym.Env:
    for s in specs:
        env = WRAPPERS.get(s.name)(env, **s.kwargs)
    return env


def wrap_vector_env(env: gym.vector.VectorEnv, specs: Sequence[WrapperSpec]) -> gym.vector.VectorEnv:
    for s in specs:
        env = WRAPPERS.entry(s.name).info["vector"](env, **s.kwargs)
    return env


def single_env_wrappers(specs: Sequence[WrapperSpec]) -> list[Any]:
    """The specs as gymnasium's ``make_vec(..., wrappers=[...])`` wants them: ``env -> wrapped env``."""
    return [functools.partial(WRAPPERS.get(s.name), **s.kwargs) for s in specs]


# --------------------------------------------------------------------------- built-ins
def _masked_box(space: gym.Space, keep: list[int]) -> gym.spaces.Box:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"mask_observation needs a 1-D Box observation space, got {space}")
    bad = [k for k in keep if not -space.shape[0] <= k < space.shape[0]]
    if bad or not keep:
        raise ValueError(f"keep={keep}: indices must be within the {space.shape[0]} observation entries")
    return gym.spaces.Box(space.low[keep], space.high[keep], dtype=space.dtype)


def mask_observation(env: gym.Env, keep: list[int]) -> gym.Env:
    """Keep only observation entries ``keep`` (e.g. CartPole without velocities: ``keep: [0, 2]``)."""
    idx = list(keep)
    return gym.wrappers.TransformObservation(env, lambda o: o[idx], _masked_box(env.observation_space, idx))


def mask_observation_vector(env: gym.vector.VectorEnv, keep: list[int]) -> gym.vector.VectorEnv:
    idx = list(keep)
    single = _masked_box(env.single_observation_space, idx)
    batch = gym.vector.utils.batch_space(single, env.num_envs)
    return vw.TransformObservation(env, lambda o: o[:, idx], observation_space=batch, single_observation_space=single)


def resize_observation(env: gym.Env, shape: list[int]) -> gym.Env:
    """Resize image observations ``[H, W(, C)]`` to ``shape`` = [height, width] (bilinear; Pillow,
    so no OpenCV is needed, unlike gymnasium's ResizeObservation)."""
    from PIL import Image

    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (2, 3) or len(shape) != 2:
        raise ValueError(f"resize_observation needs image observations [H, W(, C)] and shape=[height, width]; "
                         f"got {space} and shape={shape}")
    h, w = int(shape[0]), int(shape[1])
    new_shape = (h, w, *space.shape[2:])
    new_space = gym.spaces.Box(0, 255, new_shape, np.uint8) if space.dtype == np.uint8 else \
        gym.spaces.Box(-np.inf, np.inf, new_shape, np.float32)

    bilinear = Image.Resampling.BILINEAR

    def resize(o: np.ndarray) -> np.ndarray:
        if o.dtype == np.uint8:
            return np.asarray(Image.fromarray(o).resize((w, h), bilinear))
        chans = o[..., None] if o.ndim == 2 else o
        out = np.stack([np.asarray(Image.fromarray(chans[..., c].astype(np.float32)).resize((w, h), bilinear))
                        for c in range(chans.shape[-1])], axis=-1)
        return out[..., 0] if o.ndim == 2 else out

    return gym.wrappers.TransformObservation(env, resize, new_space)


def minigrid_image(env: gym.Env) -> gym.Env:
    """MiniGrid's image-only observation (``minigrid.wrappers.ImgObsWrapper``): the agent's 7x7x3 view."""
    try:
        from minigrid.wrappers import ImgObsWrapper
    except ImportError:
        raise RegistryError("env.wrappers: minigrid_image needs the minigrid package (pip install minigrid)") from None
    return ImgObsWrapper(env)


def frame_stack(env: gym.Env, stack_size: int = 4) -> gym.Env:
    """The last ``stack_size`` observations, stacked on a new first axis (gymnasium's FrameStackObservation)."""
    return gym.wrappers.FrameStackObservation(env, int(stack_size))


def atari_preprocessing(env: gym.Env, noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84,
                        terminal_on_life_loss: bool = False, grayscale_obs: bool = True) -> gym.Env:
    """The standard Atari preprocessing (gymnasium's AtariPreprocessing, Machado et al. 2018): up to
    ``noop_max`` no-ops at reset, ``frame_skip`` frames per action with the last two max-pooled,
    ``screen_size``x``screen_size`` grey frames (uint8). The env must not skip frames itself
    (``env.kwargs: {frameskip: 1}``). With ``terminal_on_life_loss`` a lost life ends the episode."""
    try:
        return gym.wrappers.AtariPreprocessing(env, noop_max=int(noop_max), frame_skip=int(frame_skip),
                                               screen_size=int(screen_size), grayscale_obs=bool(grayscale_obs),
                                               terminal_on_life_loss=bool(terminal_on_life_loss))
    except gym.error.DependencyNotInstalled as e:
        raise ValueError(f"atari_preprocessing needs OpenCV ({e}); install rlrun's atari extra: "
                         'pip install -e ".[atari]"') from None


def _env_name(env: gym.Env) -> str:
    return env.spec.id if env.spec else type(env.unwrapped).__name__


def _ale(env: gym.Env, wrapper: str) -> Any:
    ale = getattr(env.unwrapped, "ale", None)
    if ale is None:
        raise ValueError(f"{wrapper} needs an Atari env (ale-py's, which has lives and a FIRE button); "
                         f"{_env_name(env)} is not one")
    return ale


GAME_KEYS = ("game_over", "game_return", "game_length")


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode for learning (``terminated``), and the next ``reset`` continues the
    same game with a no-op step instead of starting a new one (DeepMind's EpisodicLifeEnv, as RLlib's
    and SB3's Atari wrappers do it; gymnasium's ``terminal_on_life_loss`` starts a new game instead).
    Only a game's end or a seed starts a new game: a reset in the middle of a life (a worker with
    ``batch_mode: complete_episodes`` starting its episodes afresh) plays the game on too.
    ``info["game_over"]`` says whether the game itself ended, and then ``info["game_return"]`` and
    ``info["game_length"]`` give its score and its steps, counted here, below the wrappers that add
    hidden steps (this reset's no-op, ``fire_reset``'s FIRE), as SB3's Monitor counts them: rlrun's
    episode statistics (training and evaluation) are these whole games. The callbacks' episodes and the
    rows' ``eps_id`` and ``t`` are the learning episodes, one a life. A game that ends inside a hidden
    step (ALE's frame cap landing on one) is not reported. Wrappers that step or end episodes
    (``atari_preprocessing``, ``time_limit``) go before it: their games would not be seen whole."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._ale = _ale(env, "episodic_life")
        self._lives = 0
        self._game_over = True  # no game under way: the next reset starts one
        self._return, self._length = 0.0, 0  # the game's so far

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        self._game_over = game_over = bool(terminated or truncated)
        lives = self._ale.lives()
        life_lost = not game_over and 0 < lives < self._lives
        self._lives = lives
        info["game_over"] = game_over
        if game_over:
            info["game_return"], info["game_length"] = self._return, self._length
        return obs, reward, terminated or life_lost, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        new_game = self._game_over or seed is not None
        if not new_game:  # a lost life (or a worker starting its episodes afresh): play the game on
            obs, _, _, _, info = self.step(0)
            new_game = info["game_over"]
        if new_game:
            obs, info = self.env.reset(seed=seed, options=options)
            self._return, self._length = 0.0, 0
            self._game_over = False
        _drop_game_keys(info)
        self._lives = self._ale.lives()
        return obs, info


def _drop_game_keys(info: dict[str, Any]) -> None:
    for k in GAME_KEYS:  # a reset's info: no game ends in it that the statistics could see
        info.pop(k, None)


def episodic_life(env: gym.Env) -> gym.Env:
    """A lost life ends the learning episode; the game goes on (``EpisodicLife``). Put it after
    ``atari_preprocessing`` and before ``fire_reset``."""
    return EpisodicLife(env)


class FireReset(gym.Wrapper):
    """Press FIRE (then the next action) after each reset, for games that wait for it to start
    (Breakout's ball; DeepMind's FireResetEnv, as RLlib and SB3 apply it). After ``episodic_life`` it
    fires at each new life too. ``fire_reset`` checks that the game's action 1 is FIRE."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        _drop_game_keys(info)
        return obs, info


def fire_reset(env: gym.Env, missing_ok: bool = False) -> gym.Env:
    """Press FIRE after each reset (``FireReset``). ``missing_ok``: leave a game without FIRE as it is
    (RLlib's rule, so one setting serves a sweep over games); otherwise such a game is refused."""
    _ale(env, "fire_reset")
    unwrapped: Any = env.unwrapped  # ale-py's AtariEnv
    meanings = list(unwrapped.get_action_meanings())
    if len(meanings) >= 3 and meanings[1] == "FIRE":
        return FireReset(env)
    if missing_ok:
        return env
    raise ValueError(f"fire_reset needs a game whose action 1 is FIRE; {_env_name(env)} has {meanings}")


def time_limit(env: gym.Env, max_episode_steps: int) -> gym.Env:
    """Truncate episodes after ``max_episode_steps`` steps."""
    return gym.wrappers.TimeLimit(env, int(max_episode_steps))


def clip_reward(env: gym.Env, min_reward: float | None = None, max_reward: float | None = None) -> gym.Env:
    return gym.wrappers.ClipReward(env, min_reward, max_reward)


def clip_reward_vector(env: gym.vector.VectorEnv, min_reward: float | None = None,
                       max_reward: float | None = None) -> gym.vector.VectorEnv:
    return vw.ClipReward(env, min_reward, max_reward)


def flatten_observation(env: gym.Env) -> gym.Env:
    return gym.wrappers.FlattenObservation(env)


WRAPPERS.add("mask_observation", mask_observation, vector=mask_observation_vector)
WRAPPERS.add("clip_reward", clip_reward, vector=clip_reward_vector)
WRAPPERS.add("flatten_observation", flatten_observation, vector=vw.FlattenObservation)
WRAPPERS.add("frame_stack", frame_stack)
WRAPPERS.add("time_limit", time_limit)
WRAPPERS.add("atari_preprocessing", atari_preprocessing)
WRAPPERS.add("episodic_life", episodic_life)
WRAPPERS.add("fire_reset", fire_reset)
WRAPPERS.add("resize_observation", resize_observation)
WRAPPERS.add("minigrid_image", minigrid_image)
