"""Models and action distributions: MLP, CNN, LSTM, the numpy actor, sequence padding."""

from typing import Any


def __getattr__(name: str) -> Any:  # names of the flat layout's rlrun.models module, for one release
    from rlrun.core.moved import forward

    return forward(__name__, name)
