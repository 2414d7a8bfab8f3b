"""The experience seam: anything besides the rollout workers that gives the learner train batches.

An ``input`` entry names its source: ``sampler`` (the rollout workers), a path or glob (``files``:
rlrun Parquet files), ``minari:<id>`` (a local Minari dataset), or any name registered in
``SOURCES`` by a plugin. A mapping mixes them by weight (``input: {sampler: 0.5, my_source: 0.5}``).
A source is built once per run from a ``SourceContext`` and asked for rows every iteration::

    from rlrun import SOURCES, SampleBatch, postprocess_episodes

    @SOURCES.register("my_source")
    class MySource:
        def __init__(self, ctx):            # a SourceContext
            self.policy = ctx.policy
        def next_batch(self, rows):         # -> SampleBatch of `rows` rows, ready for the loss
            return postprocess_episodes(self.policy, my_recorded_rows(rows))
        def metrics(self):                  # -> {name: value}, merged into the iteration's result
            return {}

Registration info: ``prefix`` (an entry starting with it selects the source), ``check`` (a function
``(entry, key)`` run with the config checks, before compute; raise ``ConfigError``), ``check_data``
(``(entry, obs_space, action_space, columns)``: the data fits the env's spaces and has the columns;
run before compute once the spaces are known; returns how many files it checked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym

from rlrun.config.offline import FILES, MINARI, check_minari_entry, input_files
from rlrun.config.schemas import RunConfig
from rlrun.core.registry import SOURCES
from rlrun.data.batch import SampleBatch


@dataclass(frozen=True)
class SourceContext:
    """What a source is built from."""

    cfg: RunConfig
    entry: str  # the ``input`` entry that named it (a path, ``minari:<id>``, or the registered name)
    policy: Any  # the learner's policy: ``postprocess_trajectory``, ``compute_values``, its spaces
    observation_space: gym.Space
    action_space: gym.Space
    seed: int  # the run's seed, offset per source


class ExperienceSource(Protocol):
    """Yields train batches for the learner."""

    def next_batch(self, rows: int) -> SampleBatch:
        """``rows`` rows with the columns the algorithm's loss needs (``postprocess_episodes``)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Counters for the iteration's result (``offline/rows_read``, ...); ``{}`` if none."""
        ...


def merge_metrics(sources: list[Any]) -> dict[str, float]:
    """The sources' metrics, one value per name: summed (rows read), ``*/passes``: the fewest."""
    out: dict[str, float] = {}
    for source in sources:
        for name, value in source.metrics().items():
            if name not in out:
                out[name] = value
            else:
                out[name] = min(out[name], value) if name.endswith("/passes") else out[name] + value
    return out


# --------------------------------------------------------------------------- the built-in sources
# (pyarrow and minari are imported when a run reads files, not when the registry is filled)
def _check_files(source: str, obs_space: gym.Space, action_space: gym.Space, columns: list[str]) -> int:
    from rlrun.data.reader import check_file

    files = input_files(source)
    for path in files:
        check_file(path, columns, obs_space, action_space)
    return len(files)


def _check_minari(source: str, obs_space: gym.Space, action_space: gym.Space, columns: list[str]) -> int:
    from rlrun.data.minari import check_minari

    check_minari(source, obs_space, action_space)
    return 1


@SOURCES.register(FILES, check_data=_check_files)
def parquet_files(ctx: SourceContext) -> ExperienceSource:
    """``input: <dir or glob>``: rlrun Parquet files, streamed through a shuffle buffer."""
    from rlrun.data.reader import ParquetReader

    return ParquetReader(input_files(ctx.entry), ctx.policy, ctx.observation_space, ctx.action_space,
                         ctx.cfg.offline.shuffle_buffer, ctx.seed)


@SOURCES.register("minari", prefix=MINARI, check=check_minari_entry, check_data=_check_minari)
def minari_dataset(ctx: SourceContext) -> ExperienceSource:
    """``input: minari:<id>``: a local Minari dataset."""
    from rlrun.data.minari import MinariReader

    return MinariReader(ctx.entry, ctx.policy, ctx.observation_space, ctx.action_space,
                        ctx.cfg.offline.shuffle_buffer, ctx.seed)
