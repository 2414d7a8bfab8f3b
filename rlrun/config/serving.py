"""Checks of ``rollout=server`` against the rest of the run, before anything starts; torch-free.
(Each ``rollout.server`` value's own range is in ``rlrun/config/domains.py``.)"""

from __future__ import annotations

from typing import Any

from rlrun.config.typed import ConfigError
from rlrun.core.registry import MODELS


def check_server_config(cfg: Any) -> None:
    s, r = cfg.rollout.server, cfg.rollout
    if s is None:
        return
    unsupported = [
        (r.batch_mode == "truncate_episodes", "rollout.batch_mode: rollout=server hands out episodes as their steps "
                                              "arrive; use truncate_episodes"),
        (r.observation_filter == "none", "rollout.observation_filter: rollout=server takes raw observations; "
                                         "set none"),
        (not cfg.multiagent.policies, "multiagent: rollout=server serves single-agent episodes"),
        (not MODELS.entry(cfg.model.name).info.get("recurrent"),
         f"model.name: rollout=server does not carry a recurrent model's state yet, got '{cfg.model.name}'"),
    ]
    for ok, message in unsupported:
        if not ok:
            raise ConfigError(message)
