"""RLlib's classic functional policy API (issue 35, item 4): build_policy / build_trainer, RLlib's
tutorial Policies example run as written with torch (tests/plugins/classic_pg.py), from Python and
from YAML."""

from __future__ import annotations

import os

import mlflow
import numpy as np
import pytest
import torch

from rlrun import Postprocessing, SampleBatch, build_policy, build_trainer, compute_advantages
from rlrun.algos.classic import ModelView
from rlrun.config.typed import ConfigError
from rlrun.core.errors import PluginError
from tests.conftest import REPO, run_cli, run_summary

PLUGINS = REPO / "tests" / "plugins"
SB = SampleBatch


@pytest.fixture(scope="module", autouse=True)
def registries_as_before():
    """The algorithms and losses these tests build leave the registries (other tests list the built-ins)."""
    from rlrun.core import registry

    tables = [t for t in vars(registry).values() if isinstance(t, registry.Registry)]
    before = {id(t): set(t._entries) for t in tables}
    yield
    for t in tables:
        for name in set(t._entries) - before[id(t)]:
            del t._entries[name]


@pytest.fixture(scope="module")
def classic_pg(request):
    import sys

    sys.path.insert(0, str(PLUGINS))
    request.addfinalizer(lambda: (sys.path.remove(str(PLUGINS)), sys.modules.pop("classic_pg", None)))
    import classic_pg

    return classic_pg


def test_the_tutorial_policy_trains_from_python_as_written(classic_pg):
    trainer = classic_pg.MyTrainer(config={"env": "CartPole-v1", "framework": "torch", "num_gpus": 0})
    try:
        first, second = trainer.train(), trainer.train()
    finally:
        trainer.stop()
    assert (first["training_iteration"], second["training_iteration"]) == (1, 2)
    assert second["timesteps_total"] == 400  # RLlib's common default: 200 env steps per iteration
    assert np.isfinite(second["train/loss/total"]) and second["train/loss/total"] != first["train/loss/total"]
    assert "episode_reward_mean" in second


@pytest.mark.slow
def test_the_tutorial_policy_with_advantages_learns_cartpole_from_python(classic_pg):
    trainer = classic_pg.ClassicPGTrainer(config={"env": "CartPole-v1", "train_batch_size": 1000, "seed": 1})
    try:
        best = 0.0
        for _ in range(60):
            result = trainer.train()
            best = max(best, result.get("episode_reward_mean", 0.0))
            if best >= 150:
                break
    finally:
        trainer.stop()
    assert best >= 150, (best, result["timesteps_total"])
    assert "train/advantage_mean" in result  # stats_fn's numbers are logged as train/<name>


