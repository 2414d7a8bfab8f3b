"""External applications: a policy server inside the run (``rollout=server``) and its client.

- ``wire.py``: what server and client share (version, path prefix, array encoding; numpy only);
- ``protocol.py``: the versioned JSON message format and its validation;
- ``episodes.py``: the episodes clients drive, turned into rows for training (thread-safe);
- ``app.py``: the HTTP surface (an ASGI app on uvicorn, in a thread of the trainer process);
- ``worker.py``: ``ServerWorker``, the rollout worker whose ``sample()`` reads those episodes;
- ``local.py``: the client's copy of the policy in local-inference mode (torch);
- ``rlrun/app/client.py``: ``PolicyClient``, standard library and numpy only.
"""
