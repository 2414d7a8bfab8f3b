"""Offline data: Parquet output and input, BC/MARWIL, Minari, bad data (rlrun/offline/, rlrun/algos/marwil.py).

The acceptance path runs for real: train ppo_cartpole, record 100 episodes with rlrun-eval, load them
with pyarrow.dataset, and behaviour-clone them to a greedy return of 475.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch

from rlrun.algos.algorithm import make_policy
from rlrun.algos.marwil import MARWILConfig, MARWILLossConfig, MARWILState, marwil_loss
from rlrun.app.cli import compose
from rlrun.app.runner import run
from rlrun.config.schemas import EnvConfig, ModelConfig, RolloutConfig
from rlrun.config.typed import ConfigError
from rlrun.core.errors import DataError, PluginError
from rlrun.core.registry import ENVS, MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.parquet import DatasetWriter, batch_from_table, read_meta
from rlrun.data.reader import ParquetReader
from rlrun.models.distributions import Categorical
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.sources.offline_input import dataset_meta
from rlrun.sources.plugins import load_builtins
from rlrun.sources.rollout_worker import RolloutWorker, WorkerSpec
from rlrun.training.trainer import Trainer
from tests.conftest import eval_cli, run_cli, run_summary
from tests.scripted_env import ScriptedVectorEnv, ValueIsTenT

load_builtins()
ENVS.add("scripted", lambda num_envs, **kw: ScriptedVectorEnv(num_envs, **kw), override=True)
MODELS.add("value_is_ten_t", ValueIsTenT, override=True)


@pytest.mark.slow
def test_recorded_episodes_load_with_pyarrow_and_bc_reaches_475(recorded):
    table = ds.dataset(recorded / "data", format="parquet").to_table()
    assert table.num_rows >= 20_000
    for col in ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id", "t", "action_logp",
                "action_prob"):
        assert col in table.column_names
    eps = table.column("eps_id").to_numpy()
    assert len(np.unique(eps)) == 100  # whole episodes only
    prob = table.column("action_prob").to_numpy()
    np.testing.assert_allclose(prob, np.exp(table.column("action_logp").to_numpy()), rtol=1e-5)
    assert 0.5 < prob.mean() < 1.0  # sampled actions: probabilities of a confident, not a greedy, policy
    meta = read_meta(next((recorded / "data").glob("*.parquet")))
    assert meta["env_id"] == "CartPole-v1" and meta["observation_space"]["shape"] == [4] and meta["explore"]
    assert meta["columns"]["obs"] == {"shape": [4], "dtype": "float32"}
    p = run_cli(["+experiment=bc_cartpole", f"input={recorded / 'data'}", "tracking=none",
                 f"output_dir={recorded / 'bc'}"], recorded)
    assert p.returncode == 0, p.stderr
    s = run_summary(p.stdout)
    assert "eval/episode_return_mean" in s["stopped"] and "target met" in s["stopped"], s
    assert float(s["stopped"].split("= ")[1].split(" ")[0]) >= 475


@pytest.mark.slow
def test_marwil_preset_learns_from_the_recorded_episodes(recorded):
    """MARWIL (beta 1) learns from the expert episodes: its greedy return is far above a random
    policy's ~22. (It need not reach BC's 475 here: on data where every episode is a 500-step
    truncation, its advantage weights are noise, and on the fixture's data it settled at ~226 from
    300k rows on. MARWIL's own case, mixed data, is the experiments/offline study: it beats BC.)"""
    p = run_cli(["+experiment=marwil_cartpole", f"input={recorded / 'data'}", "tracking=none",
                 f"output_dir={recorded / 'marwil'}", "stop.timesteps_total=300000"], recorded)
    assert p.returncode == 0, p.stderr
    s = run_summary(p.stdout)
    greedy = float(s["return"].split("greedy eval ")[1])
    assert greedy >= 150 or "target met" in s["stopped"], s


