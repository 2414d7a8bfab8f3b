"""The MLflow writer's message handling, on a real SQLite store: each typed message does its MLflow
job and replies as the protocol says; a protocol error is reported, not fatal; EOF marks the run KILLED."""

from __future__ import annotations

import queue
import threading

import pytest
from mlflow.tracking import MlflowClient

from rlrun.tracking import writer as mlflow_writer
from rlrun.tracking import writer_messages as msg
from rlrun.tracking.writer import _serve_jobs, _Shared
from rlrun.tracking.writer_jobs import RunJobs, one_run


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """These runs' experiments are made without an artifact location (a run on a SQLite store passes
    ``mlartifacts`` beside it: store_locations in rlrun/tracking/tracker.py), so MLflow puts their artifacts
    under ./mlruns of the working directory: the test's own, not the checkout the suite runs in."""
    monkeypatch.chdir(tmp_path)


def serve(uri, messages, init=None):
    init = init or msg.Init(uri, None, "unit", "r", None, log_model=False)
    replies: list = []
    jobs: queue.Queue = queue.Queue()
    for m in messages:
        jobs.put(m)
    shared = _Shared()
    more = one_run(RunJobs(init, shared.client(uri), replies.append, shared, threading.Event()), jobs)
    return more, replies


def test_a_run_start_to_end(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "a.txt").write_text("hi")
    more, replies = serve(uri, [
        msg.Start({"algo.lr": "0.1"}, {"rlrun.algo": "ppo"}),
        msg.Metrics([({"rollout/episode_return_mean": 10.0}, 100, 1), ({"rollout/episode_return_mean": 20.0}, 200, 2)]),
        msg.Tags({"x": "y"}), msg.Artifact(str(tmp_path / "a.txt")), msg.End("FINISHED"),
    ])
    assert more is True
    started = replies[0]
    assert isinstance(started, msg.RunStarted) and started.last_step == -1 and isinstance(replies[-1], msg.Ended)
    client = MlflowClient(uri)
    run = client.get_run(started.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"algo.lr": "0.1"}
    assert run.data.tags["x"] == "y" and run.data.tags["rlrun.algo"] == "ppo"
    hist = client.get_metric_history(started.run_id, "rollout/episode_return_mean")
    assert [(m.step, m.value) for m in hist] == [(100, 10.0), (200, 20.0)]
    assert [a.path for a in client.list_artifacts(started.run_id)] == ["a.txt"]


def test_errors_are_replied_and_eof_marks_the_run_killed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    more, replies = serve(uri, [
        msg.Start({}, {}), msg.Call("create_parent_run", {}),  # not a message inside a run
        msg.Artifact(str(tmp_path / "missing.txt")), msg.Eof(),
    ])
    assert more is False
    errors = [r.message for r in replies if isinstance(r, msg.Error)]
    assert errors[0].startswith("Call: TypeError: unexpected message Call inside a run")
    assert errors[1].startswith("Artifact:")
    assert MlflowClient(uri).get_run(replies[0].run_id).info.status == "KILLED"


