"""Policy: how an agent acts and learns (``policy.py``), its optimizer, the multi-agent policy map."""

from typing import Any


def __getattr__(name: str) -> Any:  # names of the flat layout's rlrun.policy module, for one release
    from rlrun.core.moved import forward

    return forward(__name__, name)