def _scripted_worker(lengths=(3, 4), truncate=(False, True), algo="marwil", fragment=5):
    env = EnvConfig(id="scripted", kwargs={"lengths": list(lengths), "truncate": list(truncate)})
    rollout = RolloutConfig(num_envs_per_worker=2, rollout_fragment_length=fragment)
    policy = {}

    def factory(obs_space, act_space):
        algo_config = MARWILConfig(gamma=0.5) if algo == "marwil" else None
        policy[DEFAULT_POLICY_ID] = make_policy(algo, obs_space, act_space, algo_config=algo_config,
                                                model_config=ModelConfig(name="value_is_ten_t"))
        return policy

    worker = RolloutWorker(WorkerSpec(env=env, rollout=rollout, seed=0, record_next_obs=True), factory)
    return worker, policy[DEFAULT_POLICY_ID]


def _write(tmp_path, batches, worker, file_size_mb=64.0):
    from rlrun.config.schemas import RunConfig

    meta = dataset_meta(RunConfig(env=EnvConfig(id="scripted")), DEFAULT_POLICY_ID, worker.obs_space,
                        worker.action_space)
    writer = DatasetWriter(tmp_path / "data", meta, file_size_mb)
    for b in batches:
        writer.write(b)
    return writer


def test_files_hold_whole_episodes_in_order_and_roundtrip(tmp_path):
    worker, _ = _scripted_worker()
    batches = [worker.sample() for _ in range(6)]
    writer = _write(tmp_path, batches, worker, file_size_mb=200 / 2**20)  # ~200 bytes: a file every episode or two
    files = writer.close()
    assert len(files) >= 3
    rows = 0
    for f in files:
        b = batch_from_table(pq.read_table(f), read_meta(f)["columns"])
        rows += len(b)
        for ep in b.split_by_episode():
            np.testing.assert_array_equal(ep[SB.T], np.arange(len(ep)))  # from its first step, in time order
            np.testing.assert_array_equal(ep[SB.OBS][:, 1], ep[SB.T])
            np.testing.assert_array_equal(ep[SB.NEXT_OBS][:, 1], ep[SB.T] + 1)
            ended = ep[SB.TERMINATEDS][-1] or ep[SB.TRUNCATEDS][-1]
            # the episodes still running at close come last, as they are
            assert ended or f == files[-1]
        assert b[SB.OBS].dtype == np.float32 and b[SB.ACTIONS].dtype == np.int64
    assert rows == sum(len(b) for b in batches) == writer.rows_written
    assert not list((tmp_path / "data").glob(".*"))  # no half-written files


@pytest.mark.parametrize("chunk_rows", [2, 1000])
def test_the_reader_postprocesses_episodes_as_the_worker_would(tmp_path, chunk_rows):
    """MARWIL's returns from files: a terminated episode (length 3) sums its rewards 1, 2, 3 with
    gamma 0.5; a truncated one (length 4) bootstraps from V(final obs) = 10 * 4, also when a chunk
    boundary cuts the episode."""
    worker, policy = _scripted_worker()
    writer = _write(tmp_path, [worker.sample() for _ in range(4)], worker)
    files = writer.close(keep_running=False)
    reader = ParquetReader(files, policy, worker.obs_space, worker.action_space, shuffle_buffer=1,
                           chunk_rows=chunk_rows)
    b = reader.next_batch(writer.rows_written)
    assert reader.rows_read == writer.rows_written
    env_id, t, g = b[SB.OBS][:, 0], b[SB.OBS][:, 1], b[SB.VALUE_TARGETS]
    np.testing.assert_allclose(g[(env_id == 0) & (t == 0)], 1 + 0.5 * 2 + 0.25 * 3)
    np.testing.assert_allclose(g[(env_id == 0) & (t == 2)], 3.0)
    np.testing.assert_allclose(g[(env_id == 1) & (t == 3)], 4 + 0.5 * 40)
    np.testing.assert_allclose(g[(env_id == 1) & (t == 2)], 3 + 0.5 * (4 + 0.5 * 40))


