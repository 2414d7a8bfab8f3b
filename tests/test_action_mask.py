"""Action masking: envs whose observations carry an ``action_mask`` (rlrun/envs/action_mask.py,
rlrun/models/action_mask.py). The plugin envs (tests/plugins/masked_envs.py) raise on an illegal action,
so every run here that finishes took legal actions only."""

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import make_policy
from rlrun.app.compose import compose
from rlrun.app.runner import run
from rlrun.core.errors import PluginError
from rlrun.data.parquet import read_meta
from rlrun.data.spaces import MaskedBox, same_space, space_from_json, space_to_json
from rlrun.envs.action_mask import masked_space, pack
from rlrun.envs.make import make_vector_env
from rlrun.models.action_mask import FLOAT_MIN, MaskedModel
from rlrun.models.distributions import Categorical
from rlrun.policy.policy_map import AlwaysSamePolicy, RandomPolicy

from .conftest import REPO, isolated, plugin_module, run_summary

PLUGINS = Path(__file__).parent / "plugins"
N = 6


def _space(n=N, obs=None, **extra):
    return gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (n,), np.int8),
                            "observation": obs or gym.spaces.Box(0.0, 1.0, (3, 2), np.float32), **extra})


@pytest.fixture
def masked_envs(monkeypatch, tmp_path):
    """The plugin's envs registered for this test only (and importable in its Ray workers)."""
    return plugin_module(monkeypatch, tmp_path, "masked_envs")


def _random_masks(rng, rows, n=N):
    legal = rng.random((rows, n)) < 0.5
    legal[np.arange(rows), rng.integers(n, size=rows)] = True
    return legal


def test_a_masked_observation_is_one_vector_mask_first_and_round_trips():
    space = masked_space(_space(), gym.spaces.Discrete(N))
    assert isinstance(space, MaskedBox) and space.shape == (N + 6,) and space.dtype == np.float32
    assert space.mask_size == N and space.key == "observation" and space.inner.shape == (3, 2)
    obs = {"action_mask": np.array([0, 1, 0, 0, 1, 1], np.int8), "observation": np.arange(6.0).reshape(3, 2)}
    one = pack(space, _space()["observation"], obs, batch=False)
    assert one.tolist() == [0, 1, 0, 0, 1, 1, 0, 1, 2, 3, 4, 5] and one.dtype == np.float32
    two = pack(space, _space()["observation"], {k: np.stack([v, v]) for k, v in obs.items()}, batch=True)
    assert two.shape == (2, 12) and (two == one).all()
    assert space_from_json(json.loads(json.dumps(space_to_json(space)))) == space
    assert pickle.loads(pickle.dumps(space)) == space  # Ray actors get it pickled
    assert not same_space(space, gym.spaces.Box(0, 1, (12,), np.float32))  # a dataset recorded without the mask
    discrete = masked_space(_space(obs=gym.spaces.Discrete(4, start=1)), gym.spaces.Discrete(N))
    assert discrete.shape == (N + 4,)  # one-hot, as multi-agent runs encode Discrete observations
    assert pack(discrete, gym.spaces.Discrete(4, start=1),
                {"action_mask": np.ones(N, np.int8), "observation": 3}, batch=False)[N:].tolist() == [0, 0, 1, 0]
    assert masked_space(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Discrete(2)) is None


@pytest.mark.parametrize("space, action_space, message", [
    (_space(), gym.spaces.Box(-1, 1, (2,)), "takes a Discrete action space; the env's is Box(-1.0, 1.0, (2,)"),
    (_space(n=4), gym.spaces.Discrete(N),
     "'action_mask' must be 6 zeros and ones (one per action); it is Box(0, 1, (4,)"),
    (_space(score=gym.spaces.Discrete(3)), gym.spaces.Discrete(N),
     "takes one observation beside 'action_mask'; the Dict has ['observation', 'score']"),
    (_space(obs=gym.spaces.Tuple([gym.spaces.Discrete(2)])), gym.spaces.Discrete(N),
     "'observation' must be a Box or Discrete observation; it is Tuple(Discrete(2))"),
])
def test_a_mask_that_cannot_be_packed_gets_one_line(space, action_space, message):
    with pytest.raises(PluginError) as e:
        masked_space(space, action_space)
    assert str(e.value).startswith("env.id: an observation with an action mask ") and message in str(e.value)


