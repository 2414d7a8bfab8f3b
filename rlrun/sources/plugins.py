"""Filling the registries: rlrun's built-in entries, then the user's ``plugins:`` modules.

Built-in algorithms, models, envs, distributions and optimizers register themselves when their
module is imported; this module only imports the packages that hold them (``rlrun.algos`` imports
its own modules). It sits above everything it imports, so no module of rlrun's core needs it except
the places that build objects from names for a run: the CLI, ``run()``, remote workers, exports.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rlrun.core.registry import RegistryError

_BUILTINS_LOADED = False


def load_builtins() -> None:
    """Import rlrun's own registering packages (idempotent, cheap after the first call)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    # they register on import
    import rlrun.algos
    import rlrun.envs.make
    import rlrun.envs.multi_agent
    import rlrun.envs.wrappers
    import rlrun.models.base
    import rlrun.models.cnn
    import rlrun.models.distributions
    import rlrun.models.lstm
    import rlrun.models.q_networks
    import rlrun.models.twin_q
    import rlrun.models.twin_q_cnn
    import rlrun.policy.optim
    import rlrun.policy.policy_map  # heuristic policies (random, always_same)
    import rlrun.sources.source  # noqa: F401


def load_plugins(modules: Sequence[str], search_dirs: Sequence[str | Path] = ()) -> None:
    """Import user modules (``plugins:`` in YAML) so their ``register`` calls run.

    ``search_dirs`` (normally the launch directory) is put on ``sys.path`` first, so a
    ``my_losses.py`` next to where ``rlrun`` was started can be named as ``my_losses``.
    """
    load_builtins()
    for d in search_dirs:
        d = str(Path(d).resolve())
        if d not in sys.path:
            sys.path.insert(0, d)
    for i, mod in enumerate(modules):
        if not mod or not all(part.isidentifier() for part in mod.split(".")):
            raise RegistryError(f"plugins[{i}]: {mod!r} is not a module name (like my_losses or pkg.models)")
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and mod.startswith(e.name):
                raise RegistryError(
                    f"plugins[{i}]: cannot import module '{mod}' (looked on sys.path, including "
                    f"{', '.join(str(d) for d in search_dirs) or 'the current directory'})"
                ) from None
            raise RegistryError(f"plugins[{i}]: module '{mod}' needs '{e.name}', which is not installed") from None
        except Exception as e:  # a bug in the plugin itself: one line; HYDRA_FULL_ERROR=1 shows the traceback
            if os.environ.get("RLRUN_TRACEBACK"):
                raise
            raise RegistryError(f"plugins[{i}]: importing '{mod}' failed: {_where(e)}") from None


def _where(e: BaseException) -> str:
    """``SyntaxError: invalid syntax (my_losses.py, line 3)`` or the innermost frame of the error."""
    import traceback

    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({Path(e.filename or '?').name}, line {e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    last = frames[-1] if frames else None
    at = f" ({Path(last.filename).name}, line {last.lineno})" if last else ""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}{at}"
