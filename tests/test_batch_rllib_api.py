"""RLlib's classic SampleBatch/MultiAgentBatch surface on rlrun's batches (issue 35, item 3).

RLlib's own unit tests for these classes run through ``experiments/rllib_compat/run_rllib_tests.py``
(their files are RLlib's, not ours); these tests pin the same behaviour in rlrun's suite.
"""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlrun import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, concat_samples
from rlrun.data.batch import attempt_count_timesteps

SB = SampleBatch


def seq_batch():
    return SB({"a": np.array([1, 2, 3, 2, 3, 4]), "b": {"c": np.array([4, 5, 6, 5, 6, 7])},
               SB.SEQ_LENS: [2, 3, 1], "state_in_0": np.array([1.0, 3.0, 4.0])})


def test_rllib_column_constants_exist_with_rllibs_names():
    names = {"OBS": "obs", "CUR_OBS": "obs", "NEXT_OBS": "new_obs", "ACTIONS": "actions", "REWARDS": "rewards",
             "DONES": "dones", "TERMINATEDS": "terminateds", "TRUNCATEDS": "truncateds", "INFOS": "infos",
             "EPS_ID": "eps_id", "AGENT_INDEX": "agent_index", "UNROLL_ID": "unroll_id", "ACTION_PROB": "action_prob",
             "ACTION_LOGP": "action_logp", "ACTION_DIST_INPUTS": "action_dist_inputs", "PREV_ACTIONS": "prev_actions",
             "PREV_REWARDS": "prev_rewards", "SEQ_LENS": "seq_lens", "VF_PREDS": "vf_preds", "T": "t"}
    assert {k: getattr(SB, k) for k in names} == names
    assert DEFAULT_POLICY_ID == "default_policy"


def test_columns_is_a_method_and_slice_takes_start_and_end():
    b = SB({"obs": np.arange(5), "rewards": np.ones(5)})
    obs, rew = b.columns(["obs", "rewards"])
    assert obs is b["obs"] and rew is b["rewards"]
    s = b.slice(1, 3)
    assert s["obs"].tolist() == [1, 2] and np.shares_memory(s["obs"], b["obs"])
    assert b.slice(slice(3, None))["obs"].tolist() == [3, 4]


def test_sequence_batch_counts_slices_and_copies_by_whole_sequences():
    s = seq_batch()
    assert s.count == len(s) == 6 and s.max_seq_len == 3
    cut = s[:3]  # the second sequence would be cut: the slice stops at the boundary before it
    assert cut["a"].tolist() == [1, 2] and cut[SB.SEQ_LENS].tolist() == [2] and cut["state_in_0"].tolist() == [1.0]
    assert s[:5][SB.SEQ_LENS].tolist() == [2, 3] and len(s[:50]) == 6
    assert s[2:][SB.SEQ_LENS].tolist() == [3, 1] and s[2:]["b"]["c"].tolist() == [6, 5, 6, 7]
    deep, shallow = s.copy(), s.copy(shallow=True)
    deep["state_in_0"][0] = 9.0
    assert s["state_in_0"][0] == 1.0
    shallow["b"]["c"][0] = 99
    assert s["b"]["c"][0] == 99
    with pytest.raises(ValueError, match="seq_lens"):
        s.shuffle()
    with pytest.raises(ValueError, match="whole sequences"):
        s[np.array([0, 1])]


def test_right_zero_pad_pads_every_sequence_in_place():
    s = SB({"a": np.array([1, 2, 3]), "b": {"c": np.array([4, 5, 6])}, SB.SEQ_LENS: [1, 2]})
    assert s.right_zero_pad(max_seq_len=5) is s
    assert s["a"].tolist() == [1, 0, 0, 0, 0, 2, 3, 0, 0, 0]
    assert s["b"]["c"].tolist() == [4, 0, 0, 0, 0, 5, 6, 0, 0, 0]
    assert s.zero_padded and s.max_seq_len == 5 and s.count == 10
    assert s[:5]["a"].tolist() == [1, 0, 0, 0, 0] and s[:5][SB.SEQ_LENS].tolist() == [1]
    back = pickle.loads(pickle.dumps(s))  # the padding survives the trip to a Ray worker
    assert back.zero_padded and back.max_seq_len == 5 and back.count == 10
    with pytest.raises(ValueError, match="more than max_seq_len=1"):
        SB({"a": np.zeros(3), SB.SEQ_LENS: [1, 2]}).right_zero_pad(1)


