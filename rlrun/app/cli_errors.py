"""Hydra's own errors (override grammar, a missing ``+``, unknown keys, missing or broken config
files) as rlrun's one-line messages with the fix, instead of Hydra's multi-line text."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing

from rlrun.config.extras import available, install_hint
from rlrun.core.errors import suggest

# Hydra config options that a plugin of one of rlrun's extras provides
HYDRA_PLUGINS = {"hydra/launcher/ray": "hydra_plugins.hydra_ray_launcher",
                 "hydra/sweeper/optuna": "hydra_plugins.hydra_optuna_sweeper"}


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
        plugin = HYDRA_PLUGINS.get(missing)
        if plugin is not None and not available(plugin):  # an extra's Hydra plugin that is not installed
            return f"{missing}: Hydra's plugin {plugin} is not installed; {install_hint(plugin)}"
        known = f"; known: {', '.join(options)}" if options else ""
        return f"no config file '{missing}'{suggest(missing.rpartition('/')[2], options)}{known}"
    if isinstance(e, ConfigCompositionException):
        return _composition_line(text, overrides)
    if type(e).__module__.startswith("yaml"):
        return f"a YAML file does not parse: {' '.join(text.split())[:400]}"
    return None


def _composition_line(text: str, overrides: list[str]) -> str:
    m = re.match(r"Could not override '([^']+)'", text)
    if m and "No match in the defaults list" in text:
        group = m[1]
        return (f"{group}: not in the defaults list; add it with a plus, e.g. +{group}=<name> "
                "(as in +experiment=ppo_cartpole)")
    if m:
        key = m[1]
        section, _, leaf = key.rpartition(".")
        if section in SCHEMA_SECTIONS and (chosen := chosen_schema(section, overrides, key)) is not None:
            return _unknown_schema_key(key, *chosen)
        known = known_keys(section)
        if leaf in known:  # an existing mapping (multiagent.policies, env.kwargs): Hydra will not merge new keys in
            return _merge_line(key)
        hint = suggest(leaf, known) if known else ""
        valid = f" Valid keys for {section or 'the config'}: {', '.join(known)}." if known else ""
        return (f"{key}: unknown key{hint}.{valid} To add a key that is not in the config use "
                f"+{key}=<value>")
    if "Error while parsing" in text or "ScannerError" in text or "ParserError" in text:
        return f"a config file does not parse: {' '.join(text.split())[:400]}"
    return " ".join(text.split())[:400]


def known_keys(section: str) -> list[str]:
    """The keys a config section has (``stop``: the counters; algo/loss/model: every registered schema's)."""
    from rlrun.config.schemas import RunConfig
    from rlrun.core.metrics import STOP_COUNTERS

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
    from rlrun.core.registry import ALGOS, LOSSES, MODELS
    from rlrun.sources.plugins import load_builtins

    load_builtins()
    registry = {"algo": ALGOS, "loss": LOSSES, "model": MODELS}[section]
    out: list[str] = []
    for name in registry.names():
        cls = registry.entry(name).config_cls
        if cls is not None:
            out += [f.name for f in dataclasses.fields(cls)]
    return out


def _merge_line(key: str) -> str:
    """``key`` is an existing mapping (multiagent.policies, env.kwargs): Hydra will not merge new keys in."""
    # (Hydra's ++key=<mapping> merges into a mapping that has keys: dropping it first replaces it)
    return (f"{key}: new keys cannot be merged into this mapping; replace it whole with ~{key} +{key}=<value>, "
            f"or add one entry with +{key}.<name>=<value>")


SCHEMA_SECTIONS = ("algo", "loss", "model")  # each run's own config class: the registered algo's, loss's, model's


def chosen_schema(section: str, overrides: list[str],
                  bad_key: str) -> tuple[str, list[str], dict[str, list[str]]] | None:
    """For an unknown ``algo.<key>`` (``loss.``, ``model.``): the name this run chose for the section (the
    config composed without the bad override), that choice's keys, and every other registered choice's
    keys. None where it cannot be told (the rest does not compose, a plugin not loaded)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlrun.config.schemas import RunConfig
    from rlrun.core.registry import ALGOS, LOSSES, MODELS
    from rlrun.sources.plugins import load_builtins

    parser = OverridesParser.create()
    try:  # the other overrides, one value each (a sweep's first)
        rest = [o for o in parser.parse_overrides(overrides)
                if o.key_or_group != bad_key and not o.key_or_group.startswith("hydra")]
        args = [o.input_line for o in rest if not o.is_sweep_override() and o.input_line]
        GlobalHydra.instance().clear()
        with initialize_config_module("rlrun.conf", version_base="1.3"):
            name = str(compose("config", overrides=args)[section]["name"])
    except Exception:
        return None
    finally:
        GlobalHydra.instance().clear()
    load_builtins()
    registry = {"algo": ALGOS, "loss": LOSSES, "model": MODELS}[section]
    base = [f.name for f in dataclasses.fields(typing.get_type_hints(RunConfig)[section])]

    def keys(choice: str) -> list[str]:
        cls = registry.entry(choice).config_cls if choice in registry.names() else None
        return [f.name for f in dataclasses.fields(cls)] if cls is not None else base
    if name not in registry.names():
        return None
    return name, keys(name), {n: keys(n) for n in registry.names() if n != name}


def _unknown_schema_key(key: str, name: str, known: list[str], others: dict[str, list[str]]) -> str:
    """``algo.double_q`` on PPO: whose key it is; ``algo.lrr``: the closest of PPO's own keys, as an override."""
    section, _, leaf = key.rpartition(".")
    valid = f"Valid keys for {section} {name}: {', '.join(known)}."
    if leaf in known:  # an existing mapping (model.custom_kwargs ...): Hydra will not merge new keys in
        return _merge_line(key)
    owners = sorted(n for n, ks in others.items() if leaf in ks)
    if owners:
        whose = ", ".join(owners)
        return f"{key}: a key of {section} {whose}, not of {section} {name} (this run's {section}). {valid}"
    close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.5)
    hint = f" (did you mean {section}.{close[0]}?)" if close else ""
    return f"{key}: unknown key{hint}. {valid}"


