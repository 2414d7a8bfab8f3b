"""RLlib's Atari experiments in rlrun's terms. RLlib wraps an Atari env's frames in its DeepMind preprocessing
(``preprocessor_pref: deepmind``, its default) and gives them to its vision net; rlrun-rllib gives the same env
gymnasium's ``AtariPreprocessing`` and ``FrameStackObservation`` (the ``atari_preprocessing`` and ``frame_stack``
wrappers) and the algorithm's convolutional model (``cnn``, ``q_cnn``, ``twin_q_cnn``) with RLlib's filters and
padding. RLlib clips an Atari env's rewards to their sign unless ``clip_rewards`` says otherwise; so does this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlrun.app.rllib_defaults import VISION_DEFAULTS, VISION_FILTERS
from rlrun.config.typed import ConfigError

# the vector model of each algorithm -> its convolutional model
CONV_MODELS = {"model=mlp": "model=cnn", "model=q_mlp": "model=q_cnn", "model=twin_q_mlp": "model=twin_q_cnn"}
# what RLlib's DeepMind wrappers do that gymnasium's AtariPreprocessing does not (said once on the console)
NOT_APPLIED = ("RLlib's EpisodicLifeEnv and FireResetEnv are not applied (an episode is a whole game, and the "
               "policy presses FIRE itself); the rest of its DeepMind preprocessing is: up to 30 no-ops at reset, "
               "4 frames per action (the last two max-pooled), {dim}x{dim} grey frames{stack}")


def atari_images(env: str, kwargs: Mapping[str, Any]) -> bool:
    """Whether gymnasium's ``env`` (with ``env_config``'s ``kwargs``) is an ALE game observed as images."""
    import gymnasium as gym

    spec = gym.spec(env)
    return "ale_py" in str(spec.entry_point) and {**spec.kwargs, **kwargs}.get("obs_type", "rgb") != "ram"


def _positive(x: Any, square: bool = False) -> int | None:
    """A positive int (or, with ``square``, ``[n, n]``'s n), else None."""
    if square and isinstance(x, list) and len(x) == 2 and x[0] == x[1]:
        x = x[0]
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None


def to_filters(value: Any) -> list[list[int]]:
    """RLlib's ``conv_filters`` (``[out, [kh, kw], stride]`` or ``[out, k, stride]``) -> ``[out, k, stride]``."""
    out: list[list[int]] = []
    for i, f in enumerate(value if isinstance(value, list) else [value]):
        parts = [_positive(f[0]), _positive(f[1], True), _positive(f[2], True)] if isinstance(
            f, list) and len(f) == 3 else [None]
        layer = [p for p in parts if p is not None]
        if len(layer) != 3:
            raise ConfigError(f"config.model.conv_filters[{i}]: expected [out_channels, kernel, stride] with square "
                              f"kernels and strides (rlrun's convolutions), got {f!r}")
        out.append(layer)
    return out


def atari_pairs(env: str, config: Mapping[str, Any], user: Mapping[str, Any], notes: list[str]
                ) -> list[tuple[str, Any]]:
    """The env wrappers, model filters and reward clipping RLlib gives Atari ``env`` under ``config``."""
    import gymnasium as gym

    model = {**VISION_DEFAULTS, **(config.get("model") or {})}
    pref = config.get("preprocessor_pref", "deepmind")
    if pref != "deepmind":
        raise ConfigError(f"config.preprocessor_pref: {pref!r} is not supported on Atari envs; rlrun-rllib applies "
                          "RLlib's default, deepmind (drop the key)")
    dim = model["dim"]
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise ConfigError(f"config.model.dim: expected a positive frame size, got {dim!r}")
    if "conv_filters" in (config.get("model") or {}) and config["model"]["conv_filters"] is not None:
        filters = to_filters(config["model"]["conv_filters"])
    elif dim in VISION_FILTERS:
        filters = VISION_FILTERS[dim]
    else:
        raise ConfigError(f"config.model.dim: RLlib has no default conv_filters for {dim}x{dim} frames "
                          f"(it has for {' and '.join(map(str, VISION_FILTERS))}); give config.model.conv_filters")
    frameskip = {**gym.spec(env).kwargs, **(config.get("env_config") or {})}.get("frameskip", 1)
    wrappers: list[dict[str, Any]] = [{"name": "atari_preprocessing", "noop_max": 30,
                                       "frame_skip": 4 if frameskip == 1 else 1, "screen_size": dim}]
    if model["framestack"]:
        wrappers.append({"name": "frame_stack", "stack_size": 4})
    notes.append(NOT_APPLIED.format(dim=dim, stack=", 4 stacked" if model["framestack"] else ""))
    out: list[tuple[str, Any]] = [("env.wrappers", wrappers), ("model.conv_filters", filters),
                                  ("model.conv_padding", "same_but_last")]
    if user.get("clip_rewards") is None:  # RLlib's default: an Atari env's rewards clipped to their sign
        out.append(("algo.clip_rewards", True))
    return out
