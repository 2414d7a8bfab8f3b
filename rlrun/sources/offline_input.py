"""Where a train batch comes from, and where sampled batches are recorded.

``Experience`` is where every train batch comes from: the rollout workers and the experience sources
of one run's ``input`` (rlrun/sources/source.py): a batch of ``train_batch_size`` rows takes
``weight x train_batch_size`` rows from each (the workers sample whole rounds, so their share is
rounded up to a round); it hands every sampled fragment to the ``output`` writers. ``make_writers`` opens the ``output``
writers: one per policy (a multi-agent run writes ``<output>/<policy id>/``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlrun.algos.algorithm import COLLECTED_COLUMNS, get_algorithm
from rlrun.config.offline import MINARI, SAMPLER, parse_input, source_name
from rlrun.core.registry import SOURCES
from rlrun.core.version import __version__
from rlrun.data.batch import MultiAgentBatch, SampleBatch, concat_samples
from rlrun.data.parquet import ACTION_PROB, REQUIRED_COLUMNS, DatasetWriter
from rlrun.data.spaces import space_to_json
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.sources.source import ExperienceSource, SourceContext, merge_metrics

SB = SampleBatch


def check_input(cfg: Any, obs_space: gym.Space, action_space: gym.Space) -> int:
    """Every input source's data checked against the run (before compute); returns how many files."""
    needed = list(REQUIRED_COLUMNS)
    if get_algorithm(cfg.algo.name).needs_next_obs:
        needed.append(SB.NEXT_OBS)
    n = 0
    for source, _ in parse_input(cfg.input):
        check = None if source == SAMPLER else SOURCES.entry(source_name(source)).info.get("check_data")
        if check is not None:
            n += check(source, obs_space, action_space, needed)
    return n


class Experience:
    """Train batches from a run's ``input`` (the rollout workers, registered sources, or a weighted
    mix), and the ``output`` writers that record every sampled fragment."""

    def __init__(self, cfg: Any, sample: Callable[[int], list[Any]], policies: Mapping[str, Any],
                 obs_space: gym.Space | None, action_space: gym.Space | None, multi_agent: bool = False) -> None:
        self.sample = sample  # rows -> fragments from the workers, at least that many rows
        self.multi_agent = multi_agent
        sources = parse_input(cfg.input)
        self.sampler_share = sum(w for s, w in sources if s == SAMPLER)
        policy = policies.get(DEFAULT_POLICY_ID)
        self.readers: list[tuple[ExperienceSource, float]] = []
        if obs_space is not None and action_space is not None:  # a multi-agent run samples only (checked)
            self.readers = [(SOURCES.get(source_name(s))(SourceContext(cfg, s, policy, obs_space, action_space,
                                                                       cfg.seed + i)), w)
                            for i, (s, w) in enumerate(sources) if s != SAMPLER]
        self.writers: dict[str, DatasetWriter] = \
            make_writers(cfg, policies, multi_agent) if cfg.output is not None else {}

    def next_batch(self, n: int) -> tuple[Any, list[Any]]:
        """``n`` rows at least (a SampleBatch; a MultiAgentBatch in a multi-agent run): the batch and
        the sampled fragments in it, which the ``output`` writers have recorded."""
        sampled = self.sample(math.ceil(n * self.sampler_share)) if self.sampler_share else []
        if self.writers:
            self._record(sampled)
        if not self.readers:
            return (MultiAgentBatch.concat(sampled) if self.multi_agent else concat_samples(sampled)), sampled
        rest = n - sum(len(b) for b in sampled)
        parts = list(sampled)
        if rest > 0:
            total = sum(w for _, w in self.readers)
            shares = [math.floor(rest * w / total) for _, w in self.readers]
            shares[0] += rest - sum(shares)
            parts += [r.next_batch(k) for (r, _), k in zip(self.readers, shares, strict=True) if k > 0]
        if len(parts) > 1:
            keys = set(parts[0]).intersection(*parts[1:])
            parts = [SampleBatch({k: p[k] for k in keys}) for p in parts]
        return concat_samples(parts), sampled

    def _record(self, sampled: list[Any]) -> None:
        for b in sampled:
            if self.multi_agent:
                for pid, writer in self.writers.items():
                    if pid in b.policy_batches:
                        writer.write(b[pid])
            else:
                self.writers[DEFAULT_POLICY_ID].write(b)

    def metrics(self) -> dict[str, float]:
        return merge_metrics([r for r, _ in self.readers])

    def close(self) -> None:
        """The ``output`` writers write what they hold (running episodes too)."""
        for writer in self.writers.values():
            writer.close()


def dataset_meta(cfg: Any, policy_id: str, obs_space: gym.Space, action_space: gym.Space,
                 explore: bool = True) -> dict[str, Any]:
    return {"rlrun_version": __version__, "env_id": cfg.env.id, "env_kwargs": cfg.env.kwargs,
            "env_wrappers": cfg.env.wrappers, "policy_id": policy_id, "algo": cfg.algo.name, "explore": explore,
            "observation_space": space_to_json(obs_space), "action_space": space_to_json(action_space)}


def make_writers(cfg: Any, policies: Mapping[str, Any], multi_agent: bool, explore: bool = True,
                 max_episodes: int | None = None) -> dict[str, DatasetWriter]:
    """One writer per learned policy (``<output>`` for a single-agent run, ``<output>/<policy id>``)."""
    columns = None if cfg.offline.output_postprocessed else (*COLLECTED_COLUMNS, SB.NEXT_OBS, ACTION_PROB)
    out: dict[str, DatasetWriter] = {}
    for pid, policy in policies.items():
        if not hasattr(policy, "observation_space"):
            continue
        meta = dataset_meta(cfg, pid, policy.observation_space, policy.action_space, explore)
        if cfg.output.startswith(MINARI):
            from rlrun.data.minari import MinariWriter

            out[pid] = MinariWriter(cfg.output, meta, cfg.env.id, policy.observation_space, policy.action_space,
                                    cfg.offline.output_file_size_mb, max_episodes)
            continue
        directory = Path(cfg.output) / pid if multi_agent else Path(cfg.output)
        out[pid] = DatasetWriter(directory, meta, cfg.offline.output_file_size_mb, columns,
                                 by_episode=not multi_agent, max_episodes=max_episodes)
    return out
