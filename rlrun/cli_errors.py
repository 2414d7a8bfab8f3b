"""Hydra's own errors (override grammar, a missing ``+``, unknown keys, missing or broken config
files) as rlrun's one-line messages with the fix, instead of Hydra's multi-line text."""

from __future__ import annotations

import dataclasses
import re
import typing

from rlrun.errors import suggest


def hydra_error_line(e: BaseException, overrides: list[str]) -> str | None:
    """The one line for a Hydra error raised while composing ``overrides``, or None if ``e`` is not one."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    text = str(e).strip()
    if isinstance(e, OverrideParseException):
        bad = _unparsable(overrides)
        where = f"'{bad}'" if bad else "an override"
        return (f"{where} is not valid override syntax ({text.splitlines()[0]}); write key=value, +key=value to add "
                "a key, ~key to delete one; quote values with / [ ] { } , or spaces, e.g. '++stop={rollout/"
                "episode_return_mean: 400}'")
    if isinstance(e, MissingConfigException):
        m = re.search(r"Could not find '([^']+)'", text)
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        missing = m[1] if m else text.splitlines()[0]
        known = f"; known: {', '.join(options)}" if options else ""
        return f"no config file '{missing}'{suggest(missing.rpartition('/')[2], options)}{known}"
    if isinstance(e, ConfigCompositionException):
        return _composition_line(text)
    if type(e).__module__.startswith("yaml"):
        return f"a YAML file does not parse: {' '.join(text.split())[:400]}"
    return None


def _composition_line(text: str) -> str:
    m = re.match(r"Could not override '([^']+)'", text)
    if m and "No match in the defaults list" in text:
        group = m[1]
        return (f"{group}: not in the defaults list; add it with a plus, e.g. +{group}=<name> "
                "(as in +experiment=ppo_cartpole)")
    if m:
        key = m[1]
        section, _, leaf = key.rpartition(".")
        known = known_keys(section)
        hint = suggest(leaf, known) if known else ""
        valid = f" Valid keys for {section or 'the config'}: {', '.join(known)}." if known else ""
        return (f"{key}: unknown key{hint}.{valid} To add a key that is not in the config use "
                f"+{key}=<value>")
    if "Error while parsing" in text or "ScannerError" in text or "ParserError" in text:
        return f"a config file does not parse: {' '.join(text.split())[:400]}"
    return " ".join(text.split())[:400]


def known_keys(section: str) -> list[str]:
    """The keys a config section has (``stop``: the counters; algo/loss/model: every registered schema's)."""
    from rlrun.config import RunConfig
    from rlrun.metrics import STOP_COUNTERS

    if section == "stop":
        return list(STOP_COUNTERS)
    cls: typing.Any = RunConfig
    for part in section.split(".") if section else []:
        hints = typing.get_type_hints(cls)
        if part not in hints or not dataclasses.is_dataclass(hints[part]):
            return []
        cls = hints[part]
    keys = [f.name for f in dataclasses.fields(cls)]
    if section in ("algo", "loss", "model"):
        keys = sorted(set(keys) | set(_registered_keys(section)))
    return keys


def _registered_keys(section: str) -> list[str]:
    from rlrun.plugins import load_builtins
    from rlrun.registry import ALGOS, LOSSES, MODELS

    load_builtins()
    registry = {"algo": ALGOS, "loss": LOSSES, "model": MODELS}[section]
    out: list[str] = []
    for name in registry.names():
        cls = registry.entry(name).config_cls
        if cls is not None:
            out += [f.name for f in dataclasses.fields(cls)]
    return out


def _unparsable(overrides: list[str]) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except Exception:
            return o
    return None