def test_the_masked_policy_never_samples_an_illegal_action_and_its_math_stays_finite():
    space = masked_space(_space(), gym.spaces.Discrete(N))
    policy = make_policy("ppo", space, gym.spaces.Discrete(N), seed=3)
    assert isinstance(policy.model, MaskedModel)
    rng = np.random.default_rng(0)
    legal = _random_masks(rng, 4000)
    obs = np.concatenate([legal, rng.normal(size=(4000, 6))], 1).astype(np.float32)
    sampled = policy.compute_actions(obs, explore=True)
    assert legal[np.arange(4000), sampled.actions].all()
    assert np.isfinite(sampled.logp).all() and (sampled.logp <= 0).all()
    greedy = policy.compute_actions(obs, explore=False).actions
    inner = policy.model.inner(torch.as_tensor(obs[:, N:].reshape(-1, 3, 2))).dist_inputs.detach().numpy()
    assert (greedy == np.where(legal, inner, -np.inf).argmax(1)).all()  # the best legal action
    # every legal action gets sampled: the mask removes the illegal ones and nothing else
    seen = np.zeros((N,), bool)
    only_two = np.zeros((1, N), bool)
    only_two[0, [1, 4]] = True
    x = np.repeat(np.concatenate([only_two, np.zeros((1, 6), bool)], 1).astype(np.float32), 400, 0)
    seen[np.unique(policy.compute_actions(x, explore=True).actions)] = True
    assert seen.tolist() == [False, True, False, False, True, False]
    # log-probabilities, entropy, KL and their gradients: finite where actions are illegal
    out = policy.model(torch.as_tensor(obs[:256]))
    assert (out.dist_inputs.detach().numpy()[~legal[:256]] == FLOAT_MIN).all()
    dist = Categorical(out.dist_inputs)
    loss = -dist.logp(torch.as_tensor(sampled.actions[:256])).mean() - dist.entropy().mean() + dist.kl(
        Categorical(out.dist_inputs.detach() * 0.5)).mean()
    loss.backward()
    inner = policy.model.inner
    grads = [p.grad for p in [*inner.pi_head.parameters(), *inner.torso.parameters()]]
    assert torch.isfinite(loss) and all(g is not None and torch.isfinite(g).all() for g in grads)
    most = torch.log(torch.tensor(legal[:256].sum(1), dtype=torch.float32))  # uniform over the legal actions
    assert torch.isfinite(dist.entropy()).all() and (dist.entropy() <= most + 1e-5).all()


def test_heuristic_policies_act_legally_under_a_mask():
    space = masked_space(_space(), gym.spaces.Discrete(N))
    rng = np.random.default_rng(1)
    legal = _random_masks(rng, 2000)
    obs = np.concatenate([legal, np.zeros((2000, 6))], 1).astype(np.float32)
    rand = RandomPolicy("r", space, gym.spaces.Discrete(N)).act(obs)
    assert legal[np.arange(2000), rand].all() and len(np.unique(rand)) == N
    same = AlwaysSamePolicy("s", space, gym.spaces.Discrete(N), action=2).act(obs)
    assert legal[np.arange(2000), same].all()
    assert (same[legal[:, 2]] == 2).all() and (same[~legal[:, 2]] == legal[~legal[:, 2]].argmax(1)).all()


def test_a_vector_env_of_an_action_masked_env_is_packed(masked_envs):
    env = make_vector_env("masked_pick", 3)
    try:
        assert isinstance(env.single_observation_space, MaskedBox)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (3, 2 * N) and (obs[:, :N] == obs[:, N:]).all()  # the plugin's observation is its mask
        with pytest.raises(masked_envs.IllegalAction):  # and an illegal action is refused by the env itself
            env.step(np.array([int(np.flatnonzero(obs[i, :N] == 0)[0]) if (obs[i, :N] == 0).any() else 0
                               for i in range(3)]))
    finally:
        env.close()


