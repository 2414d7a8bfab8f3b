import json
import math
import tracemalloc

import pytest
import torch

from rlrun.core.history import MetricHistory, read_rows
from rlrun.training.checkpoint import FORMAT_VERSION, CheckpointError, load_checkpoint, save_checkpoint


def test_round_trip(tmp_path):
    state = {"w": torch.arange(3.0), "n": 5}
    p = save_checkpoint(tmp_path / "ck", state, {"algo": "ppo"}, {"seed": 1})
    ck = load_checkpoint(p)
    assert torch.equal(ck.state["w"], state["w"]) and ck.state["n"] == 5
    assert ck.meta["algo"] == "ppo" and ck.meta["format_version"] == FORMAT_VERSION and ck.config == {"seed": 1}
    save_checkpoint(p, {"w": torch.zeros(1)}, {}, {})  # replacing is atomic too
    assert load_checkpoint(p).state["w"].shape == (1,)
    assert [x.name for x in tmp_path.iterdir()] == ["ck"]  # no temp dirs left behind


class Evil:
    def __reduce__(self):
        return (open, ("/tmp/rlrun_pwned_marker", "w"))


def test_pickled_payload_is_refused_and_nothing_runs(tmp_path):
    marker = "/tmp/rlrun_pwned_marker"
    import os

    if os.path.exists(marker):
        os.remove(marker)
    p = save_checkpoint(tmp_path / "ck", {"w": torch.zeros(1)}, {}, {})
    torch.save({"w": Evil()}, p / "policy.pt")
    assert not os.path.exists(marker)
    with pytest.raises(CheckpointError, match="policy.pt: refused to load"):
        load_checkpoint(p)
    assert not os.path.exists(marker)


def test_missing_files_and_bad_version(tmp_path):
    with pytest.raises(CheckpointError, match="missing policy.pt"):
        load_checkpoint(tmp_path)
    p = save_checkpoint(tmp_path / "ck", {}, {}, {})
    (p / "meta.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(CheckpointError, match="format_version 99"):
        load_checkpoint(p)


def _rows(n, start=0):
    return [({"timesteps_total": float(100 * i), "rollout/episode_return_mean": i / 3}, 100 * i, 1_000 + i)
            for i in range(start, start + n)]


def test_history_rows_go_to_the_file_and_a_checkpoint_carries_them(tmp_path):
    h = MetricHistory(tmp_path / "metrics.jsonl", _rows(2))  # a resume starts from the checkpoint's rows
    h.append({"rollout/episode_return_mean": math.nan}, 150, 1)  # no episode finished yet: kept as the result had it
    (nan_row,) = list(h.rows(2))
    assert math.isnan(nan_row[0]["rollout/episode_return_mean"])
    h = MetricHistory(tmp_path / "metrics.jsonl", _rows(2))
    for row in _rows(3, start=2):
        h.append(*row)
    assert len(h) == 5 and list(h.rows()) == _rows(5) and h.results(3) == [m for m, _, _ in _rows(2, start=3)]
    slim = h.results(keep=lambda k: k == "timesteps_total")  # only what is kept, but the last row whole
    assert slim == [*({"timesteps_total": m["timesteps_total"]} for m, _, _ in _rows(4)), _rows(5)[-1][0]]
    p = save_checkpoint(tmp_path / "ck", {"n": 1}, {}, {}, h)
    h.append(*_rows(1, start=5)[0])  # rows after the checkpoint are not in it
    ck = load_checkpoint(p)
    assert ck.history_file is not None and list(read_rows(ck.history_file)) == _rows(5)
    h.close()
    assert list(h.rows(5)) == _rows(1, start=5)  # still readable once closed
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]  # no temp file left


def test_history_is_not_held_in_memory(tmp_path):
    h = MetricHistory(tmp_path / "metrics.jsonl")
    metrics = {f"train/m{i}": float(i) for i in range(60)}
    h.append(metrics, 0, 0)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(1, 5_001):
        h.append(metrics, i, i)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    h.close()
    assert len(h) == 5_001 and sum(1 for _ in h.rows()) == 5_001
    assert grown < 50_000, f"{grown} bytes held for 5,000 rows of 60 metrics"  # a list of the dicts: ~20 MB


def test_an_older_checkpoints_history_is_read_and_a_bad_one_named(tmp_path):
    p = save_checkpoint(tmp_path / "ck", {"n": 1}, {}, {})
    (p / "history.json").write_text(json.dumps([[m, s, t] for m, s, t in _rows(3)]))  # before 2026-11-26: one list
    assert list(read_rows(load_checkpoint(p).history_file)) == _rows(3)
    (p / "history.jsonl").write_text('{"a": 1.0, "_step": 5, "_timestamp_ms": 9}\n{"a": 1.0}\n')
    with pytest.raises(CheckpointError, match=r"history.jsonl: not a metric history \(line 2: not an iteration's "
                                              r"metrics with _step and _timestamp_ms \(KeyError"):
        load_checkpoint(p)
