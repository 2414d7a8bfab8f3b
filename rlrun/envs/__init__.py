"""Envs: single- and multi-agent envs, vectorisation, EnvPool, wrappers, observation filters."""

from typing import Any


def __getattr__(name: str) -> Any:  # names of the flat layout's rlrun.envs module, for one release
    from rlrun.core.moved import forward

    return forward(__name__, name)