def test_the_shuffle_buffer_draws_at_random_and_stays_bounded(tmp_path):
    worker, policy = _scripted_worker(lengths=(50, 50), truncate=(False, False), fragment=100)
    writer = _write(tmp_path, [worker.sample() for _ in range(10)], worker)
    files = writer.close()
    ordered = ParquetReader(files, policy, worker.obs_space, worker.action_space, shuffle_buffer=1, chunk_rows=64)
    first = ordered.next_batch(50)
    np.testing.assert_array_equal(first[SB.T], np.arange(50))  # file order: one whole episode
    shuffled = ParquetReader(files, policy, worker.obs_space, worker.action_space, shuffle_buffer=300,
                             chunk_rows=64, seed=1)
    seen = 0
    for _ in range(40):  # 2,000 rows drawn: more than one pass over the 2,000 written
        b = shuffled.next_batch(50)
        seen += len(b)
        assert len(shuffled._buf) <= 300 + 64 + 50  # the buffer, one chunk, one episode piece
    assert len(np.unique(b[SB.EPS_ID])) > 3  # rows of many episodes in one batch
    assert shuffled.passes >= 1 and seen == 2000


def test_marwil_loss_weights_advantages_and_bc_is_its_beta_zero_case():
    policy = make_policy("marwil", *_spaces(), algo_config=MARWILConfig(beta=2.0))
    policy.state_as(MARWILState).sqd_adv_norm = 4.0  # c = 2

    class Fixed(torch.nn.Module):
        def forward(self, obs):
            from rlrun.models.base import ModelOutput

            return ModelOutput(torch.zeros(len(obs), 2, requires_grad=True), torch.tensor([1.0, 3.0]))

    model = Fixed()
    batch = {SB.OBS: torch.zeros(2, 4), SB.ACTIONS: torch.tensor([0, 1]), SB.VALUE_TARGETS: torch.tensor([2.0, 1.0])}
    out = marwil_loss(policy, model, Categorical, batch)
    w = np.exp(2.0 * np.array([1.0, -2.0]) / 2.0)  # exp(beta * (R - V) / c)
    assert out.stats["weight_mean"].item() == pytest.approx(w.mean(), rel=1e-5)
    assert out.terms["policy"].item() == pytest.approx(-(w * np.log(0.5)).mean(), rel=1e-5)
    assert out.terms["vf"].item() == pytest.approx(0.5 * (1 + 4) / 2)
    policy.config = MARWILConfig(name="bc", beta=0.0)
    out = marwil_loss(policy, model, Categorical, batch)
    assert out.terms["policy"].item() == pytest.approx(-np.log(0.5)) and out.terms["vf"].item() == 0.0
    assert out.total.item() == pytest.approx(-np.log(0.5))
    assert MARWILLossConfig().vf_coeff == 1.0


def _spaces():
    import gymnasium as gym

    return gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)


def test_episode_writer_saves_external_episodes_that_read_back(tmp_path):
    import gymnasium as gym
    from rlrun.offline import EpisodeWriter

    obs_space, act_space = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3)
    with EpisodeWriter(tmp_path / "ext", obs_space, act_space, env_id="x") as w:
        for t in range(3):  # one finished episode
            w.add_step([t, 0], t % 3, 1.0, t == 2, False, [t + 1, 0], action_prob=0.25)
        w.add_step([9, 9], 1, 2.0, False, False, [8, 8], action_prob=0.5)  # unfinished at close
    f = sorted((tmp_path / "ext").glob("*.parquet"))
    assert w.episodes == 2 and len(f) == 1
    meta = read_meta(f[0])
    b = batch_from_table(pq.read_table(f[0]), meta["columns"], str(f[0]))
    np.testing.assert_array_equal(b[SB.EPS_ID], [0, 0, 0, 1])
    np.testing.assert_array_equal(b[SB.T], [0, 1, 2, 0])
    np.testing.assert_allclose(b[SB.ACTION_LOGP], np.log([0.25, 0.25, 0.25, 0.5]), rtol=1e-6)
    assert b[SB.TERMINATEDS].tolist() == [False, False, True, False] and b[SB.ACTIONS].dtype == np.int64
    assert meta["observation_space"]["shape"] == [2] and meta["action_space"] == {"type": "Discrete", "n": 3,
                                                                                   "start": 0}


