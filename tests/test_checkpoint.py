import json

import pytest
import torch

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