def _cfg(tmp_path, *overrides):
    return compose(["env.id=masked_pick", "plugins=[masked_envs]", "tracking=none", "progress=false",
                    f"output_dir={tmp_path / 'run'}", *overrides])


def test_ppo_learns_to_pick_the_best_legal_action(tmp_path, masked_envs):
    """Picking uniformly among the legal actions earns ~4 of 10 (the first iterations); the rule, 10."""
    out = run(_cfg(tmp_path, "+experiment=ppo_cartpole", "stop.timesteps_total=30000", "evaluation.interval=10",
                   "evaluation.num_episodes=10"), launch_dir=tmp_path)
    first = out.history[0]["rollout/episode_return_mean"]
    assert first < 6, first
    assert out.metrics["rollout/episode_return_mean"] >= 9.5, out.metrics["rollout/episode_return_mean"]
    assert out.metrics["eval/episode_return_mean"] >= 9.5


@pytest.mark.parametrize("experiment, extra", [
    ("pg_cartpole", []), ("a2c_cartpole", []), pytest.param("appo_cartpole", [], marks=pytest.mark.ray),
    ("ppo_lstm_stateless_cartpole", ["env.wrappers=[]", "rollout.observation_filter=none"]),
])
def test_every_algorithm_that_acts_by_its_distribution_acts_legally(tmp_path, masked_envs, experiment, extra):
    out = run(_cfg(tmp_path, f"+experiment={experiment}", "stop.training_iteration=3", "evaluation.interval=3",
                   "evaluation.num_episodes=3", *extra), launch_dir=tmp_path)
    assert out.metrics["training_iteration"] == 3 and out.metrics["episodes_total"] > 0
    assert out.metrics["eval/episode_return_mean"] >= 0  # greedy evaluation took legal actions too


@pytest.mark.parametrize("heuristic", ["random", "always_same"])
def test_multi_agent_masked_policies_learn_beside_heuristics(tmp_path, masked_envs, heuristic):
    out = run(_cfg(tmp_path, "+experiment=ppo_rps", "env.id=masked_pair", "~env.kwargs", "stop.timesteps_total=20000",
                   "multiagent.policy_mapping.learned=[a]", "multiagent.policy_mapping.always_same=[b]",
                   f"multiagent.policies.always_same.heuristic={heuristic}"), launch_dir=tmp_path)
    assert out.metrics["rollout/learned/episode_return_mean"] >= 9.0, out.metrics


@pytest.mark.slow
def test_dqn_learns_the_rule_on_legal_q_values(tmp_path, masked_envs):
    """The greedy action and the target's max are over legal Q-values (the model masks them)."""
    out = run(_cfg(tmp_path, "+experiment=dqn_cartpole", "stop.timesteps_total=10000", "evaluation.interval=0"),
              launch_dir=tmp_path)
    first = out.history[0]["rollout/episode_return_mean"]
    assert first < 6 and out.metrics["rollout/episode_return_mean"] >= 9.0, (first, out.metrics)


def test_dqn_explores_and_acts_on_legal_actions_only():
    """Epsilon-greedy draws among the legal actions (at the start epsilon is 1: every action random)."""
    policy = make_policy("dqn", masked_space(_space(), gym.spaces.Discrete(N)), gym.spaces.Discrete(N))
    legal = _random_masks(np.random.default_rng(4), 3000)
    obs = np.concatenate([legal, np.zeros((3000, 6))], 1).astype(np.float32)
    for explore in (True, False):
        assert legal[np.arange(3000), policy.compute_actions(obs, explore).actions].all()


