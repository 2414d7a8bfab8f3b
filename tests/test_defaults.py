"""Defaults live in one place: every YAML file equals its schema's defaults (or holds the same keys,
where a file is a variant such as rollout/ray.yaml), each algo YAML names the algorithm's default
loss, and ``run()`` from Python builds the same config as the CLI for the same overrides."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from rlrun.algos.algorithm import get_algorithm
from rlrun.app.cli import compose
from rlrun.config.schemas import EnvConfig, RolloutConfig, RunConfig, TrackingConfig
from rlrun.config.typed import to_dict
from rlrun.core.registry import ALGOS, LOSSES, MODELS
from rlrun.sources.plugins import load_builtins
from rlrun.training.validate import build_config, normalize_stop

load_builtins()
CONF = Path(__file__).resolve().parents[1] / "conf"


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("defaults", None)
    return data


def keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and v:
            out |= keys(v, f"{prefix}{k}.")
    return out


def schema_defaults(registry, name: str) -> dict:
    return dataclasses.asdict(registry.entry(name).config_cls())


@pytest.mark.parametrize(("group", "registry"), [("algo", ALGOS), ("loss", LOSSES), ("model", MODELS)])
def test_every_registered_option_file_equals_its_schema(group, registry):
    files = {p.stem: p for p in (CONF / group).glob("*.yaml") if p.stem != "custom"}
    assert files, group
    for path in files.values():
        data = load(path)
        assert data["name"] in registry, f"{path}: '{data['name']}' is not a registered {group}"
        expected = schema_defaults(registry, data["name"])
        assert data == expected, f"{path} differs from {registry.entry(data['name']).config_cls.__name__}: " + str(
            {k: (data.get(k), expected.get(k)) for k in set(data) | set(expected) if data.get(k) != expected.get(k)})


def test_every_built_in_algo_has_a_yaml_file_naming_its_default_loss():
    for name in ALGOS.names():
        path = CONF / "algo" / f"{name}.yaml"
        defaults = yaml.safe_load(path.read_text())["defaults"]
        assert {"/loss@_global_.loss": get_algorithm(name).default_loss} in defaults, path


@pytest.mark.parametrize(("path", "cls", "exact"), [
    ("env/cartpole.yaml", EnvConfig, True), ("env/pendulum.yaml", EnvConfig, False),
    ("rollout/local.yaml", RolloutConfig, True), ("rollout/ray.yaml", RolloutConfig, False),
    ("tracking/mlflow.yaml", TrackingConfig, True), ("tracking/none.yaml", TrackingConfig, False),
])
def test_section_files_match_their_schema(path, cls, exact):
    data, expected = load(CONF / path), dataclasses.asdict(cls())
    if exact:
        assert data == expected, path
    else:
        assert keys(data) == keys(expected), path


def test_rollout_server_yaml_holds_the_server_schemas_defaults():
    from rlrun.config.schemas import ServerConfig

    data = load(CONF / "rollout" / "server.yaml")
    assert data.pop("server") == dataclasses.asdict(ServerConfig())
    assert keys(data) == keys({k: v for k, v in dataclasses.asdict(RolloutConfig()).items() if k != "server"})


def test_config_yaml_top_level_equals_run_config_defaults():
    data = load(CONF / "config.yaml")
    data.pop("hydra")
    defaults = dataclasses.asdict(RunConfig())
    for key, value in data.items():
        want = defaults[key]
        if key == "stop":
            value = normalize_stop(value)
        assert value == want, f"config.yaml {key}: {value!r}, RunConfig: {want!r}"


def test_a_yaml_drift_is_caught(tmp_path):
    """The check above is not vacuous: a changed default is a difference."""
    data = load(CONF / "algo" / "dqn.yaml")
    data["adam_eps"] = 1e-5
    assert data != schema_defaults(ALGOS, "dqn")


@pytest.mark.parametrize("overrides", [
    [], ["algo=pg"], ["algo=a2c"], ["algo=appo"], ["algo=dqn", "model=q_mlp"], ["algo=ppo", "loss=a2c"],
])
def test_run_from_python_and_the_cli_build_the_same_config(overrides, tmp_path):
    from_cli = to_dict(compose(overrides, str(tmp_path)))
    plain: dict = {}
    for o in overrides:
        group, _, name = o.partition("=")
        plain[group] = {"name": name}
    from_python = to_dict(build_config(plain))
    for d in (from_cli, from_python):
        d.pop("output_dir")
        d.pop("experiment")
    assert from_python == from_cli