def _unparsable(overrides: list[str]) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except Exception:
            return o
    return None


def unknown_choice_line(group: str, choice: str, options: list[str], argv: list[str]) -> str:
    """``group=choice`` names no config file: say so, with the likeliest fix."""
    line = f"{group}: unknown config '{choice}'"
    lower = [o for o in options if o.lower() == choice.lower()]
    if lower:
        line += f" (did you mean '{lower[0]}'? config names are lower case)"
    elif group == "env" and re.fullmatch(r"[\w:./]+-v\d+", choice):
        line += f": for a gymnasium env id use env.id={choice} (env= picks a file from conf/env)"
    elif group in ("loss", "model") and choice in _registered(group, argv):
        line += f": '{choice}' is a registered {group}; use {group}=custom {group}.name={choice}"
    else:
        line += suggest(choice, options)
    return f"{line}. Known {group} configs: {', '.join(options)}"


def _registered(group: str, argv: list[str]) -> list[str]:
    """Registered loss or model names, the ``plugins=[...]`` of ``argv`` included."""
    from rlrun.core.registry import LOSSES, MODELS

    if load_argv_plugins(argv) is not None:
        return []  # the plugin's own error is reported when the run starts
    return (LOSSES if group == "loss" else MODELS).names()


def load_argv_plugins(argv: list[str]) -> str | None:
    """Import rlrun's built-ins and the ``plugins=[...]`` modules of a command line (from the current
    directory, as a run would); the import error's message, or None."""
    from rlrun.sources.plugins import load_builtins, load_plugins

    load_builtins()
    for arg in argv:
        m = re.fullmatch(r"\+{0,2}plugins=\[(.*)\]", arg)
        if m:
            try:
                load_plugins([p.strip() for p in m[1].split(",") if p.strip()], search_dirs=["."])
            except Exception as e:
                return str(e)
    return None


def preset_keys(experiment: str) -> set[str]:
    """Dotted keys a packaged ``+experiment`` preset sets (its defaults list aside)."""
    from rlrun.app.compose import read_preset

    data = dict(read_preset(experiment) or {})
    data.pop("defaults", None)

    def walk(d: dict, prefix: str) -> set[str]:
        out = set()
        for k, v in d.items():
            out |= walk(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
        return out

    return walk(data, "")


def blame_preset(message: str, experiment: str | None, overrides: list[str]) -> str:
    """An unknown-key error about a key the user never typed gets where it came from: the preset."""
    key, _, what = message.partition(":")
    key = key.strip()
    typed = any(re.match(rf"[+~]*{re.escape(key)}=", o) for o in overrides)
    # only a key that does not exist for the user's choices (a value error names its own fix)
    if not experiment or typed or not what.strip().startswith("unknown key") or key not in preset_keys(experiment):
        return message
    return (f"{message} [{key} is set by +experiment={experiment}, not by you: a preset is tuned for its own "
            f"algo, model and env; drop the preset, or remove the key with ~{key}]")
