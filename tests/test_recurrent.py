"""Recurrent models (model=lstm): sequence cutting and masking pinned on a scripted env, state
carried and reset by the worker, learning on sequences equal to learning on each sequence alone,
bad configs refused before compute, the MLflow model taking and returning state, and the preset.
(LSTM PPO on Ray workers: tests/test_filters.py, with the filter sync.)"""

import os
import re
import subprocess
import sys

import mlflow
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import make_policy
from rlrun.algos.ppo import PPOConfig
from rlrun.config.schemas import EnvConfig, RolloutConfig
from rlrun.core.registry import ENVS
from rlrun.models.lstm import LSTMConfig
from rlrun.models.sequences import SEQ_MASK, SequenceView, sequence_minibatch, sequence_starts
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.sources.plugins import load_builtins
from rlrun.sources.rollout_worker import RolloutWorker, WorkerSpec
from rlrun.training.export import load_policy
from tests.conftest import REPO, run_summary
from tests.scripted_env import ScriptedVectorEnv

load_builtins()
ENVS.add("scripted", lambda num_envs, **kw: ScriptedVectorEnv(num_envs, **kw), override=True)


def test_sequences_are_cut_at_episode_starts_fragment_joins_and_max_seq_len():
    # rows: episode 7 (t 0-5), episode 8 (t 0-2), then episode 7 again from another fragment (t 6-8)
    eps = np.array([7] * 6 + [8] * 3 + [7] * 3)
    t = np.array([0, 1, 2, 3, 4, 5, 0, 1, 2, 6, 7, 8])
    starts, lens = sequence_starts(eps, t, max_seq_len=4)
    assert starts.tolist() == [0, 4, 6, 9] and lens.tolist() == [4, 2, 3, 3]
    starts, lens = sequence_starts(eps, t, max_seq_len=2)
    assert starts.tolist() == [0, 2, 4, 6, 8, 9, 11] and lens.tolist() == [2, 2, 2, 2, 1, 2, 1]


def make_worker(lengths, fragment, max_seq_len, n=2):
    env = EnvConfig(id="scripted", kwargs={"lengths": lengths, "truncate": [False] * n})
    rollout = RolloutConfig(num_envs_per_worker=n, rollout_fragment_length=fragment)
    model = LSTMConfig(hiddens=[8], cell_size=6, max_seq_len=max_seq_len)

    def factory(obs_space, act_space):
        return {DEFAULT_POLICY_ID: make_policy("ppo", obs_space, act_space, algo_config=PPOConfig(),
                                               model_config=model, seed=3)}

    return RolloutWorker(WorkerSpec(env=env, rollout=rollout, seed=0), factory)


def test_worker_records_the_state_each_step_acted_from_and_resets_it_at_episode_starts():
    # sub-env 0: episodes of 3 steps (end inside a 4-long sequence); sub-env 1: 7 steps (the 5-step
    # fragment ends inside the episode, which continues in the next fragment)
    w = make_worker([3, 7], fragment=5, max_seq_len=4)
    p = w.policy
    batches = [w.sample(), w.sample()]
    for b in batches:
        first = b["t"] == 0
        for k in ("state_in_0", "state_in_1", "state_in_2", "state_in_3"):
            assert np.all(b[k][first] == 0.0)  # every episode starts from the initial state
            assert np.abs(b[k][~first]).max() > 0  # later steps carry a state
        # replaying every sequence from its recorded start state reproduces what was computed when acting
        starts, lens = sequence_starts(b["eps_id"], b["t"], 4)
        tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in b.items()}
        mb = sequence_minibatch(tb, starts, lens, np.arange(len(starts)))
        with torch.no_grad():
            out = SequenceView(p.model, mb)(mb["obs"])
        torch.testing.assert_close(out.values, mb["vf_preds"])
        torch.testing.assert_close(out.dist_inputs, mb["action_dist_inputs"])
    b2 = batches[1]  # the 7-step episode of sub-env 1 continues across the fragment join with its state
    first_row = np.flatnonzero(b2["obs"][:, 0] == 1)[0]
    assert b2["t"][first_row] > 0 and np.abs(b2["state_in_0"][first_row]).max() > 0
    w.stop()