@pytest.mark.parametrize("overrides, message", [
    (["+experiment=sac_cartpole"], "algo.name: algo 'sac' does not act on an action mask yet, and the env's "
                                   "observations carry one; these do: a2c, appo, bc, dqn, marwil, pg, ppo"),
    (["+experiment=rainbow_cartpole"], "model.num_atoms: 51 (C51's atoms) do not take the env's action mask yet; "
                                       "set model.num_atoms=1"),
    (["+experiment=td3_pendulum"], "algo.name: algo 'td3' does not act on an action mask yet"),
    (["+experiment=ppo_cartpole", "rollout.observation_filter=mean_std"],
     "rollout.observation_filter: 'mean_std' would rescale the env's action mask; set rollout.observation_filter=none"),
])
def test_what_cannot_act_on_a_mask_is_refused_before_compute(tmp_path, masked_envs, overrides, message):
    with pytest.raises(PluginError) as e:
        run(_cfg(tmp_path, *overrides), launch_dir=tmp_path)
    assert message in str(e.value)
    assert not (tmp_path / "run").exists()


def _rlrun(tmp_path, *args, tool="rlrun"):
    module = {"rlrun": "rlrun", "rlrun-eval": "rlrun.app.eval_cli"}[tool]
    env = {**os.environ, "PYTHONPATH": str(REPO), "MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_cli_trains_evaluates_and_records_a_masked_env(tmp_path):
    """From the command line: a run, a refused algorithm (exit 2, one line), rlrun-eval's greedy
    episodes recorded as a dataset whose spaces keep the mask, and BC learning from it."""
    shutil.copy(PLUGINS / "masked_envs.py", tmp_path)
    common = ["env.id=masked_pick", "plugins=[masked_envs]", "tracking=none"]
    p = _rlrun(tmp_path, "+experiment=ppo_cartpole", *common, "stop.timesteps_total=25000", "output_dir=run")
    assert p.returncode == 0, p.stderr[-3000:]
    assert float(run_summary(p.stdout)["final"]) >= 9.0
    bad = _rlrun(tmp_path, "+experiment=sac_cartpole", *common)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "algo.name: algo 'sac' does not act on an action mask yet" in bad.stderr
    ev = _rlrun(tmp_path, "checkpoint=run", "episodes=5", "output=data", "render=true", "out=eval", tool="rlrun-eval")
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "mean 10.00" in ev.stdout, ev.stdout
    assert list((tmp_path / "eval").glob("*.gif")), list((tmp_path / "eval").iterdir())  # rendered episodes packed too
    meta = read_meta(next((tmp_path / "data").glob("*.parquet")))
    assert meta["observation_space"]["type"] == "MaskedBox" and meta["observation_space"]["mask_size"] == N
    bc = _rlrun(tmp_path, "+experiment=bc_cartpole", *common, "input=data", "stop.training_iteration=2",
                "output_dir=bc")
    assert bc.returncode == 0, bc.stderr[-3000:]
    no_env = _rlrun(tmp_path, "+experiment=bc_cartpole", *SPACES, "tracking=none", "input=data",  # spaces declared
                    "stop.training_iteration=2", "output_dir=bc_no_env", "evaluation.interval=0")
    assert no_env.returncode == 0, no_env.stderr[-3000:]
    mi = _rlrun(tmp_path, "checkpoint=run", "episodes=3", "output=minari:masked/pick-v0", tool="rlrun-eval")
    assert mi.returncode == 0, mi.stderr[-3000:]  # Minari stores the packed vector as a plain Box
    bc = _rlrun(tmp_path, "+experiment=bc_cartpole", *common, "input=minari:masked/pick-v0",
                "stop.training_iteration=2", "output_dir=bc_minari")
    assert bc.returncode == 0, bc.stderr[-3000:]


SPACES = ("env.id=null", f"env.observation_space={{type: MaskedBox, mask_size: {N}, inner: {{type: Box, shape: [{N}], "
          "low: 0, high: 1}}", f"env.action_space={{type: Discrete, n: {N}}}")


def test_a_declared_masked_space_is_the_recorded_one():
    from rlrun.data.spaces import space_from_config

    declared = space_from_config({"type": "MaskedBox", "mask_size": N, "inner": {"type": "Box", "shape": [N],
                                                                              "low": 0, "high": 1}}, "k")
    assert declared == masked_space(gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(N),
                                                     "observation": gym.spaces.Box(0.0, 1.0, (N,), np.float32)}),
                                    gym.spaces.Discrete(N))
    with pytest.raises(ValueError, match=r"k: .* is not a valid MaskedBox space \(mask_size: a positive integer"):
        space_from_config({"type": "MaskedBox", "mask_size": 0, "inner": {"type": "Box", "shape": [2]}}, "k")
    with pytest.raises(ValueError, match="k.inner: expected"):
        space_from_config({"type": "MaskedBox", "mask_size": 2}, "k")
    sample = declared.sample()  # an example observation's mask is zeros and ones, one legal action at least
    assert set(sample[:N].tolist()) <= {0.0, 1.0} and sample[:N].sum() >= 1