def test_concat_of_sequence_batches_keeps_the_longest_max_seq_len_and_refuses_a_mix():
    s1 = SB({"a": np.array([1, 2, 3]), SB.SEQ_LENS: [1, 2]})
    s2 = SB({"a": np.array([2, 3, 4]), SB.SEQ_LENS: [3]})
    both = concat_samples([s1, s2])
    assert both.max_seq_len == 3 and both[SB.SEQ_LENS].tolist() == [1, 2, 3] and s1.concat(s2)["a"].tolist() == [
        1, 2, 3, 2, 3, 4]
    with pytest.raises(ValueError, match="columns"):
        concat_samples([s1, s2, SB({"a": np.array([5])})])


def test_count_follows_rllib_for_infos_state_and_nested_columns():
    infos_only = {SB.INFOS: {"a": np.array([[1], [2], [3]])}}
    assert attempt_count_timesteps(infos_only) == 0 and SB(infos_only).count == 0
    state_only = {"state_in_0": np.zeros((3, 2)), "state_out_0": np.zeros((3, 2))}
    assert SB(state_only).count == 0
    nested = {SB.NEXT_OBS: {"a": {"b": np.array([[1], [2], [3]])}, "c": np.array([[4], [5], [6]])}}
    assert SB(nested).count == 3 and SB(nested).env_steps() == SB(nested).agent_steps() == 3
    assert SB({SB.OBS: np.zeros((3, 1)), SB.SEQ_LENS: np.array([[1], [2], [3]])}).count == 6


def test_size_bytes_and_scalar_columns_are_named():
    s = SB({"a": np.array([1, 2, 3]), "b": {"c": np.array([4, 5, 6])}, SB.SEQ_LENS: np.array([1, 2])})
    assert s.size_bytes() == s["a"].nbytes + s["b"]["c"].nbytes + s[SB.SEQ_LENS].nbytes
    with pytest.raises(ValueError, match="column 'c' is a single value"):
        SB({"a": np.zeros(3), "c": True})


def test_rows_of_a_sequence_batch_carry_seq_lens_one():
    s = SB({"a": np.array([[1, 1], [2, 2], [3, 3]]), "b": {"c": np.array([4, 5, 6])}, SB.SEQ_LENS: [1, 2]})
    first = next(s.rows())
    assert first["a"].tolist() == [1, 1] and first["b"] == {"c": 4} and first[SB.SEQ_LENS] == 1


def test_split_by_episode_by_eps_id_or_by_dones():
    s = SB({"a": np.arange(6), "eps_id": np.array([0, 0, 0, 0, 1, 1]), "terminateds": np.array([0, 0, 0, 1, 0, 1])})
    want = [[0, 1, 2, 3], [4, 5]]
    assert [e["a"].tolist() for e in s.split_by_episode()] == want
    assert [e["a"].tolist() for e in s.split_by_episode(key="eps_id")] == want
    assert [e["a"].tolist() for e in s.split_by_episode(key="dones")] == want
    with pytest.raises(KeyError, match="key must be"):
        s.split_by_episode(key="t")
    del s["eps_id"], s["terminateds"]
    with pytest.raises(KeyError, match="split_by_episode needs"):
        s.split_by_episode()
    s["dones"] = np.zeros(6)
    assert [len(e) for e in s.split_by_episode()] == [6]


