import re

import numpy as np
import pytest

from rlrun.data.batch import MultiAgentBatch, SampleBatch, concat_samples


def make(n=6, start=0):
    return SampleBatch({
        SampleBatch.OBS: np.arange(start, start + n * 2, dtype=np.float32).reshape(n, 2),
        SampleBatch.REWARDS: np.ones(n, np.float32),
        SampleBatch.EPS_ID: np.array([7, 7, 8, 8, 8, 9][:n]),
    })


def test_len_columns_and_unequal_lengths():
    b = make()
    assert len(b) == 6 and b.count == 6
    assert list(b.keys()) == ["obs", "rewards", "eps_id"]
    assert b.columns(["rewards", "obs"])[1] is b["obs"]
    with pytest.raises(ValueError, match="different lengths"):
        SampleBatch({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="has 2 rows, the batch has 6"):
        b["x"] = np.zeros(2)


def test_concat_and_slicing():
    a, b = make(), make(start=100)
    c = concat_samples([a, b])
    assert len(c) == 12
    np.testing.assert_array_equal(c["obs"][6], [100, 101])
    s = c[2:4]
    assert len(s) == 2 and s["obs"][0, 0] == 4
    assert len(c[np.array([0, 11])]) == 2
    with pytest.raises(ValueError, match="columns"):
        concat_samples([a, SampleBatch({"obs": np.zeros((1, 2))})])


def test_shuffle_and_minibatches_cover_every_row_once():
    b = make()
    rng = np.random.default_rng(0)
    shuffled = b.shuffle(rng)
    assert sorted(shuffled["obs"][:, 0].tolist()) == sorted(b["obs"][:, 0].tolist())
    mbs = list(b.minibatches(4, rng))
    assert [len(m) for m in mbs] == [4, 2]
    seen = np.concatenate([m["obs"][:, 0] for m in mbs])
    assert sorted(seen.tolist()) == sorted(b["obs"][:, 0].tolist())


def test_split_by_episode():
    eps = make().split_by_episode()
    assert [len(e) for e in eps] == [2, 3, 1]
    assert [int(e["eps_id"][0]) for e in eps] == [7, 8, 9]


def test_rows():
    rows = list(make(2).rows())
    assert rows[1]["obs"].tolist() == [2.0, 3.0]


def test_summary_format():
    b = SampleBatch({"obs": np.array([[-2.46, 0.0], [2.259, 0.064]], np.float32)})
    text = b.summary()
    assert text.startswith("{'obs': np.ndarray((2, 2), dtype=float32, min=-2.46, max=2.259, mean=")
    assert re.fullmatch(r"\{'obs': np\.ndarray\(\(2, 2\), dtype=float32, min=\S+, max=\S+, mean=\S+\)\}", text)
    assert "SampleBatch(2:" in repr(b)


def test_multi_agent_batch():
    m = MultiAgentBatch({"p0": make(), "p1": make(3)}, env_steps=6)
    assert m.agent_steps() == 9 and m.env_steps() == 6 and m.count == 6
    both = MultiAgentBatch.concat([m, m])
    assert both.env_steps() == 12 and len(both["p1"]) == 6


def test_rllib_behaviour_nested_columns_infos_inplace_shuffle_and_aliases():
    obs = {"pos": np.arange(6, dtype=np.float32).reshape(3, 2), "flag": np.array([0, 1, 0])}
    b = SampleBatch({"obs": obs, "infos": [{}, {"x": 1}, {}], "next_obs": np.zeros((3, 1)),
                     "terminateds": np.array([False, True, False]), "t": np.array([0, 1, 0])})
    assert len(b) == 3 and b["obs"]["pos"].shape == (3, 2)
    assert b.summary().startswith("{'obs': {'pos': np.ndarray((3, 2), dtype=float32, min=0")
    assert "'infos': np.ndarray((3,), dtype=object, head={})" in b.summary()
    assert SampleBatch.NEW_OBS in b and "next_obs" in b and b["next_obs"] is b["new_obs"]  # rlrun's old name
    sub = b[np.array([2, 0])]
    assert sub["obs"]["pos"][0].tolist() == [4.0, 5.0] and sub["infos"][1] == {}
    both = concat_samples([b, b])
    assert len(both) == 6 and both["obs"]["flag"].tolist() == [0, 1, 0, 0, 1, 0]
    # split_by_episode without eps_id: terminated/truncated flags end episodes
    assert [len(e) for e in b.split_by_episode()] == [2, 1]
    same = b.shuffle(np.random.default_rng(3))  # in place, like RLlib's
    assert same is b and sorted(b["obs"]["pos"][:, 0].tolist()) == [0.0, 2.0, 4.0]
    assert [b["infos"][i] == {"x": 1} for i in range(3)] == (b["obs"]["flag"] == 1).tolist()  # rows kept together
    with pytest.raises(ValueError, match="different lengths"):
        SampleBatch({"obs": {"a": np.zeros(2), "b": np.zeros(3)}})


def test_multi_agent_batch_like_rllib():
    m = MultiAgentBatch({"p0": make(), "p1": make(3)}, env_steps=6)
    c = m.copy()
    c["p0"]["obs"][0, 0] = -1
    assert m["p0"]["obs"][0, 0] != -1 and len(m) == m.count == 6
    both = concat_samples([m, m])
    assert isinstance(both, MultiAgentBatch) and both.env_steps() == 12 and both.agent_steps() == 18


def test_a_sample_batch_is_the_default_policys_part_of_a_multi_agent_batch():
    """A single-agent run is the one-policy case: its rows, not a copy, under ``default_policy``."""
    from rlrun import DEFAULT_POLICY_ID
    from rlrun.core.metrics import per_policy

    b = SampleBatch({"obs": np.zeros((5, 2), np.float32), "rewards": np.ones(5, np.float32)})
    ma = b.as_multi_agent()
    assert isinstance(ma, MultiAgentBatch) and list(ma.policy_batches) == [DEFAULT_POLICY_ID]
    assert ma[DEFAULT_POLICY_ID] is b and ma.env_steps() == ma.agent_steps() == b.env_steps() == b.agent_steps() == 5
    assert ma.as_multi_agent() is ma
    assert per_policy("train/loss/total", DEFAULT_POLICY_ID) == "train/loss/total"
    assert per_policy("train/loss/total", "p1") == "train/p1/loss/total"
