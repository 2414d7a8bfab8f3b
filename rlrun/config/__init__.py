"""Config schemas (one module per concern), the typed dict -> dataclass parser and value domains.

The one validator that checks a whole run's config is ``rlrun/training/validate.py``."""

from typing import Any


def __getattr__(name: str) -> Any:  # names of the flat layout's rlrun.config module, for one release
    from rlrun.core.moved import forward

    return forward(__name__, name)