@pytest.mark.slow
def test_a_mixed_input_takes_each_share_from_its_source(recorded, tmp_path):
    cfg = compose(["+experiment=bc_cartpole", f"input={{sampler: 0.25, {recorded / 'data'}: 0.75}}", "tracking=none",
                   "algo.train_batch_size=1024", f"output={tmp_path / 'sampled'}"])
    trainer = Trainer(cfg, tmp_path)
    try:
        batch, sampled = trainer.experience.next_batch(1024)
        got = sum(len(b) for b in sampled)
        assert 256 <= got < 256 + 8  # one sampling round of 8 envs x 32 steps (+ < 8 rows: episode ends)
        assert len(batch) == 1024
        trainer.train()
    finally:
        trainer.stop()
    written = ds.dataset(tmp_path / "sampled", format="parquet").to_table()
    # the sampled rows of both batches (next_batch above, then train()) are recorded, never the 2 x 768 read ones
    assert 2 * 256 <= written.num_rows < 2 * (256 + 8)


def test_a_mixed_input_keeps_its_shares_over_rounds_too_small_to_split(tmp_path):
    """One-row rounds (an off-policy run at one update per env step, as rlrun-rllib translates RLlib's SAC and
    DQN files): half of them sampled and half read, not every one sampled."""
    import gymnasium as gym
    from rlrun.offline import EpisodeWriter

    rng = np.random.default_rng(0)
    with EpisodeWriter(tmp_path / "data", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(2),
                       env_id="CartPole-v1") as w:
        for t in range(200):
            w.add_step(rng.normal(size=4), t % 2, 1.0, t % 20 == 19, False, rng.normal(size=4))
    cfg = compose(["+experiment=bc_cartpole", f"input={{sampler: 0.5, {tmp_path / 'data'}: 0.5}}", "tracking=none",
                   "algo.train_batch_size=1", "rollout.num_envs_per_worker=1", "rollout.rollout_fragment_length=1"])
    trainer = Trainer(cfg, tmp_path)
    try:
        rounds = [trainer.experience.next_batch(1) for _ in range(40)]
        sampled = [sum(len(b) for b in s) for _, s in rounds]
        assert all(len(batch) == 1 for batch, _ in rounds) and sampled == [0, 1] * 20
        batch, big = trainer.experience.next_batch(10)  # a round big enough to split: half and half
        assert len(batch) == 10 and sum(len(b) for b in big) == 5
    finally:
        trainer.stop()


@pytest.mark.slow
def test_a_multi_agent_run_writes_per_policy_data_that_reads_back(tmp_path):
    out = tmp_path / "ma"
    r = run(compose(["+experiment=ppo_multi_cartpole", "tracking=none", "progress=false", "stop.training_iteration=2",
                     "stop.timesteps_total=null", f"output={out}", f"output_dir={tmp_path / 'run'}"]), tmp_path)
    assert r.metrics["training_iteration"] == 2
    for pid in ("p0", "p1"):
        t = ds.dataset(out / pid, format="parquet").to_table()
        assert t.num_rows > 0 and read_meta(next((out / pid).glob("*.parquet")))["policy_id"] == pid
    cfg = compose(["+experiment=bc_cartpole", f"input={out / 'p1'}", "tracking=none", "progress=false",
                   "stop.training_iteration=2", "offline.shuffle_buffer=100", "algo.train_batch_size=256",
                   f"output_dir={tmp_path / 'bc'}"])
    r = run(cfg, tmp_path)
    assert r.metrics["offline/rows_read"] >= 512 and math.isfinite(r.metrics["train/loss/total"])


