"""Recording a trained policy's episodes as an offline dataset (``rlrun-eval ... output=<dir>``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rlrun.config.offline import MINARI
from rlrun.config.schemas import RolloutConfig, RunConfig
from rlrun.config.typed import ConfigError
from rlrun.data.batch import SampleBatch
from rlrun.data.parquet import ACTION_PROB, DatasetWriter
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.sources.offline_input import make_writers
from rlrun.sources.rollout_worker import RolloutWorker, WorkerSpec

SB = SampleBatch
FRAGMENT = 64  # vector steps per sample() call while recording


def record_dataset(policies: dict[str, Any], cfg: RunConfig, out: str | Path, episodes: int, num_envs: int,
                   seed: int, explore: bool) -> DatasetWriter:
    """Play ``episodes`` whole episodes with the policy (sampled actions with ``explore``, else greedy)
    on ``num_envs`` sub-envs and write them to ``out``. Greedy data records the behaviour policy's
    probability of its action as 1 (``action_logp`` 0), which it is."""
    if cfg.multiagent.policies:
        raise ConfigError("output: rlrun-eval records single-agent policies; record a multi-agent run's data while "
                          "it trains (rlrun ... output=<dir>, one directory per policy)")
    if str(out).startswith(MINARI):
        from rlrun.data.minari import check_output

        check_output(str(out))
    elif Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"output: '{out}' exists and is not a directory")
    policy = policies[DEFAULT_POLICY_ID]
    if policy.obs_filter.active:
        raise ConfigError("output: this policy normalises observations (rollout.observation_filter); recording its "
                          "data is not supported")
    n = max(1, min(num_envs, episodes))
    spec = WorkerSpec(cfg.env, RolloutConfig(num_envs_per_worker=n, rollout_fragment_length=FRAGMENT), seed,
                      record_next_obs=True)
    worker = RolloutWorker(spec, lambda obs_space, action_space: policies)
    worker.explore = explore
    writer = make_writers(replace(cfg, output=str(out)), policies, explore, episodes)[DEFAULT_POLICY_ID]
    try:
        while not writer.full:
            batch = worker.sample()
            assert isinstance(batch, SampleBatch)  # a single-agent env (the caller checked)
            if not explore:
                batch[SB.ACTION_LOGP] = np.zeros(len(batch), dtype=np.float32)
                batch[ACTION_PROB] = np.ones(len(batch), dtype=np.float32)
            writer.write(batch)
    finally:
        worker.stop()
    writer.close(keep_running=False)
    return writer
