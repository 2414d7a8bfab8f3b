"""RLlib's Atari experiments in rlrun's terms. RLlib wraps an Atari env's frames in its DeepMind preprocessing
(``preprocessor_pref: deepmind``, its default) and gives them to its vision net; rlrun-rllib gives the same env
gymnasium's ``AtariPreprocessing`` and ``FrameStackObservation`` with DeepMind's lives and FIRE (the
``atari_preprocessing``, ``episodic_life``, ``fire_reset`` and ``frame_stack`` wrappers) and the algorithm's
convolutional model (``cnn``, ``q_cnn``, ``twin_q_cnn``) with RLlib's filters and padding. RLlib clips an Atari
env's rewards to their sign unless ``clip_rewards`` says otherwise; so does this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlrun.app.rllib_defaults import VISION_FILTERS
from rlrun.config.typed import ConfigError

# the vector model of each algorithm -> its convolutional model
CONV_MODELS = {"model=mlp": "model=cnn", "model=q_mlp": "model=q_cnn", "model=twin_q_mlp": "model=twin_q_cnn"}
# RLlib's DeepMind wrappers as rlrun's (said once on the console)
PREPROCESSING = ("RLlib's DeepMind preprocessing: up to 30 no-ops at reset, 4 frames per action (the last two "
                 "max-pooled), a lost life ends the episode (the game goes on; the returns reported are whole "
                 "games'), FIRE pressed at each start where the game has it, {dim}x{dim} grey frames{stack}; the "
                 "model sees them scaled to [0, 1] (RLlib's vision net: 0-255)")
# SAC and TD3 on frames: RLlib 2.x's vision net ignores the Q/policy model configs' hidden sizes
SUB_MODELS_ON_FRAMES = ("q_model_config / policy_model_config: their hidden sizes are the layers after the "
                        "convolutions here (RLlib's vision net leaves them out; rlrun's critics need one at least)")


def atari_images(env: str, kwargs: Any) -> bool:
    """Whether gymnasium's ``env`` (with ``env_config``'s ``kwargs``) is an ALE game observed as images; a
    ConfigError for an ``env_config`` that is no mapping, or that sweeps an ALE game's settings."""
    import gymnasium as gym

    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"config.env_config: expected a mapping of the env's keyword arguments, got {kwargs!r}")
    spec = gym.spec(env)
    if "ale_py" not in str(spec.entry_point):
        return False
    if "grid_search" in kwargs or any(isinstance(v, Mapping) and "grid_search" in v for v in kwargs.values()):
        raise ConfigError("config.env_config: grid_search on an Atari game's settings is not supported (its "
                          "preprocessing depends on them); give each setting an experiment of its own")
    return {**spec.kwargs, **kwargs}.get("obs_type", "rgb") != "ram"


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

    model = config["model"]  # RLlib's vision defaults under the file's keys (rllib_files._translate)
    pref = config.get("preprocessor_pref", "deepmind")
    if pref != "deepmind":
        raise ConfigError(f"config.preprocessor_pref: {pref!r} is not supported on Atari envs; rlrun-rllib applies "
                          "RLlib's default, deepmind (drop the key)")
    dim, stack = model["dim"], model["framestack"]
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise ConfigError(f"config.model.dim: expected a positive frame size, got {dim!r}")
    if not isinstance(stack, bool):
        raise ConfigError(f"config.model.framestack: expected true or false, got {stack!r}")
    if model.get("conv_filters") is not None:
        filters = to_filters(model["conv_filters"])
    elif dim in VISION_FILTERS:
        filters = VISION_FILTERS[dim]
    else:
        raise ConfigError(f"config.model.dim: rlrun-rllib has RLlib's default conv_filters for "
                          f"{', '.join(f'{d}x{d}' for d in VISION_FILTERS)} frames, not {dim}x{dim}; give "
                          "config.model.conv_filters")
    frameskip = {**gym.spec(env).kwargs, **(config.get("env_config") or {})}.get("frameskip", 1)
    wrappers: list[dict[str, Any]] = [{"name": "atari_preprocessing", "noop_max": 30,
                                       "frame_skip": 4 if frameskip == 1 else 1, "screen_size": dim},
                                      {"name": "episodic_life"}, {"name": "fire_reset", "missing_ok": True}]
    if stack:
        wrappers.append({"name": "frame_stack", "stack_size": 4})
    notes.append(PREPROCESSING.format(dim=dim, stack=", 4 stacked" if stack else ""))
    if any(k in user for k in ("q_model_config", "Q_model", "policy_model_config", "policy_model")):
        notes.append(SUB_MODELS_ON_FRAMES)
    out: list[tuple[str, Any]] = [("env.wrappers", wrappers), ("model.conv_filters", filters),
                                  ("model.conv_padding", "same_but_last")]
    if user.get("clip_rewards") is None:  # RLlib's default: an Atari env's rewards clipped to their sign
        out.append(("algo.clip_rewards", True))
    return out
