"""Module paths of rlrun's flat layout before 2026-11-25 (``rlrun.trainer``, ``rlrun.workers``,
``rlrun.cli``, ``rlrun.client``, ...), kept importable for one release with a ``DeprecationWarning``.

An old module path becomes a module that forwards each name to where it lives now; the four old
modules whose names are layer packages now (``rlrun.policy``, ``rlrun.envs``, ``rlrun.models``,
``rlrun.config``) forward through their package's ``__getattr__``. The targets are imported by name
(``importlib``), the way plugins are, so this core module does not depend on the layers above it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old module -> the modules its names live in now (the first one also for `import old as m; m.x`)
_MOVED: dict[str, tuple[str, ...]] = {
    "rlrun.trainer": ("rlrun.training.trainer", "rlrun.algos.algorithm"),
    "rlrun.workers": ("rlrun.sources.rollout_worker",), "rlrun.plugins": ("rlrun.sources.plugins",),
    "rlrun.worker_set": ("rlrun.sources.worker_set",), "rlrun.algorithm": ("rlrun.algos.algorithm",),
    "rlrun.policy": ("rlrun.policy.policy", "rlrun.policy.policy_map"), "rlrun.batch": ("rlrun.data.batch",),
    "rlrun.postprocessing": ("rlrun.data.postprocessing",), "rlrun.registry": ("rlrun.core.registry",),
    "rlrun.errors": ("rlrun.core.errors",), "rlrun.metrics": ("rlrun.core.metrics",),
    "rlrun.callbacks": ("rlrun.sources.callbacks",), "rlrun.models": ("rlrun.models.base",),
    "rlrun.distributions": ("rlrun.models.distributions",), "rlrun.envs": ("rlrun.envs.make",),
    "rlrun.wrappers": ("rlrun.envs.wrappers",), "rlrun.optim": ("rlrun.policy.optim",),
    "rlrun.runner": ("rlrun.app.runner",), "rlrun.cli": ("rlrun.app.cli", "rlrun.app.compose"),
    "rlrun.compose": ("rlrun.app.compose",), "rlrun.client": ("rlrun.app.client",),
    "rlrun.config": ("rlrun.training.validate", "rlrun.config.schemas", "rlrun.config.typed", "rlrun.core.metrics",
                     "rlrun.config.multi_agent"),
    "rlrun.multi_agent": ("rlrun.policy.policy_map", "rlrun.envs.multi_agent"),
    "rlrun.offline": ("rlrun.data.episodes",), "rlrun.sweep": ("rlrun.app.sweep",),
    "rlrun.console": ("rlrun.core.quiet",),
}


class _MovedModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        for target in _MOVED[self.__name__]:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
        new = _MOVED[self.__name__][0]
        raise AttributeError(f"module {self.__name__!r} (moved to {new}) has no attribute {name!r}")


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module paths above: a module that forwards to the new ones, with a warning."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(f"{spec.name} moved to {_MOVED[spec.name][0]} (rlrun's internal layout); import public names "
                      f"from 'rlrun' instead. The old path goes in the next release.", DeprecationWarning, stacklevel=2)
        return _MovedModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_moved_paths() -> None:
    """Let the old module paths import (``rlrun/__init__.py`` calls it once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


def forward(package: str, name: str) -> Any:
    """``getattr`` for a layer package whose name an old module had (``rlrun.policy``, ``rlrun.envs``,
    ``rlrun.models``, ``rlrun.config``): the name from where it lives now, with a warning."""
    if package not in _MOVED:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    for target in _MOVED[package]:
        module = importlib.import_module(target)
        if hasattr(module, name):
            warnings.warn(f"'from {package} import {name}' is the flat layout's path; import it from 'rlrun' "
                          f"(or {target}). The old path goes in the next release.", DeprecationWarning, stacklevel=3)
            return getattr(module, name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
