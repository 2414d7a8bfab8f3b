"""SampleBatch: the one data interchange format, in-process or across the network.

A SampleBatch is a dict of equal-length numpy columns (axis 0 = rows = agent steps). A column may
also be nested: a dict of such arrays (a ``Dict`` observation space), or an object array (``infos``).
Rows of one episode are contiguous and in time order, so ``split_by_episode`` is a cheap scan of
``eps_id`` (or of the terminated/truncated flags when there is no ``eps_id``).

The surface is RLlib's classic SampleBatch and MultiAgentBatch (constants, ``concat_samples``,
``slice``, ``columns(keys)``, ``rows``, in-place ``shuffle``, ``split_by_episode(key=)``,
``timeslices``, ``right_zero_pad``, ``count``, the summary printout), sequence batches included: with a
``seq_lens`` column, ``seq_lens`` and ``state_in_<k>``/``state_out_<k>`` hold one row per sequence and
slices keep whole sequences. rlrun's own recurrent batches keep ``state_in_<k>`` per row instead and
cut sequences from ``eps_id``/``t`` when they train (``models/sequences.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rlrun.core.metrics import DEFAULT_POLICY_ID
from rlrun.data.columns import (
    STATE_PREFIXES,
    ColumnNames,
    as_column,
    attempt_count_timesteps,
    concat_columns,
    describe,
    leaves,
    map_column,
    pad_index,
    padded,
    rows,
    sequence_bounds,
    stack_rows,
)

__all__ = ["DEFAULT_POLICY_ID", "MultiAgentBatch", "SampleBatch", "attempt_count_timesteps", "concat_samples"]


class SampleBatch(ColumnNames, dict[str, np.ndarray]):
    """A dict of equal-length numpy columns; one or more trajectory fragments.

    Column names are class constants (``SampleBatch.OBS``, from ``ColumnNames``), as in RLlib, so code
    never spells them.
    """

    # sequence batches (RLlib's): every sequence takes max_seq_len rows once zero-padded
    zero_padded: bool = False
    max_seq_len: int | None = None

    def __init__(self, *args: Any, _zero_padded: bool = False, _max_seq_len: int | None = None,
                 _time_major: bool | None = None, _is_training: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.SEQ_LENS in self and (dict.get(self, self.SEQ_LENS) is None or not len(self[self.SEQ_LENS])):
            dict.pop(self, self.SEQ_LENS)  # no sequences: RLlib drops an empty or None seq_lens too
        for k in [k for k in self if k in self.ALIASES]:
            dict.__setitem__(self, self.ALIASES[k], dict.pop(self, k))
        for k, v in self.items():
            dict.__setitem__(self, k, as_column(v))
        self._check_lengths()
        if _zero_padded:
            self.zero_padded = True
        seq_lens: Any = dict.get(self, self.SEQ_LENS)
        if _max_seq_len is not None or (seq_lens is not None and len(seq_lens)):
            self.max_seq_len = int(_max_seq_len if _max_seq_len is not None else np.max(seq_lens))

    # ----------------------------------------------------------------- basics
    def _per_sequence(self, key: str) -> bool:
        """``seq_lens``, and a sequence batch's ``state_in_*``: one row per sequence, not per step."""
        return key == self.SEQ_LENS or (key.startswith("state_in_") and dict.__contains__(self, self.SEQ_LENS))

    def _step_rows(self) -> int | None:
        return next((rows(v, k) for k, v in self.items() if not self._per_sequence(k)), None)

    def _check_lengths(self) -> None:
        lengths = {k: rows(v, k) for k, v in self.items() if not self._per_sequence(k)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"SampleBatch columns have different lengths: {lengths}")

    def __setitem__(self, key: str, value: Any) -> None:
        key = self.ALIASES.get(key, key)
        value = as_column(value)
        if not self._per_sequence(key):
            n = rows(value, key)
            own = next((rows(v, k) for k, v in self.items() if k != key and not self._per_sequence(k)), n)
            if n != own:
                raise ValueError(f"column '{key}' has {n} rows, the batch has {own}")
        super().__setitem__(key, value)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, self.ALIASES.get(key, key) if isinstance(key, str) else key)

    def __len__(self) -> int:  # number of rows (timesteps), not of columns
        return self.count

    @property
    def count(self) -> int:
        """Timesteps, as RLlib counts them: ``sum(seq_lens)`` (every row once zero-padded), else the rows
        of the first column that is not ``infos`` or recurrent state (none: 0, e.g. only ``infos``)."""
        if self.zero_padded:
            return self._step_rows() or 0
        if dict.__contains__(self, self.SEQ_LENS):
            return attempt_count_timesteps(self)
        for k, v in self.items():  # the common case, kept cheap: len() runs on every minibatch
            if k != self.INFOS and not k.startswith(STATE_PREFIXES):
                return int(v.shape[0]) if type(v) is np.ndarray else rows(v, k)
        return 0

    def env_steps(self) -> int:  # each row is one env step (as MultiAgentBatch.env_steps)
        return self.count

    def agent_steps(self) -> int:
        return self.count

    def size_bytes(self) -> int:
        """Bytes held by the column arrays (nested ones included)."""
        return sum(a.nbytes for v in self.values() for a in leaves(v))

    def as_multi_agent(self) -> MultiAgentBatch:
        """This batch as the default policy's part of a MultiAgentBatch (rows shared, not copied)."""
        return MultiAgentBatch({DEFAULT_POLICY_ID: self}, len(self))

    def columns(self, keys: Iterable[str]) -> list[Any]:  # RLlib's: the columns named by keys, in order
        return [self[k] for k in keys]

    def __bool__(self) -> bool:
        return dict.__len__(self) > 0

    def __reduce__(self) -> Any:  # pickle/copy: rebuilt by __init__ (any column order), then its settings
        return (type(self), (dict(self),), self.__dict__.copy())

    def _like(self, data: Mapping[str, Any] | None = None) -> SampleBatch:
        out = SampleBatch()
        dict.update(out, data or {})
        if self.zero_padded or self.max_seq_len is not None:
            out.zero_padded, out.max_seq_len = self.zero_padded, self.max_seq_len
        return out

    def copy(self, shallow: bool = False) -> SampleBatch:
        return self._like({k: v if shallow else map_column(lambda a: a.copy(), v) for k, v in self.items()})

    def concat(self, other: SampleBatch) -> SampleBatch:  # this batch's rows, then other's
        return concat_samples([self, other])

    # ----------------------------------------------------------------- slicing
    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key == self.DONES and not dict.__contains__(self, key) and dict.__contains__(self, self.TERMINATEDS):
                return dict.__getitem__(self, self.TERMINATEDS)  # RLlib 2.x reads DONES as TERMINATEDS
            return dict.__getitem__(self, self.ALIASES.get(key, key))
        if isinstance(key, slice | np.ndarray | list):
            return self.slice(key)
        raise TypeError(f"SampleBatch index must be a column name, slice or index array, not {key!r}")

    def slice(self, start: int | slice | np.ndarray | list[int], end: int | None = None) -> SampleBatch:
        """Rows ``start:end`` or of a slice (views), or of an index/bool array (a copy). With ``seq_lens``
        whole sequences only: both ends move back to the start of the sequence they fall in."""
        index = start if isinstance(start, slice | np.ndarray | list) else slice(start, end)
        if dict.__contains__(self, self.SEQ_LENS):
            return self._slice_sequences(index)
        return self._like({k: map_column(lambda a: a[index], v) for k, v in self.items()})

    def _slice_sequences(self, index: Any) -> SampleBatch:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise ValueError("a SampleBatch with seq_lens can only be sliced by a contiguous range of rows "
                             f"(whole sequences), not {index!r}")
        bounds = sequence_bounds(self[self.SEQ_LENS], self.max_seq_len if self.zero_padded else None)
        start, stop, _ = index.indices(int(bounds[-1]))
        # both ends rounded down to the start of the sequence they fall in (RLlib's): adjacent slices
        # cover every row once
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = max(int(np.searchsorted(bounds, stop, side="right")) - 1, first)
        steps, seqs = slice(int(bounds[first]), int(bounds[last])), slice(first, last)
        cut = {k: seqs if self._per_sequence(k) else steps for k in self}
        return self._like({k: map_column(lambda a, i=cut[k]: a[i], v) for k, v in self.items()})

    def timeslices(self, size: int | None = None, num_slices: int | None = None,
                   k: int | None = None) -> list[SampleBatch]:
        """Consecutive batches of ``size`` rows (``k``: RLlib's older name), or ``num_slices`` equal ones."""
        size = size if size is not None else k
        n = len(self)
        if num_slices is not None:
            cuts = np.linspace(0, n, int(num_slices) + 1).astype(int)
            return [self.slice(int(a), int(b)) for a, b in itertools.pairwise(cuts)]
        if size is None or size <= 0:
            raise ValueError(f"timeslices needs a positive size (or num_slices), got size={size}")
        return [self.slice(s, s + size) for s in range(0, n, size)]

    def right_zero_pad(self, max_seq_len: int, exclude_states: bool = True) -> SampleBatch:
        """Pad every sequence to ``max_seq_len`` rows with zeros, in place (``state_in_*`` stay per sequence)."""
        if not exclude_states:
            raise ValueError("right_zero_pad(exclude_states=False): state columns hold one row per sequence")
        if self.zero_padded:
            return self
        seq_lens = self[self.SEQ_LENS]  # KeyError without one
        src, dst = pad_index(seq_lens, int(max_seq_len))
        n_rows = len(seq_lens) * int(max_seq_len)
        for k, v in list(self.items()):
            if not self._per_sequence(k):
                dict.__setitem__(self, k, map_column(lambda a: padded(a, src, dst, n_rows), v))
        self.zero_padded, self.max_seq_len = True, int(max_seq_len)
        return self

    def rows(self) -> Iterator[dict[str, Any]]:
        """Rows as ``{column: value}`` dicts (slow); with ``seq_lens`` each row's is 1, ``state_in_*`` left out."""
        seqs = dict.__contains__(self, self.SEQ_LENS)
        steps = {k: v for k, v in self.items() if not self._per_sequence(k)}
        for i in range(len(self)):
            row = {k: map_column(lambda a, i=i: a[i], v) for k, v in steps.items()}
            if seqs:
                row[self.SEQ_LENS] = 1
            yield row

    def shuffle(self, rng: np.random.Generator | None = None) -> SampleBatch:
        """Permute the rows in place, as RLlib's does, and return ``self`` (episodes are no longer
        contiguous afterwards)."""
        if dict.__contains__(self, self.SEQ_LENS):
            raise ValueError("shuffle is not possible on a SampleBatch with seq_lens: it would cut its sequences")
        rng = rng if rng is not None else np.random.default_rng()
        order = rng.permutation(len(self))
        for k, v in list(self.items()):
            dict.__setitem__(self, k, map_column(lambda a: a[order], v))
        return self

    def minibatches(
        self, size: int, rng: np.random.Generator | None = None, shuffle: bool = True
    ) -> Iterator[SampleBatch]:
        """Minibatches of ``size`` rows covering the batch once; the last one may be smaller."""
        if size <= 0:
            raise ValueError(f"minibatch size must be positive, got {size}")
        n = len(self)
        order = (rng if rng is not None else np.random.default_rng()).permutation(n) if shuffle else None
        for start in range(0, n, size):
            if order is None:
                yield self.slice(slice(start, start + size))
            else:
                yield self.slice(order[start : start + size])

    def split_by_episode(self, key: str | None = None) -> list[SampleBatch]:
        """One batch per episode: per contiguous run of equal ``eps_id`` (``key="eps_id"``, the default
        if there is one), or cut after every row whose ``dones``/``terminateds``/``truncateds`` is set."""
        done_cols = [c for c in (self.DONES, self.TERMINATEDS, self.TRUNCATEDS) if c in self]
        if key is None:
            key = self.EPS_ID if self.EPS_ID in self else self.DONES
        if key not in (self.EPS_ID, self.DONES):
            raise KeyError(f"split_by_episode: key must be '{self.EPS_ID}' or '{self.DONES}', got {key!r}")
        if (key == self.EPS_ID and self.EPS_ID not in self) or (key == self.DONES and not done_cols):
            raise KeyError(f"split_by_episode needs '{self.EPS_ID}' or '{self.TERMINATEDS}'/'{self.TRUNCATEDS}'; "
                           f"columns: {list(self.keys())}")
        n = len(self)
        if n == 0:
            return []
        if key == self.EPS_ID:
            ids = self[self.EPS_ID]
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        else:
            done = np.zeros(n, dtype=bool)
            for col in done_cols:
                done |= self[col].astype(bool)
            starts = np.flatnonzero(np.r_[True, done[:-1]])
        ends = np.r_[starts[1:], n]
        return [self.slice(int(s), int(e)) for s, e in zip(starts, ends, strict=True)]

    # ----------------------------------------------------------------- summary
    def summary(self) -> str:  # {'obs': np.ndarray((200, 4), dtype=float32, min=-2.46, max=2.259, mean=0.016), ...}
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in self.items()) + "}"

    def __repr__(self) -> str:
        return f"SampleBatch({len(self)}: {self.summary()})"

    def __str__(self) -> str:
        return self.summary()

    concat_samples: ClassVar[Any]  # RLlib 1.x's SampleBatch.concat_samples(batches); set below