def test_padding_never_reaches_the_loss_learning_equals_each_sequence_alone():
    w = make_worker([3, 7], fragment=5, max_seq_len=4)
    b = w.sample()
    p = w.policy
    starts, lens = sequence_starts(b["eps_id"], b["t"], 4)
    assert len(set(lens.tolist())) > 1  # sequences of different lengths: the minibatch is padded
    tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in b.items()}
    mb = sequence_minibatch(tb, starts, lens, np.arange(len(starts)))
    assert int(mb[SEQ_MASK].sum()) == len(b) < mb[SEQ_MASK].numel()
    out = SequenceView(p.model, mb)(mb["obs"])
    assert out.values.shape == (len(b),)  # real rows only
    padded_loss = (out.values ** 2).sum() + out.dist_inputs.sum()
    grads = torch.autograd.grad(padded_loss, list(p.model.parameters()), allow_unused=True)
    alone = 0.0  # the same loss, each sequence run on its own without any padding
    for s, n in zip(starts, lens, strict=True):
        state = [tb[f"state_in_{k}"][s:s + 1] for k in range(4)]
        o, _ = p.model.forward_seq(tb["obs"][s:s + n].unsqueeze(0), state)
        alone = alone + (o.values ** 2).sum() + o.dist_inputs.sum()
    ref = torch.autograd.grad(alone, list(p.model.parameters()), allow_unused=True)
    torch.testing.assert_close(padded_loss, alone)
    for g, r in zip(grads, ref, strict=True):
        if r is not None:
            torch.testing.assert_close(g, r)
    stats = p.learn_on_batch(b)
    assert np.isfinite(stats["train/loss/total"])
    w.stop()


@pytest.mark.parametrize("args, message", [
    (["model=lstm", "model.max_seq_len=0"], "model.max_seq_len: must be at least 1, got 0"),
    (["model=lstm", "algo=dqn"], "model.name: 'lstm' is a recurrent model, and algo 'dqn' cannot carry its state"),
    (["model=lstm", "algo=appo"], "and algo 'appo' cannot carry its state through its data path; recurrent models "
                                  "train with a2c, pg, ppo"),
])
def test_recurrent_configs_that_cannot_work_are_refused_before_compute(refuse, tmp_path, args, message):
    p = refuse(*args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_a2c_and_pg_train_an_lstm_and_the_mlflow_model_takes_and_returns_state(tmp_path, cli):
    p = cli("algo=a2c", "model=lstm", "stop.training_iteration=3", "env.wrappers=[{name: mask_observation, "
            "keep: [0, 2]}]", "rollout.observation_filter=mean_std")
    assert p.returncode == 0, p.stderr[-3000:]
    s = run_summary(p.stdout)
    loaded = load_policy(s["checkpoint"], tmp_path)
    pol = loaded.policy
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(f"runs:/{s['run_id']}/model", dst_path=str(tmp_path / "model"))
    rng = np.random.default_rng(0)
    state = pol.initial_state(3)
    x_state = np.concatenate(state, axis=1)
    for _ in range(4):  # a few steps of 3 episodes, feeding the state back
        raw = rng.normal(0, [1.0, 0.1], (3, 2)).astype(np.float32)
        out = np.asarray(model.predict(np.concatenate([raw, x_state], axis=1).astype(np.float32)))
        ref = pol.compute_actions(pol.filter_obs(raw), explore=False, state=state)
        np.testing.assert_array_equal(out[:, 0], ref.actions)
        np.testing.assert_allclose(out[:, 1:], np.concatenate(ref.state_out, axis=1), rtol=1e-5, atol=1e-6)
        state, x_state = ref.state_out, out[:, 1:]
    p = cli("algo=pg", "model=lstm", "stop.training_iteration=2", "tracking=none")
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.slow
def test_ppo_lstm_stateless_cartpole_reaches_475_within_200k_steps_and_evaluates(cli, tmp_path):
    p = cli("+experiment=ppo_lstm_stateless_cartpole", "seed=0")
    assert p.returncode == 0, p.stderr[-3000:]
    s = run_summary(p.stdout)
    assert s["stopped"].startswith("rollout/episode_return_mean") and int(s["steps"]) <= 200_000, s
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "rlrun.app.eval_cli", "checkpoint=latest", "episodes=10",
                        "log=false"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"greedy return over 10 episodes: mean ([\d.]+)", p.stdout)
    assert m and float(m[1]) >= 400, p.stdout