def test_make_trainer_refuses_what_a_run_refuses(tmp_path, masked_envs):
    from rlrun.app.runner import make_trainer

    for extra, message in ((["+experiment=sac_cartpole"], "algo 'sac' does not act on an action mask yet"),
                           (["+experiment=ppo_cartpole", "rollout.observation_filter=mean_std"],
                            "'mean_std' would rescale the env's action mask")):
        with pytest.raises(PluginError, match=message):
            make_trainer(["env.id=masked_pick", "plugins=[masked_envs]", "tracking=none", *extra], launch_dir=tmp_path)


def test_a_policy_client_sends_dict_observations_to_a_masked_server(tmp_path):
    """A served run with declared masked spaces; the client plays the plugin's env itself and passes its
    Dict observations as they are (the client packs them); the env raises on an illegal action."""
    from rlrun.app.client import PolicyClient, RunFinished

    from .test_serving import ServerRun

    sys.path.insert(0, str(PLUGINS))
    try:
        from masked_envs import MaskedPick
    finally:
        sys.path.remove(str(PLUGINS))
    server = ServerRun(tmp_path, "+experiment=ppo_cartpole", *SPACES, "stop.timesteps_total=2048",
                       "tracking.log_model=false", "evaluation.interval=0")
    client = PolicyClient(server.address, token_file=tmp_path / "server.token")
    env, steps = MaskedPick(), 0
    try:
        while steps < 20_000:
            obs, _ = env.reset(seed=steps)
            eid = client.start_episode()
            done = False
            while not done:
                obs, reward, _, done, _ = env.step(client.get_action(eid, obs))
                client.log_returns(eid, reward)
                steps += 1
            client.end_episode(eid, obs, truncated=True)
    except RunFinished:
        pass
    finally:
        client.close()
    server.wait()
    assert 2048 <= steps < 20_000
    with pytest.raises(ValueError, match="takes one other entry"):
        client.get_action("x", {"action_mask": [1, 0], "a": [0.0], "b": [1.0]})


@pytest.mark.ray
def test_ray_workers_act_on_the_mask(tmp_path):
    shutil.copy(PLUGINS / "masked_envs.py", tmp_path)
    args = [sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole", "env.id=masked_pick", "plugins=[masked_envs]",
            "tracking=none", "rollout=ray", "rollout.num_workers=2", "stop.timesteps_total=20000"]
    p = subprocess.run(isolated(args), cwd=tmp_path, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    assert float(run_summary(p.stdout)["final"]) >= 9.0


@pytest.mark.parametrize("model", ["cnn", "lstm"])
def test_image_and_recurrent_models_take_the_mask_too(model):
    from rlrun.models.cnn import CNNConfig
    from rlrun.models.lstm import LSTMConfig

    image = gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)
    space = masked_space(_space(obs=image), gym.spaces.Discrete(N))
    cfg = CNNConfig() if model == "cnn" else LSTMConfig()
    policy = make_policy("ppo", space, gym.spaces.Discrete(N), model_config=cfg, seed=0)
    assert type(policy.model.inner).__name__ == ("CNNModel" if model == "cnn" else "LSTMModel")
    rng = np.random.default_rng(2)
    legal = _random_masks(rng, 64)
    frames = rng.integers(0, 256, (64, 7 * 7 * 3))
    obs = np.concatenate([legal, frames], 1).astype(np.float32)
    x = policy.model.split(torch.as_tensor(obs))[1]
    assert x.dtype == torch.uint8 and (x.numpy().reshape(64, -1) == frames).all()  # the CNN scales uint8 itself
    state = policy.initial_state(64) if model == "lstm" else None
    for explore in (True, False):
        out = policy.compute_actions(obs, explore, state) if state else policy.compute_actions(obs, explore)
        assert legal[np.arange(64), out.actions].all()
    if model == "lstm":  # the learner's sequence pass masks as acting does
        seq, _ = policy.model.forward_seq(torch.as_tensor(obs).reshape(8, 8, -1), policy.model.initial_state(8))
        assert seq.dist_inputs.shape == (8, 8, N)
        assert (seq.dist_inputs.detach().numpy().reshape(64, N)[~legal] == FLOAT_MIN).all()