def concat_samples(batches: Sequence[Any] | Iterable[Any]) -> Any:
    """Concatenate batches row-wise; every batch must have the same columns. MultiAgentBatches are
    concatenated per policy, SampleBatches among them taken as the default policy's (as RLlib's
    ``concat_samples`` does). Sequence batches keep their sequences (``max_seq_len`` is the largest)."""
    batches = list(batches)
    if any(isinstance(b, MultiAgentBatch) for b in batches):
        return MultiAgentBatch.concat([b.as_multi_agent() for b in batches])
    batches = [b for b in batches if b]
    if not batches:
        return SampleBatch()
    keys = batches[0].keys()
    for i, b in enumerate(batches[1:], start=1):
        if b.keys() != keys:
            raise ValueError(
                f"concat_samples: batch {i} has columns {sorted(b.keys())}, batch 0 has {sorted(keys)}"
            )
    if len(batches) == 1:
        return batches[0]
    padded_flags = {b.zero_padded for b in batches}
    if len(padded_flags) > 1:
        raise ValueError("concat_samples: some batches are zero-padded (right_zero_pad) and some are not")
    out = batches[0]._like({k: concat_columns([b[k] for b in batches]) for k in keys})
    lens = [b.max_seq_len for b in batches if b.max_seq_len is not None]
    if lens:
        if padded_flags == {True} and len(set(lens)) > 1:
            raise ValueError(f"concat_samples: zero-padded batches of different max_seq_len {sorted(set(lens))}")
        out.max_seq_len = max(lens)
    return out


