"""Checks of ``rollout.server`` (rollout=server), before anything starts; torch-free."""

from __future__ import annotations

from typing import Any

from rlrun.registry import MODELS
from rlrun.schema import ConfigError


def check_server_config(cfg: Any) -> None:
    s, r = cfg.rollout.server, cfg.rollout
    if s is None:
        return
    unsupported = [
        (r.num_workers == 0, f"rollout.num_workers: must be 0 with rollout=server (the trainer's process serves "
                             f"every client; server endpoints on Ray workers are not built yet), got {r.num_workers}"),
        (r.batch_mode == "truncate_episodes", "rollout.batch_mode: rollout=server hands out episodes as their steps "
                                              "arrive; use truncate_episodes"),
        (r.observation_filter == "none", "rollout.observation_filter: rollout=server takes raw observations; "
                                         "set none"),
        (not cfg.multiagent.policies, "multiagent: rollout=server serves single-agent episodes"),
        (not MODELS.entry(cfg.model.name).info.get("recurrent"),
         f"model.name: rollout=server does not carry a recurrent model's state yet, got '{cfg.model.name}'"),
        (0 <= s.port <= 65535, f"rollout.server.port: must be in [0, 65535] (0: any free port), got {s.port}"),
        (bool(s.host), "rollout.server.host: must not be empty (127.0.0.1 serves this machine only)"),
        (bool(s.token_file), "rollout.server.token_file: must name a file"),
        (s.max_clients >= 1, f"rollout.server.max_clients: must be at least 1, got {s.max_clients}"),
        (s.max_episodes >= 1, f"rollout.server.max_episodes: must be at least 1, got {s.max_episodes}"),
        (s.episode_timeout_s > 0, f"rollout.server.episode_timeout_s: must be positive, got {s.episode_timeout_s:g}"),
        (s.max_request_bytes >= 1024, f"rollout.server.max_request_bytes: must be at least 1024, got "
                                      f"{s.max_request_bytes}"),
        (s.finish_grace_s >= 0, f"rollout.server.finish_grace_s: must be 0 or more, got {s.finish_grace_s:g}"),
    ]
    for ok, message in unsupported:
        if not ok:
            raise ConfigError(message)