@pytest.mark.slow
def test_dqn_learns_cartpole_from_a_replay_of_ppo_and_random_episodes(recorded, tmp_path):
    """Everything ppo_cartpole sampled while it learned (75k rows, from a uniform policy to a good
    one) plus 300 episodes of a nearly uniform policy: DQN (the preset, 3-step targets) learns a
    greedy return of 400 offline."""
    p = run_cli(["+experiment=dqn_cartpole", f"input={recorded / 'replay'}", "tracking=none", "evaluation.interval=20",
                 "evaluation.num_episodes=10", "stop.timesteps_total=100000",
                 "++stop={rollout/episode_return_mean: null, eval/episode_return_mean: 400}",
                 f"output_dir={tmp_path / 'dqn'}"], tmp_path, timeout=1200)
    # (220 s in CI's run of 2026-11-29; 600 s and then 1,200 s ran out on 2026-11-30 beside test_learning's
    # dqn_cartpole run: two torch_threads=2 learners spinning on two cores, which tests/conftest.py now stops)
    assert p.returncode == 0, p.stderr
    s = run_summary(p.stdout)
    assert "eval/episode_return_mean" in s["stopped"] and "target met" in s["stopped"], s
    assert s["return"].startswith("no episode finished")  # it never sampled: every row came from the files


# ---------------------------------------------------------------------------------------- no env
NO_ENV = ["env.id=null", "env.observation_space={type: Box, shape: [4]}", "env.action_space={type: Discrete, n: 2}",
          "evaluation.interval=0"]