def test_a_resumed_run_reports_the_last_step_mlflow_holds(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _, replies = serve(uri, [msg.Start({}, {}), msg.Metrics([({"timesteps_total": 512.0}, 512, 1)]), msg.End("KILLED")])
    run_id = replies[0].run_id
    init = msg.Init(uri, None, "unit", "r", run_id, log_model=False)
    _, again = serve(uri, [msg.Start({}, {"rlrun.resumed_from": "x"}), msg.End("FINISHED")], init)
    assert again[0] == msg.RunStarted(run_id, 512, replies[0].experiment_id) and replies[0].experiment_id == "1"
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"


def test_anything_but_init_or_call_first_is_refused():
    replies: list = []
    jobs: queue.Queue = queue.Queue()
    for m in (msg.Tags({}), msg.Eof()):
        jobs.put(m)
    _serve_jobs(jobs, replies.append, _Shared(), threading.Event())
    assert replies == [msg.Error("expected Init, got Tags")]


@pytest.mark.slow
def test_the_shared_writer_refuses_connections_without_its_key(tmp_path):
    """A sweep's writer socket: wrong key -> refused; a silent client is dropped; the writer serves
    a client with the key afterwards as if nothing happened."""
    import os
    import shutil
    import socket
    import time
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from rlrun.app.sweep import start_shared_writer

    proc, address = start_shared_writer()
    try:
        assert oct(os.stat(os.path.dirname(address)).st_mode & 0o777) == "0o700"
        assert oct(os.stat(msg.Path(address).with_name(msg.AUTHKEY_FILE)).st_mode & 0o777) == "0o600"
        with __import__("pytest").raises(AuthenticationError):
            Client(address, family="AF_UNIX", authkey=b"not the key")
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

        def call() -> object:
            with Client(address, family="AF_UNIX", authkey=msg.read_authkey(address)) as conn:
                conn.send(msg.Call("end_parent_run", {"uri": uri, "parent_run_id": "nope", "status": "KILLED"}))
                return conn.recv()

        # the writer's imports, its warm-up and the store's creation (seconds on a busy machine) come first
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            call()
            if time.monotonic() - t0 < 1:
                break
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(address)  # connects, never answers the challenge
        t0 = time.monotonic()
        reply = call()
        assert isinstance(reply, msg.Error) and "end_parent_run" in reply.message  # served: no such run
        # a writer held up by the silent client would answer only after its 10 s handshake timeout (the
        # answer itself took 5.5 s once on this 2-core machine with another test beside it)
        assert time.monotonic() - t0 < mlflow_writer.HANDSHAKE_TIMEOUT_S * 0.9
        silent.close()
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        removed_by_writer = not os.path.exists(os.path.dirname(address))
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)
    assert removed_by_writer  # the writer removed its socket, key and directory itself


def test_an_idle_writer_is_reused_only_in_the_working_directory_it_started_in(tmp_path, monkeypatch):
    """A run's writer waits for this process's next run, but a child started in another working directory is
    not reused: MLflow resolves relative paths there, and a removed directory (a test's temp dir) failed every
    later run of the process with FileNotFoundError (CI, 2026-12-02)."""
    from rlrun.tracking import tracker

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setattr(tracker, "_IDLE_WRITERS", [])
    monkeypatch.setattr(tracker, "_SHARED_WRITER", [])
    monkeypatch.chdir(tmp_path / "a")
    tracker.start_writer_early()
    first = tracker._IDLE_WRITERS[0]
    try:
        assert tracker._take_writer() is first and first.cwd == str(tmp_path / "a")  # the same directory: reused
        tracker._IDLE_WRITERS.append(first)
        monkeypatch.chdir(tmp_path / "b")
        second = tracker._take_writer()
        try:
            assert second is not first and second.cwd == str(tmp_path / "b") and second.alive()
            assert not first.alive() and tracker._IDLE_WRITERS == []
        finally:
            second.close()
    finally:
        first.close()


def test_a_writer_leaves_a_run_another_writer_took_over_as_it_is(tmp_path):
    # a Tune trial resumed in another actor while the actor it ran in sat in Tune's cache: that actor's writer sees
    # its trainer go (EOF) or let go (End with no status, Tracker.end('')) and must not end the run the other
    # writer now holds (its rlrun.writer_pid tag, set at each start); before, EOF marked it KILLED
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for last in (msg.Eof(), msg.End("")):
        _, replies = serve(uri, [msg.Start({}, {}), msg.Tags({"rlrun.writer_pid": "1"}), last])  # pid 1: not us
        assert MlflowClient(uri).get_run(replies[0].run_id).info.status == "RUNNING", last
    _, replies = serve(uri, [msg.Start({}, {}), msg.End("")])  # its own run let go of: still running
    assert isinstance(replies[-1], msg.Ended)
    assert MlflowClient(uri).get_run(replies[0].run_id).info.status == "RUNNING"
