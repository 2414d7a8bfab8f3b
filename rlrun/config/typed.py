"""Plain data -> typed dataclasses, with one clear error per mistake.

``from_dict(cls, data, path)`` checks keys (unknown ones get "did you mean") and types against the
dataclass's annotations (int, float, bool, str, Literal, Optional/Union, list, dict, nested
dataclasses) and raises ``ConfigError`` naming the dotted key and the offending value. rlrun's
config schemas (config.py) and ``rlrun-eval``'s arguments use it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from rlrun.core.errors import suggest


class ConfigError(ValueError):
    """Invalid configuration; ``str()`` is the complete message shown to the user."""


def from_dict(cls: type, data: Any, path: str) -> Any:
    """Build dataclass ``cls`` from plain ``data``, checking keys and types; ``path`` names it."""
    if dataclasses.is_dataclass(data):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of options, got {show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"{_join(path, key)}: unknown key{suggest(str(key), list(fields))}. "
                f"Valid keys{' for ' + path if path else ''}: {', '.join(fields)}"
            )
    kwargs = {k: _check(hints[k], v, _join(path, k)) for k, v in data.items()}
    return cls(**kwargs)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def show(v: Any) -> str:
    """``3 (int)``: a value and its type, for error messages."""
    return f"{v!r} ({type(v).__name__})"


def _check(tp: Any, v: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return v
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check(a, v, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {show(v)} matches none of {tp}")
    if origin is Literal:
        if v not in args:
            raise ConfigError(
                f"{path}: {v!r} is not one of {', '.join(map(repr, args))}{suggest(str(v), list(map(str, args)))}"
            )
        return v
    if origin is list:
        if not isinstance(v, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {show(v)}")
        return [_check(args[0], x, f"{path}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise ConfigError(f"{path}: expected a mapping, got {show(v)}")
        return {str(k): _check(args[1], x, _join(path, k)) for k, x in v.items()}
    if tp is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{path}: expected true or false, got {show(v)}")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{path}: expected an integer, got {show(v)}")
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{path}: expected a number, got {show(v)}")
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise ConfigError(f"{path}: expected a string, got {show(v)}")
        return v
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, v, path)
    raise TypeError(f"schema type {tp} at {path} is not supported by rlrun.config.typed")


def to_dict(cfg: Any) -> dict[str, Any]:
    """A RunConfig (or any config dataclass) as plain nested data, for logging and checkpoints."""
    return dataclasses.asdict(cfg)
