"""Custom code from YAML: a module outside the package registers a loss, a model and an env."""

import textwrap

import pytest

from rlrun.app.cli import compose
from rlrun.app.runner import run
from rlrun.core.registry import LOSSES, Registry, RegistryError

PLUGIN = textwrap.dedent('''
    import gymnasium as gym
    import torch
    from torch import nn

    from rlrun import ENVS, LOSSES, MODELS, LossOutput, SampleBatch as SB
    from rlrun.models.base import ModelOutput

    @LOSSES.register("vanilla_pg", requires=(SB.OBS, SB.ACTIONS, SB.REWARDS), terms=("vanilla",))
    def vanilla_pg(policy, model, dist_class, batch):
        """The classic policy-gradient loss: -mean(logp(actions) * rewards)."""
        out = model(batch[SB.OBS])
        logp = dist_class(out.dist_inputs).logp(batch[SB.ACTIONS])
        loss = -(logp * batch[SB.REWARDS]).mean()
        return LossOutput(loss, {"vanilla": loss})

    @MODELS.register("linear_policy")
    class LinearPolicy(nn.Module):
        def __init__(self, obs_space, action_space, num_outputs, config):
            super().__init__()
            self.pi = nn.Linear(obs_space.shape[0], num_outputs)
            self.vf = nn.Linear(obs_space.shape[0], 1)

        def forward(self, obs):
            return ModelOutput(self.pi(obs), self.vf(obs).squeeze(-1))

    @ENVS.register("ShortCartPole", vector=False)
    def short_cartpole(max_episode_steps=50):
        return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)
''')


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_plugin_loss_model_and_env_selected_by_name(plugin_dir):
    cfg = compose(["algo=pg", "loss=custom", "loss.name=vanilla_pg", "model=custom", "model.name=linear_policy",
                   "env.id=ShortCartPole", "+env.kwargs.max_episode_steps=20", "plugins=[my_plugin]",
                   "tracking=none", "progress=false", "stop.timesteps_total=1024"], launch_dir=str(plugin_dir))
    result = run(cfg, launch_dir=plugin_dir)
    assert "vanilla_pg" in LOSSES
    assert "train/loss/vanilla" in result.metrics  # our loss ran
    assert result.metrics["rollout/episode_len_mean"] <= 20  # our env (kwargs applied) ran
    assert result.metrics["timesteps_total"] >= 1024


def test_plugin_from_launch_dir_through_the_real_cli(plugin_dir, cli):
    (plugin_dir / "my_plugin.py").write_text(PLUGIN)
    p = cli("algo=pg", "loss=custom", "loss.name=vanilla_pg", "plugins=[my_plugin]", "tracking=none",
            "stop.training_iteration=2")
    assert p.returncode == 0, p.stderr
    assert "stopped: training_iteration = 2 >= 2" in p.stdout


def test_registry_unknown_and_duplicate_names():
    reg: Registry[int] = Registry("widget")
    reg.add("alpha", 1)
    msg = r"unknown widget 'alpa' \(did you mean 'alpha'\?\)\. Known widget names: alpha"
    with pytest.raises(RegistryError, match=msg):
        reg.get("alpa")
    with pytest.raises(RegistryError, match="already registered"):
        reg.add("alpha", 2)
    reg.add("alpha", 2, override=True)
    assert reg.get("alpha") == 2
