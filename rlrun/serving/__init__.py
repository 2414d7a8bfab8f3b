"""External applications: a policy server inside the run (``rollout=server``) and its client.

- ``protocol.py``: the versioned JSON message format and its validation (numpy only);
- ``episodes.py``: the episodes clients drive, turned into rows for training (thread-safe);
- ``app.py``: the HTTP surface (an ASGI app on uvicorn, in a thread of the trainer process);
- ``worker.py``: ``ServerWorker``, the rollout worker whose ``sample()`` reads those episodes;
- ``rlrun/client.py``: ``PolicyClient``, standard library and numpy only.
"""
