"""Name -> object registries: algos, losses, models, envs, env wrappers, action distributions,
optimizers, heuristic policies, policy mappings, callbacks.

YAML names objects (``algo: {name: ppo}``, ``loss: {name: ppo_clip}``); this module turns names into
objects. A leaf: it imports nothing of rlrun's but the error helpers. Built-in entries register when
their module is imported (``rlrun.sources.plugins.load_builtins`` imports them); user code adds entries by
being imported too: list its module under ``plugins:`` in the config. An unknown name fails with the
known names and a "did you mean" suggestion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rlrun.core.errors import suggest as suggest  # re-exported: callers import it from here

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate registry name. ``str()`` is the full user-facing message."""

    def __str__(self) -> str:
        return str(self.args[0])


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

    def ordered(self) -> list[str]:
        """The names by their ``order`` info (lower first; 50 when unset), then by name."""
        return sorted(self._entries, key=lambda n: (self._entries[n].info.get("order", 50), n))

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
OPTIMIZERS: Registry[Any] = Registry("optimizer")
HEURISTICS: Registry[Any] = Registry("heuristic policy")  # non-learning policies for multi-agent runs
POLICY_MAPPINGS: Registry[Any] = Registry("policy mapping function")  # agent id -> policy id
WRAPPERS: Registry[Any] = Registry("env wrapper")  # gymnasium wrappers for env.wrappers
CALLBACKS: Registry[Any] = Registry("callbacks")  # Callbacks subclasses for `callbacks: [...]`
# `input: <name>`: factories (SourceContext) -> ExperienceSource (rlrun/sources/source.py); info: `prefix`
# (an input entry starting with it selects the source, e.g. "minari:"), `check` (entry, key) before compute
SOURCES: Registry[Any] = Registry("experience source")
# after each training iteration (rlrun/training/hooks.py): factories (Trainer) -> hook or None; info: `order`
HOOKS: Registry[Any] = Registry("trainer hook")
# the kinds of rollout worker (rlrun/sources/worker_kinds.py): loaders () -> worker class; info: `when`
# ((cfg, local) -> bool: this run's workers are of this kind) and `order` (asked lowest first)
WORKERS: Registry[Any] = Registry("worker kind")