@pytest.mark.slow
def test_bc_trains_without_an_env_and_its_policy_plays_on_one_later(recorded, tmp_path):
    """Spaces declared in YAML, no env built: every row from the files; rlrun-eval env=... plays it."""
    p = run_cli(["+experiment=bc_cartpole", f"input={recorded / 'data'}", "tracking=none", *NO_ENV,
                 "stop.training_iteration=60", f"output_dir={tmp_path / 'bc'}"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert run_summary(p.stdout)["return"].startswith("no episode finished")
    first = next(ln for ln in p.stdout.splitlines() if ln.startswith("iter "))  # no greedy return: the loss
    assert "  loss " in first and "nan" not in first, first
    p = eval_cli([f"checkpoint={tmp_path / 'bc'}", "env=CartPole-v1", "episodes=20", "log=false",
                  f"out={tmp_path / 'eval'}"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "eval" / "result.json").read_text())["eval/episode_return_mean"] >= 475
    for extra, words in (([], "env=<gymnasium id>"), (["env=Pendulum-v1"], "env: Pendulum-v1 has the observation")):
        p = eval_cli([f"checkpoint={tmp_path / 'bc'}", "log=false", *extra], tmp_path)
        assert p.returncode == 2 and words in p.stderr and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.parametrize(("extra", "words"), [
    (["env.id=null"], "env.id: null (no env) needs declared spaces"),
    (["env.observation_space={type: Box, shape: [4]}"], "env.action_space: missing; declare both"),
    (["env.observation_space={type: Bx}", "env.action_space={type: Discrete, n: 2}"],
     "env.observation_space: expected"),
    (["env.observation_space={type: Box, shape: [4], low: 1, high: 0}", "env.action_space={type: Discrete, n: 2}"],
     "env.observation_space: {'type': 'Box'"),
    (["env.observation_space={type: Box, shape: [4]}", "env.action_space={type: Discrete, n: 2, shape: 3}"],
     "env.action_space: unknown key 'shape'"),
    ([*NO_ENV[:3]], "evaluation.interval: 5: evaluation runs on the env and env.id is null"),
    ([*NO_ENV, "rollout.num_workers=2"], "rollout.num_workers: 2 rollout workers and env.id is null"),
    ([*NO_ENV, "input=sampler"], "input: 'sampler' samples from the env and env.id is null"),
    ([*NO_ENV, "env.wrappers=[flatten_observation]"], "env.wrappers: ['flatten_observation'] wrap an env"),
])
def test_declared_spaces_and_runs_without_an_env_are_checked(extra, words):
    with pytest.raises(ConfigError) as e:
        compose(["+experiment=bc_cartpole", "input=data", "tracking=none", *extra])
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------- bad data
def _bc(tmp_path, source, *extra):
    return compose(["+experiment=bc_cartpole", f"input={source}", "tracking=none", "progress=false",
                    f"output_dir={tmp_path / 'out'}", *extra])


def _rewrite(src, dst, fn):
    """A copy of an rlrun file whose table ``fn`` changed (metadata kept)."""
    t = pq.read_table(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(fn(t).replace_schema_metadata(t.schema.metadata), dst)
    return dst


def _bad_inputs(recorded, tmp_path):
    """``{case: (input, extra overrides, substrings of the one error line)}``: each kind of bad data."""
    src = next((recorded / "data").glob("*.parquet"))
    cut = tmp_path / "cut" / "part.parquet"
    cut.parent.mkdir()
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    no_actions = _rewrite(src, tmp_path / "noact" / "part.parquet", lambda t: t.drop_columns(["actions"]))

    def nan_rewards(t):
        r = t.column("rewards").to_numpy().copy()
        r[7] = np.nan
        return t.set_column(t.schema.get_field_index("rewards"), "rewards", pa.array(r))

    nan = _rewrite(src, tmp_path / "nan" / "part.parquet", nan_rewards)
    foreign = tmp_path / "foreign" / "part.parquet"
    foreign.parent.mkdir()
    pq.write_table(pa.table({"obs": [1.0], "actions": [0]}), foreign)
    return {
        "truncated file": (cut.parent, [], [str(cut), "not a readable Parquet file"]),
        "no actions column": (no_actions.parent, [], [str(no_actions), "column 'actions' is missing"]),
        "NaN reward": (nan.parent, [], [str(nan), "column 'rewards'", "1 non-finite", "row 7"]),
        "not rlrun's file": (foreign.parent, [], [str(foreign), "without rlrun metadata"]),
        "obs shape": (recorded / "data", ["env.id=Acrobot-v1"], [str(src), "observation_space", "does not match"]),
        "no env, obs shape": (recorded / "data", ["env.id=null", "env.observation_space={type: Box, shape: [5]}",
                                                  *NO_ENV[2:]], [str(src), "observation_space", "does not match"]),
        "unknown Minari id": ("minari:cartpole/nope-v0", [], ["minari:cartpole/nope-v0", "no local Minari dataset"]),
    }


@pytest.mark.slow
def test_bad_data_is_refused_before_training_naming_the_file_and_the_column(recorded, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    for source, extra, needles in _bad_inputs(recorded, tmp_path).values():
        with pytest.raises(DataError) as e:
            run(_bc(tmp_path, source, *extra), tmp_path)
        assert "\n" not in str(e.value) and all(n in str(e.value) for n in needles), str(e.value)
    assert not (tmp_path / "out" / "checkpoints").exists()  # refused before any training
    with pytest.raises(PluginError, match=r"env.observation_space: declared Box\(-inf, inf, \(5,\), float32\) but"):
        run(_bc(tmp_path, recorded / "data", "env.observation_space={type: Box, shape: [5]}", *NO_ENV[2:3]), tmp_path)
    with pytest.raises(ConfigError, match="input: no such directory or file '/nonexistent'"):
        _bc(tmp_path, "/nonexistent")
    with pytest.raises(ConfigError, match="input: this run trains from recorded data"):
        compose(["+experiment=bc_cartpole", "tracking=none"])
    with pytest.raises(ConfigError, match="output: '.*' is also an input"):
        _bc(tmp_path, recorded / "data", f"output={recorded / 'data'}")
    with pytest.raises(ConfigError, match="input.sampler: weight must be a positive number"):
        _bc(tmp_path, "{sampler: -1}")
    with pytest.raises(ConfigError, match="observation_filter"):
        compose(["+experiment=ppo_cartpole", "tracking=none", "rollout.observation_filter=mean_std",
                 f"output={tmp_path / 'x'}"])


@pytest.mark.slow
def test_the_cli_says_one_line_and_exits_2_for_each_kind_of_bad_data(recorded, tmp_path, monkeypatch):
    """Each case through the CLI's entry function in this process (tests/inprocess.py), with MLflow
    tracking on; the first also as a real ``python -m rlrun`` process, which must say the same line."""
    from tests.inprocess import cli_in_process

    minari = {"MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    monkeypatch.setenv("MINARI_DATASETS_PATH", minari["MINARI_DATASETS_PATH"])
    results = []
    for i, (name, (source, extra, needles)) in enumerate(_bad_inputs(recorded, tmp_path).items()):
        args = ["+experiment=bc_cartpole", f"input={source}", *extra]
        cwd = tmp_path / name.replace(" ", "_").replace("'", "")
        cwd.mkdir()
        results.append((name, cwd, needles, cli_in_process(args, cwd)))
        if i == 0:
            (cwd / "process").mkdir()
            p = run_cli(args, cwd / "process", env=minari)
            assert (p.returncode, p.stderr) == (results[-1][3].returncode, results[-1][3].stderr), (name, p.stderr)
            results.append((name, cwd / "process", needles, p))
    for name, cwd, needles, p in results:
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (name, p.stderr)
        assert p.stderr.startswith("rlrun: error: ") and all(n in p.stderr for n in needles), (name, p.stderr)
        assert not (cwd / "mlflow.db").exists() and not list(cwd.glob("outputs/*/*/checkpoints")), name


# ---------------------------------------------------------------------------------------- Minari
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`(code_permalink|author|author_email|description|eval_env)`:UserWarning")
def test_minari_datasets_made_by_minari_train_bc_and_rlrun_output_loads_in_minari(recorded, tmp_path, monkeypatch):
    import minari
    from minari.data_collector import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    t = ds.dataset(recorded / "data", format="parquet").to_table()
    meta = read_meta(next((recorded / "data").glob("*.parquet")))
    b = batch_from_table(t, meta["columns"])
    buffers = [EpisodeBuffer(observations=np.concatenate([e[SB.OBS], e[SB.NEXT_OBS][-1:]]), actions=e[SB.ACTIONS],
                             rewards=e[SB.REWARDS], terminations=e[SB.TERMINATEDS], truncations=e[SB.TRUNCATEDS])
               for e in b.split_by_episode()[:40]]
    minari.create_dataset_from_buffers("cartpole/made-by-minari-v0", buffers, env="CartPole-v1",
                                       data_format="arrow", algorithm_name="ppo")
    p = run_cli(["+experiment=bc_cartpole", "input=minari:cartpole/made-by-minari-v0", "tracking=none"], tmp_path,
                env={"MINARI_DATASETS_PATH": str(tmp_path / "minari")})
    assert p.returncode == 0, p.stderr
    s = run_summary(p.stdout)
    assert "target met" in s["stopped"], s
    minari_env = {"MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    p = eval_cli([f"checkpoint={recorded / 'run'}", "episodes=5", "explore=true", "output=minari:cartpole/rlrun-v0",
                  "log=false", f"out={tmp_path / 'ev'}"], tmp_path, env=minari_env)
    assert p.returncode == 0 and "as a Minari dataset" in p.stdout, p.stderr
    d = minari.load_dataset("cartpole/rlrun-v0")
    assert d.total_episodes == 5 and d.total_steps == sum(len(e.rewards) for e in d.iterate_episodes())
    ep = d[0]
    assert ep.observations.shape == (len(ep.rewards) + 1, 4) and (ep.terminations | ep.truncations)[-1]
    info = json.loads((tmp_path / "ev" / "result.json").read_text())
    assert info["eval/num_episodes"] == 5
    with pytest.raises(DataError, match="no local Minari dataset 'cartpole/nope-v0'"):
        run(_bc(tmp_path, "minari:cartpole/nope-v0"), tmp_path)
    with pytest.raises(ConfigError, match="already exists"):
        _bc(tmp_path, "minari:cartpole/rlrun-v0", "output=minari:cartpole/rlrun-v0")
