"""Where a train batch comes from, and where sampled batches are recorded.

``Experience`` is where every train batch comes from: the rollout workers and the experience sources
of one run's ``input`` (rlrun/sources/source.py): a batch of ``train_batch_size`` rows takes
``weight x train_batch_size`` rows from each (the workers sample whole rounds: a mix carries the workers'
share over from batch to batch, so a batch too small to split, one row, is sampled or read whole, in turn);
it hands every sampled fragment to the ``output`` writers. ``make_writers`` opens the ``output``
writers: one per learned policy (the default policy of a single-agent run writes ``<output>/``, a named
policy ``<output>/<policy id>/``).
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
from rlrun.data.batch import SampleBatch, concat_samples
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

    def __init__(self, cfg: Any, sample: Callable[[int], list[Any]], policies: Mapping[str, Any]) -> None:
        self.sample = sample  # rows -> fragments from the workers, at least that many rows
        sources = parse_input(cfg.input)
        self.sampler_share = sum(w for s, w in sources if s == SAMPLER)
        self.readers: list[tuple[ExperienceSource, float]] = []
        policy = policies.get(DEFAULT_POLICY_ID)  # sources feed the default policy (named policies sample only)
        if policy is not None:
            self.readers = [(SOURCES.get(source_name(s))(SourceContext(cfg, s, policy, policy.observation_space,
                                                                       policy.action_space, cfg.seed + i)), w)
                            for i, (s, w) in enumerate(sources) if s != SAMPLER]
        self.writers: dict[str, DatasetWriter] = make_writers(cfg, policies) if cfg.output is not None else {}
        self._sampler_owed = 0.0  # a mix's sampler rows not yet taken (rounds of a row or a few: SAC at 1:1)

    def next_batch(self, n: int) -> tuple[Any, list[Any]]:
        """``n`` rows at least (a SampleBatch; a MultiAgentBatch in a multi-agent run): the batch and
        the sampled fragments in it, which the ``output`` writers have recorded."""
        if not self.readers or not self.sampler_share:
            sampled = self.sample(math.ceil(n * self.sampler_share)) if self.sampler_share else []
        else:  # the sampler's share over the rounds, where a round is too small to split: 0.5 of 1 row each
            self._sampler_owed += n * self.sampler_share
            sampled = self.sample(math.floor(self._sampler_owed + 1e-9)) if self._sampler_owed >= 1 - 1e-9 else []
            self._sampler_owed -= sum(len(b) for b in sampled)
        if self.writers:
            self._record(sampled)
        if not self.readers:
            return concat_samples(sampled), sampled
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
            by_policy = b.as_multi_agent().policy_batches
            for pid, writer in self.writers.items():
                if pid in by_policy:
                    writer.write(by_policy[pid])

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


def make_writers(cfg: Any, policies: Mapping[str, Any], explore: bool = True,
                 max_episodes: int | None = None) -> dict[str, DatasetWriter]:
    """One writer per learned policy: the default policy writes ``<output>`` (whole episodes per file),
    a named one ``<output>/<policy id>`` (rows as they come: its agents' trajectories interleave)."""
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
        default = pid == DEFAULT_POLICY_ID
        directory = Path(cfg.output) if default else Path(cfg.output) / pid
        out[pid] = DatasetWriter(directory, meta, cfg.offline.output_file_size_mb, columns,
                                 by_episode=default, max_episodes=max_episodes)
    return out
