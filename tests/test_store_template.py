"""A new SQLite store is a copy of the empty, migrated store MLflow made the first time on this machine
(rlrun/tracking/mlflow_runs.py: store_template): the same schema, its own Default experiment, and a
template MLflow cannot use is dropped, not trusted."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlrun.tracking.mlflow_runs import create_run, open_store, store_template


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLRUN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tables(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as c:
        return dict(c.execute("SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index')").fetchall())


def test_the_first_store_leaves_a_template_and_the_next_is_a_copy_with_its_own_default_experiment(
        cache, tmp_path, monkeypatch):
    template = store_template()
    assert template is not None and template.parent == cache and not template.exists()
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        monkeypatch.chdir(d)  # MLflow places the Default experiment's artifacts under the store's cwd
        client = open_store(f"sqlite:///{d / 'mlflow.db'}")
        run_id = create_run(client, "exp", None, "r", {"k": "v"}, f"sqlite:///{d / 'mlflow.db'}")
        client.log_metric(run_id, "m", 1.0)
        if d == first:
            assert template.exists(), "the first new store keeps its empty copy"
            before = template.stat().st_mtime_ns
    assert template.stat().st_mtime_ns == before, "the second store was copied, not migrated again"
    assert tables(first / "mlflow.db") == tables(second / "mlflow.db")
    default = MlflowClient(f"sqlite:///{second / 'mlflow.db'}").get_experiment("0")
    assert default.artifact_location == str(second / "mlruns" / "0")
    with sqlite3.connect(template) as c:  # the template itself stays empty
        assert c.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM experiments").fetchone() == (1,)
    # each store holds its own run only
    for d in (first, second):
        c = MlflowClient(f"sqlite:///{d / 'mlflow.db'}")
        assert len(c.search_runs([c.get_experiment_by_name("exp").experiment_id])) == 1


def test_a_template_mlflow_cannot_use_is_dropped_and_the_store_is_migrated_as_usual(cache, tmp_path, monkeypatch):
    template = store_template()
    assert template is not None
    cache.mkdir()
    template.write_bytes(b"not a database")
    monkeypatch.chdir(tmp_path)
    client = open_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_experiment("0").name == "Default"
    assert not (tmp_path / "mlflow.db.creating").exists()
    assert tables(template), "the bad template was replaced by a good one"
    assert sorted(os.listdir(cache)) == [template.name]
