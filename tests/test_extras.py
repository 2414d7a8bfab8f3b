"""The core install and its extras: a config that needs an extra that is not installed gets one line
naming the ``pip install`` that adds it, before anything starts (the suite itself has every extra)."""

import pytest

from rlrun.app.cli_errors import hydra_error_line
from rlrun.config.extras import EXTRA_OF, available
from tests.conftest import REPO, run_cli, without_module


@pytest.mark.parametrize(("module", "args", "line"), [
    ("ray", ["+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=1"],
     "rollout.num_workers=1 (Ray workers) needs the ray package, which is not installed; "
     "install rlrun's ray extra: pip install -e \".[ray]\""),
    ("uvicorn", ["+experiment=ppo_cartpole", "rollout=server"],
     "rollout=server (the policy server) needs the uvicorn package, which is not installed; "
     "install rlrun's serving extra: pip install -e \".[serving]\""),
    ("minari", ["+experiment=bc_cartpole", "input=minari:cartpole/expert-v0"],
     "input=minari:cartpole/expert-v0 needs the minari package, which is not installed; "
     "install rlrun's offline extra: pip install -e \".[offline]\""),
    ("pettingzoo", ["+experiment=ppo_rps"], "No module named 'pettingzoo'; install rlrun's multiagent extra: "
                                            "pip install -e \".[multiagent]\""),
    ("minigrid", ["+experiment=ppo_minigrid_empty"],
     "env.id: 'MiniGrid-Empty-5x5-v0' needs the minigrid package, which cannot be imported (No module named "
     "'minigrid'); install rlrun's minigrid extra: pip install -e \".[minigrid]\""),
    ("Box2D", ["+experiment=rainbow_lunarlander"], "env.id: LunarLander-v3 is a Box2D env, and Box2D is not installed "
                                                   "here"),
])
def test_a_config_that_needs_a_missing_extra_names_it_in_one_line(tmp_path, module, args, line):
    p = run_cli([*args, "tracking=none"], tmp_path, env=without_module(tmp_path, module))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and line in lines[0], p.stderr[-2000:]
    assert not list(tmp_path.glob("outputs/*/*/config.yaml"))  # refused before the run started (no run config)


@pytest.mark.parametrize(("missing", "plugin", "extra"), [
    ("hydra/launcher/ray", "hydra_plugins.hydra_ray_launcher", "ray-launcher"),
    ("hydra/sweeper/optuna", "hydra_plugins.hydra_optuna_sweeper", "optuna"),
])
def test_a_sweep_plugin_that_is_not_installed_names_its_extra(monkeypatch, missing, plugin, extra):
    from hydra.errors import MissingConfigException

    from rlrun.app import cli_errors

    # Hydra's own text where the plugin (its config group option) is not installed
    e = MissingConfigException(f"In 'hydra/config': Could not find '{missing}'\n\nAvailable options in "
                               f"'{missing.rpartition('/')[0]}':\n\tbasic\n")
    monkeypatch.setattr(cli_errors, "available", lambda module: module != plugin)
    assert hydra_error_line(e, []) == (f"{missing}: Hydra's plugin {plugin} is not installed; install rlrun's "
                                       f"{extra} extra: pip install -e \".[{extra}]\"")
    monkeypatch.setattr(cli_errors, "available", lambda module: True)  # installed: Hydra's options, as before
    assert hydra_error_line(e, []).startswith(f"no config file '{missing}'")


def test_every_extra_named_in_a_message_exists_and_the_test_extra_has_them_all():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip's own copy of tomli
        from pip._vendor import tomli as tomllib

    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    assert set(EXTRA_OF.values()) <= set(extras)
    everything = extras["all"][0]
    assert all(e in everything for e in set(EXTRA_OF.values()) - {"envpool"}) and "rlrun[all]" in extras["test"]
    core = " ".join(project["dependencies"])
    for heavy in ("ray", "pettingzoo", "minigrid", "minari", "uvicorn", "optuna", "hydra-ray-launcher"):
        assert heavy not in core, heavy  # the core install stays small


def test_available_says_what_can_be_imported():
    assert available("numpy") and not available("no_such_module_here") and not available("no_such.sub")