SampleBatch.concat_samples = staticmethod(concat_samples)


class MultiAgentBatch:
    """``{policy_id: SampleBatch}`` plus the number of env steps they came from (``count``).

    Agent steps (rows) and env steps differ when several agents act in one env step.
    """

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int) -> None:
        self.policy_batches: dict[str, SampleBatch] = dict(policy_batches)
        self.count = int(env_steps)

    @staticmethod
    def wrap_as_needed(policy_batches: Mapping[str, SampleBatch], env_steps: int) -> SampleBatch | MultiAgentBatch:
        """A MultiAgentBatch, or the plain SampleBatch of a run whose one policy is ``default_policy``
        (a single-agent run, as RLlib's ``wrap_as_needed``)."""
        if len(policy_batches) == 1 and DEFAULT_POLICY_ID in policy_batches:
            return policy_batches[DEFAULT_POLICY_ID]
        return MultiAgentBatch(policy_batches, env_steps)

    def env_steps(self) -> int:
        return self.count

    def as_multi_agent(self) -> MultiAgentBatch:
        return self

    def agent_steps(self) -> int:
        return sum(len(b) for b in self.policy_batches.values())

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, policy_id: str) -> SampleBatch:
        return self.policy_batches[policy_id]

    def copy(self) -> MultiAgentBatch:
        return MultiAgentBatch({pid: b.copy() for pid, b in self.policy_batches.items()}, self.count)

    def size_bytes(self) -> int:
        return sum(b.size_bytes() for b in self.policy_batches.values())

    def timeslices(self, k: int) -> list[MultiAgentBatch]:
        """The batch cut into MultiAgentBatches of ``k`` env steps each, as RLlib's: rows of all
        policies are ordered by ``(eps_id, t, agent_index)``, and the rows of one ``(eps_id, t)`` are
        one env step, whichever policies they belong to."""
        if k <= 0:
            raise ValueError(f"timeslices needs a positive number of env steps, got {k}")
        steps = sorted(
            ((row[SampleBatch.EPS_ID].item(), row[SampleBatch.T].item(),
              row[SampleBatch.AGENT_INDEX].item() if SampleBatch.AGENT_INDEX in row else 0, pid, i), row)
            for pid, batch in self.policy_batches.items() for i, row in enumerate(batch.rows())
        )
        out: list[MultiAgentBatch] = []
        current: dict[str, list[dict[str, Any]]] = {}
        env_steps, last = 0, None
        for key, row in steps:
            if key[:2] != last and last is not None and env_steps == k:
                out.append(_from_rows(current, env_steps))
                current, env_steps = {}, 0
            if key[:2] != last:
                env_steps += 1
                last = key[:2]
            current.setdefault(key[3], []).append(row)
        if current:
            out.append(_from_rows(current, env_steps))
        return out

    def __repr__(self) -> str:
        inner = ", ".join(f"{pid!r}: {b!r}" for pid, b in self.policy_batches.items())
        return f"MultiAgentBatch(env_steps={self.count}, {{{inner}}})"

    @staticmethod
    def concat(batches: Sequence[MultiAgentBatch]) -> MultiAgentBatch:
        ids: dict[str, list[SampleBatch]] = {}
        for mb in batches:
            for pid, b in mb.policy_batches.items():
                ids.setdefault(pid, []).append(b)
        return MultiAgentBatch({pid: concat_samples(bs) for pid, bs in ids.items()}, sum(b.count for b in batches))

    concat_samples = staticmethod(concat_samples)  # RLlib's MultiAgentBatch.concat_samples


def _from_rows(policy_rows: Mapping[str, list[dict[str, Any]]], env_steps: int) -> MultiAgentBatch:
    """A MultiAgentBatch of ``{policy_id: rows}`` (rows as ``SampleBatch.rows`` yields them)."""
    return MultiAgentBatch({
        pid: SampleBatch({c: as_column([r[c] for r in rs]) if c == SampleBatch.INFOS else stack_rows([r[c] for r in rs])
                          for c in rs[0]})
        for pid, rs in policy_rows.items()
    }, env_steps)