def test_sample_batch_timeslices():
    b = SB({"obs": np.arange(7)})
    assert [t["obs"].tolist() for t in b.timeslices(3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [len(t) for t in b.timeslices(num_slices=2)] == [3, 4]
    assert [len(t) for t in b.timeslices(k=4)] == [4, 3]


def test_multi_agent_timeslices_group_rows_by_env_step():
    def agent(idx, t0):
        return SB({SB.T: [t0, t0 + 1], SB.EPS_ID: [0, 0], SB.AGENT_INDEX: [idx, idx],
                   "obs": [[idx, t0], [idx, t0 + 1]]})

    ma = MultiAgentBatch({"0": agent(0, 0), "1": agent(1, 1)}, 3)
    slices = ma.timeslices(1)
    assert [sorted(s.policy_batches) for s in slices] == [["0"], ["0", "1"], ["1"]]
    assert [s.count for s in slices] == [1, 1, 1]
    assert slices[1]["1"]["obs"].tolist() == [[1, 1]] and slices[2]["1"][SB.T].tolist() == [2]
    two = ma.timeslices(2)
    assert [s.count for s in two] == [2, 1] and len(two[0]["0"]) == 2 and len(two[0]["1"]) == 1


def test_concat_samples_takes_a_sample_batch_among_multi_agent_ones_as_the_default_policy():
    sb = SB({"obs": np.arange(2)})
    mixed = concat_samples([sb.as_multi_agent(), SB({"obs": np.arange(3)})])
    assert isinstance(mixed, MultiAgentBatch) and mixed.count == 5 and len(mixed[DEFAULT_POLICY_ID]) == 5
    assert concat_samples([sb]) is sb and MultiAgentBatch.wrap_as_needed({DEFAULT_POLICY_ID: sb}, 2) is sb
    assert MultiAgentBatch.concat_samples([mixed, mixed]).agent_steps() == 10


def test_rllib_module_names_map_onto_rlrun_for_rllibs_own_tests():
    """The mapping that runs RLlib's unit tests unmodified: RLlib's import lines get rlrun's classes,
    and its test helpers fail where batches differ."""
    code = (
        "import rllib_names; rllib_names.install()\n"
        "import ray; ray.init(num_gpus=1)\n"
        "from ray.rllib.policy.sample_batch import SampleBatch, MultiAgentBatch, concat_samples\n"
        "from ray.rllib.utils.test_utils import check, check_same_batch\n"
        "import rlrun\n"
        "assert SampleBatch is rlrun.SampleBatch and MultiAgentBatch is rlrun.MultiAgentBatch\n"
        "check(SampleBatch({'a': [1, 2]}), {'a': [1, 2]})\n"
        "check(SampleBatch({'a': [1, 2]}), {'a': [1, 3]}, false=True)\n"
        "try:\n"
        "    check_same_batch(SampleBatch({'a': [1, 2]}), SampleBatch({'a': [1, 3]}))\n"
        "except AssertionError:\n"
        "    print('differs')\n"
    )
    tests_dir = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, "-c", code], cwd=tests_dir, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "differs"


def test_a_sequence_batch_pickles_and_copies_whatever_its_column_order():
    import copy

    s = SB({"obs": np.arange(5.0), "state_in_0": np.zeros((2, 4)), SB.SEQ_LENS: [2, 3]})
    for back in (pickle.loads(pickle.dumps(s)), copy.copy(s), copy.deepcopy(s)):
        assert back.count == 5 and back["state_in_0"].shape == (2, 4) and back.max_seq_len == 3


def test_adjacent_slices_of_a_sequence_batch_cover_every_row_once():
    s = SB({"a": np.arange(6), SB.SEQ_LENS: [2, 4], "state_out_0": np.arange(6)})
    halves = s.timeslices(num_slices=2)  # the cut at row 3 falls inside the second sequence
    assert [h["a"].tolist() for h in halves] == [[0, 1], [2, 3, 4, 5]]
    assert s[3:6]["a"].tolist() == [2, 3, 4, 5]  # a start inside a sequence moves back to its start
    assert halves[1]["state_out_0"].tolist() == [2, 3, 4, 5]  # state_out is per step, as in RLlib
    padded = SB({"a": [0, 1, 2], "state_out_0": [0, 1, 2], SB.SEQ_LENS: [1, 2]}).right_zero_pad(3)
    assert padded["state_out_0"].tolist() == [0, 0, 0, 1, 2, 0]


def test_empty_seq_lens_and_dones_read_as_rllib_reads_them():
    for empty in (None, []):
        b = SB({"obs": np.arange(4), SB.SEQ_LENS: empty})
        assert SB.SEQ_LENS not in b and b[1:3]["obs"].tolist() == [1, 2]
    b = SB({"obs": np.arange(3), SB.TERMINATEDS: [False, False, True]})
    assert b[SB.DONES].tolist() == [False, False, True]  # RLlib 2.x: DONES reads TERMINATEDS