def test_dqn_targets_stay_finite_where_no_action_is_legal():
    """A cut (truncated or n-step) episode whose next observation allows nothing bootstraps from 0,
    not from the lowest float."""
    from rlrun.algos.dqn import dqn_td_loss
    from rlrun.data.batch import SampleBatch as SB

    policy = make_policy("dqn", masked_space(_space(), gym.spaces.Discrete(N)), gym.spaces.Discrete(N))
    legal = _random_masks(np.random.default_rng(5), 8)
    obs = torch.as_tensor(np.concatenate([legal, np.zeros((8, 6))], 1), dtype=torch.float32)
    batch = {SB.OBS: obs, SB.ACTIONS: torch.as_tensor(legal.argmax(1)), SB.NSTEP_NEXT_OBS: torch.zeros_like(obs),
             SB.NSTEP_REWARDS: torch.ones(8), SB.NSTEP_DISCOUNT: torch.full((8,), 0.99)}
    out = dqn_td_loss(policy, policy.model, policy.dist_class, batch)
    assert torch.isfinite(out.total) and out.stats["target_mean"] == pytest.approx(1.0)


def test_client_packing_seeding_and_declared_spaces_are_strict():
    from rlrun.config.typed import ConfigError
    from rlrun.data.spaces import space_from_config
    from rlrun.envs.action_mask import packed_rows

    rows = {"action_mask": np.eye(3, N, dtype=np.int8), "observation": np.ones((3, 2, 2))}
    assert packed_rows(rows).shape == (3, N + 4) and (packed_rows(rows)[:, :N] == np.eye(3, N)).all()
    array = np.zeros((3, N + 4), np.float32)
    assert packed_rows(array) is array  # an array of packed rows passes as it is
    a, b = (masked_space(_space(), gym.spaces.Discrete(N)) for _ in range(2))
    a.seed(7)
    b.seed(7)
    assert (a.sample() == b.sample()).all()  # the inner observation follows the seed too
    with pytest.raises(gym.error.Error):
        a.sample(mask=np.ones(N + 6, np.int8))
    inner = {"type": "Box", "shape": [2]}
    for bad in ({"mask_size": True, "inner": inner}, {"mask_size": 2, "inner": {"type": "Discrete", "n": 2}},
                {"mask_size": 2, "inner": {"type": "MaskedBox", "mask_size": 1, "inner": inner}},
                {"mask_size": 2, "inner": inner, "key": None}):
        with pytest.raises(ValueError, match="is not a valid MaskedBox space"):
            space_from_config({"type": "MaskedBox", **bad}, "k")
    with pytest.raises(ConfigError, match=r"env.observation_space: a MaskedBox of 6 mask entries needs "
                                          r"env.action_space: \{type: Discrete, n: 6\}; got Discrete\(3\)"):
        compose(["+experiment=bc_cartpole", *SPACES[:2], "env.action_space={type: Discrete, n: 3}", "input=data",
                 "evaluation.interval=0", "tracking=none"])
