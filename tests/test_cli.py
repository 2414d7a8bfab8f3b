from importlib.resources import files

import pytest

from rlrun.cli import compose

EXPERIMENTS = sorted(p.name[:-5] for p in files("rlrun.conf").joinpath("experiment").iterdir()
                     if p.name.endswith(".yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name):
    cfg = compose([f"+experiment={name}"])
    assert cfg.experiment == name
    assert cfg.stop


@pytest.mark.parametrize("group", ["algo=pg", "tracking=none", "debug=fast", "model=mlp", "env=cartpole"])
def test_groups_compose(group):
    compose([group])


def test_python_dash_m_runs_debug_fast_and_prints_progress(cli):
    p = cli("+experiment=ppo_cartpole", "debug=fast")
    assert p.returncode == 0, p.stderr
    assert "stopped: training_iteration = 3 >= 3" in p.stdout