@pytest.mark.slow
def test_the_tutorial_policy_trains_from_yaml_and_records_in_mlflow(tmp_path):
    p = run_cli(["algo=pg", "algo.name=ClassicPGTrainer", "loss=custom", "loss.name=ClassicPGPolicy",
                 "plugins=[classic_pg]", "algo.lr=0.01", "algo.train_batch_size=1024", "stop.timesteps_total=40000",
                 "+stop.rollout.episode_return_mean=100"], tmp_path,
                env={"PYTHONPATH": os.pathsep.join([str(REPO), str(PLUGINS)])})
    assert p.returncode == 0, p.stderr[-2000:]
    assert run_summary(p.stdout)["stopped"].startswith("rollout/episode_return_mean"), p.stdout[-1500:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    assert run.info.status == "FINISHED" and run.data.params["algo.name"] == "ClassicPGTrainer"
    assert run.data.params["algo.advantage_scale"] == "1.0"  # the policy's default config is algo.<key>
    assert run.data.metrics["rollout/episode_return_mean"] >= 100


def test_trainer_config_keys_map_and_unknown_ones_are_named(classic_pg):
    with pytest.raises(ConfigError, match=r"config\.num_sgd_iters: not an RLlib key .*did you mean 'num_sgd_iter'"):
        classic_pg.ClassicPGTrainer(config={"env": "CartPole-v1", "num_sgd_iters": 2})
    trainer = classic_pg.ClassicPGTrainer(config={"env": "CartPole-v1", "lr": 0.02, "advantage_scale": 3.0,
                                                  "num_sgd_iter": 2, "framework": "tf2", "eager_tracing": True})
    try:
        policy = trainer.get_policy()
        view = classic_pg.ClassicPGPolicy.view(policy)
        assert view.config["lr"] == 0.02 and view.config["advantage_scale"] == 3.0 and view.config["num_sgd_iter"] == 2
        assert view.config["gamma"] == 0.99 and view.config["grad_clip"] is None
    finally:
        trainer.stop()


def test_postprocess_fn_gets_one_trajectory_piece_at_a_time_and_its_columns_come_back():
    seen = []

    def postprocess(policy, batch, other_agent_batches=None, episode=None):
        seen.append(batch[SB.T].tolist())
        batch["piece_len"] = np.full(len(batch), len(batch), dtype=np.int64)
        batch[SB.REWARDS] = batch[SB.REWARDS] * 2
        return batch

    cls = build_policy("PiecesPolicy", loss_fn=lambda *a: torch.zeros(()), postprocess_fn=postprocess)
    # [T=5, B=2]: env 0 ends an episode at t=1 (its row 2 is the dummy autoreset row), env 1 runs on
    t = np.array([[0, 0], [1, 1], [0, 2], [0, 3], [1, 4]])
    term = np.zeros((5, 2), bool)
    term[1, 0] = True
    valid = np.ones((5, 2), bool)
    valid[2, 0] = False
    frag = SB({SB.T: t, SB.REWARDS: np.ones((5, 2), np.float32), SB.TERMINATEDS: term,
               SB.TRUNCATEDS: np.zeros((5, 2), bool), "valid": valid})
    out = cls.postprocess(policy=_policy_stub(), fragment=frag, last_values=np.zeros(2, np.float32))
    assert seen == [[0, 1], [0, 1], [0, 1, 2, 3, 4]]
    assert out["piece_len"][:, 0].tolist() == [2, 2, 0, 2, 2] and out["piece_len"][:, 1].tolist() == [5] * 5
    assert out[SB.REWARDS][valid].tolist() == [2.0] * 9


def _policy_stub():
    class Stub:
        config = __import__("rlrun").AlgoConfig()

    return Stub()


def test_compute_advantages_follows_rllib():
    def batch():
        return SB({SB.REWARDS: np.array([1.0, 0.0, 2.0]), SB.VF_PREDS: np.array([0.5, 1.0, 1.5])})

    g = 0.9
    returns = np.array([1 + g * (0 + g * (2 + g * 4.0)), 0 + g * (2 + g * 4.0), 2 + g * 4.0])
    plain = compute_advantages(batch(), 4.0, g, use_gae=False, use_critic=False)
    np.testing.assert_allclose(plain[Postprocessing.ADVANTAGES], returns, rtol=1e-6)
    critic = compute_advantages(batch(), 4.0, g, use_gae=False)
    np.testing.assert_allclose(critic[SB.ADVANTAGES], returns - [0.5, 1.0, 1.5], rtol=1e-6)
    np.testing.assert_allclose(critic[SB.VALUE_TARGETS], returns, rtol=1e-6)
    gae = compute_advantages(batch(), 4.0, g, lambda_=1.0)  # lambda 1: Monte-Carlo minus values
    np.testing.assert_allclose(gae[SB.ADVANTAGES], returns - [0.5, 1.0, 1.5], rtol=1e-5)


def test_model_view_calls_like_rllibs_model_and_classic_mistakes_are_named():
    class Tiny(torch.nn.Module):
        def forward(self, obs):
            from rlrun import ModelOutput

            return ModelOutput(obs * 2, obs.sum(-1))

    view = ModelView(Tiny())
    with pytest.raises(RuntimeError, match="call the model first"):
        view.value_function()
    logits, state = view({SB.OBS: torch.ones(3, 2)})
    assert logits.shape == (3, 2) and state == [] and view.value_function().tolist() == [2.0] * 3
    assert list(view.parameters()) == []  # anything else is the model's own
    two = build_policy("TwoLosses", loss_fn=lambda p, m, d, b: [torch.zeros(()), torch.zeros(())])
    with pytest.raises(PluginError, match="returned 2 losses"):
        two.loss(_policy_stub(), Tiny(), object, {})
    with pytest.raises(PluginError, match="mixins not supported"):
        build_policy("Mixed", loss_fn=lambda *a: None, mixins=[object])
    with pytest.raises(TypeError, match="policy template"):
        two()
    with pytest.raises(ConfigError, match="default_policy must be a class from rlrun.build_policy"):
        build_trainer("Bad", default_policy=object)


def test_optimizer_fn_gives_the_policy_its_optimizer(classic_pg):
    cls = build_policy("SGDPolicy", loss_fn=classic_pg.advantage_loss, postprocess_fn=classic_pg.postprocess_advantages,
                       optimizer_fn=lambda policy, config: torch.optim.SGD(policy.model.parameters(), lr=config["lr"]))
    trainer = build_trainer("SGDTrainer", default_policy=cls)(config={"env": "CartPole-v1", "lr": 0.05})
    try:
        assert isinstance(trainer.get_policy().optimizer, torch.optim.SGD)
        assert trainer.get_policy().optimizer.param_groups[0]["lr"] == 0.05
        assert np.isfinite(trainer.train()["train/loss/total"])
    finally:
        trainer.stop()


def test_a_policy_config_key_that_is_a_python_keyword_reaches_policy_config():
    seen = []

    def loss(policy, model, dist_class, batch):
        seen.append(policy.config["lambda"])
        logits, _ = model(batch)
        return -(dist_class(logits).logp(batch[SB.ACTIONS]) * batch[SB.REWARDS]).mean()

    cls = build_policy("LambdaPolicy", loss_fn=loss, get_default_config=lambda: {"lambda": 1.0})
    trainer = build_trainer("LambdaTrainer", default_policy=cls)(config={"env": "CartPole-v1", "lambda": 0.9})
    try:
        trainer.train()
    finally:
        trainer.stop()
    assert seen and set(seen) == {0.9}


def test_rllibs_sac_trainer_iterates_for_at_least_rllibs_second(tmp_path, monkeypatch):
    """SACTrainer takes RLlib's SAC defaults, min_time_s_per_iteration 1 among them: a step of Tune lasts a
    second, however few env steps that is; the key set to 0 gives back 100-step iterations."""
    from rlrun import SACTrainer

    monkeypatch.chdir(tmp_path)  # its MLflow store: ./mlflow.db, as for a user's script
    base = {"env": "Pendulum-v1", "num_steps_sampled_before_learning_starts": 100_000,
            "q_model_config": {"fcnet_hiddens": [16]}, "policy_model_config": {"fcnet_hiddens": [16]}}
    timed, quick = SACTrainer(config=base), SACTrainer(config={**base, "min_time_s_per_iteration": 0})
    try:
        r, q = timed.train(), quick.train()
    finally:
        timed.stop()
        quick.stop()
    assert r["time/iteration_s"] >= 1.0 and r["timesteps_total"] > 100
    assert q["timesteps_total"] == 100
