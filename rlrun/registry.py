"""Name -> object registries: algos, losses, models, envs, action distributions.

YAML names objects (``algo: {name: ppo}``, ``loss: {name: ppo_clip}``); this module turns names into
objects. User code adds entries by being imported: list its module under ``plugins:`` in the config.
An unknown name fails with the known names and a "did you mean" suggestion.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate registry name. ``str()`` is the full user-facing message."""

    def __str__(self) -> str:
        return str(self.args[0])


def suggest(name: str, known: Sequence[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known name, or an empty string."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered object plus what validation needs to know about it before anything runs.

    ``config_cls`` is the dataclass schema of the object's config group (``None``: no options).
    ``info`` holds kind-specific facts, e.g. a loss's required batch columns.
    """

    name: str
    obj: T
    config_cls: type | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """A named table of objects of one kind (``kind`` is used in messages: "loss", "model", ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self, name: str, *, config: type | None = None, override: bool = False, **info: Any
    ) -> Callable[[T], T]:
        """Decorator: ``@LOSSES.register("my_loss")`` registers the decorated object under ``name``."""

        def deco(obj: T) -> T:
            self.add(name, obj, config=config, override=override, **info)
            return obj

        return deco

    def add(
        self, name: str, obj: T, *, config: type | None = None, override: bool = False, **info: Any
    ) -> None:
        if name in self._entries and not override and self._entries[name].obj is not obj:
            raise RegistryError(
                f"{self.kind} '{name}' is already registered (by {_qualname(self._entries[name].obj)}); "
                "pass override=True to replace it"
            )
        self._entries[name] = Entry(name, obj, config, dict(info))

    def entry(self, name: str, key: str | None = None) -> Entry[T]:
        """The entry for ``name``; ``key`` is the config key that named it, for the message."""
        try:
            return self._entries[name]
        except KeyError:
            where = f"{key}: " if key else ""
            raise RegistryError(
                f"{where}unknown {self.kind} '{name}'{suggest(str(name), self.names())}. "
                f"Known {self.kind} names: {', '.join(self.names())}"
            ) from None

    def get(self, name: str, key: str | None = None) -> T:
        return self.entry(name, key).obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _qualname(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


ALGOS: Registry[Any] = Registry("algo")
LOSSES: Registry[Any] = Registry("loss")
MODELS: Registry[Any] = Registry("model")
ENVS: Registry[Any] = Registry("env")
DISTRIBUTIONS: Registry[Any] = Registry("action distribution")

_BUILTINS_LOADED = False


def load_builtins() -> None:
    """Import rlrun's own modules that register entries (idempotent, cheap after the first call)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from rlrun import distributions, envs, models  # noqa: F401
    from rlrun.algos import a2c, appo, dqn, pg, ppo  # noqa: F401


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
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and mod.startswith(e.name):
                raise RegistryError(
                    f"plugins[{i}]: cannot import module '{mod}' (looked on sys.path, including "
                    f"{', '.join(str(d) for d in search_dirs) or 'the current directory'})"
                ) from None
            raise
