"""SampleBatch: the one data interchange format, in-process or across the network.

A SampleBatch is a dict of equal-length numpy columns (axis 0 = rows = agent steps). A column may
also be nested: a dict of such arrays (a ``Dict`` observation space), or an object array (``infos``).
Rows of one episode are contiguous and in time order, so ``split_by_episode`` is a cheap scan of
``eps_id`` (or of the terminated/truncated flags when there is no ``eps_id``). Column names and
behaviour follow RLlib's classic SampleBatch where a user porting RLlib code would notice
(``new_obs``, in-place ``shuffle``, ``MultiAgentBatch.env_steps()``/``agent_steps()``/``count``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rlrun.core.metrics import DEFAULT_POLICY_ID


class SampleBatch(dict[str, np.ndarray]):
    """A dict of equal-length numpy columns; one or more trajectory fragments.

    Column names are class constants (``SampleBatch.OBS``), as in RLlib, so code never spells them.
    """

    OBS: ClassVar[str] = "obs"
    NEXT_OBS: ClassVar[str] = "new_obs"  # RLlib's name; "next_obs" is accepted as an alias
    NEW_OBS: ClassVar[str] = "new_obs"
    INFOS: ClassVar[str] = "infos"
    ACTIONS: ClassVar[str] = "actions"
    REWARDS: ClassVar[str] = "rewards"
    TERMINATEDS: ClassVar[str] = "terminateds"
    TRUNCATEDS: ClassVar[str] = "truncateds"
    EPS_ID: ClassVar[str] = "eps_id"
    ENV_ID: ClassVar[str] = "env_id"
    T: ClassVar[str] = "t"
    ACTION_LOGP: ClassVar[str] = "action_logp"
    ACTION_DIST_INPUTS: ClassVar[str] = "action_dist_inputs"
    VF_PREDS: ClassVar[str] = "vf_preds"
    ADVANTAGES: ClassVar[str] = "advantages"
    VALUE_TARGETS: ClassVar[str] = "value_targets"
    ENDS: ClassVar[str] = "ends"  # the return recursion stops after this row (episode end or fragment cut)
    NSTEP_REWARDS: ClassVar[str] = "nstep_rewards"  # sum_k gamma^k r_{t+k} over up to n steps
    NSTEP_DISCOUNT: ClassVar[str] = "nstep_discount"  # gamma^k for the bootstrap; 0 after a termination
    NSTEP_NEXT_OBS: ClassVar[str] = "nstep_new_obs"  # the observation the n-step bootstrap is taken from
    # prioritized replay (RLlib's names): the rows a minibatch came from, their importance weights,
    # and the per-row TD errors a loss writes into its batch for the priority update
    BATCH_INDEXES: ClassVar[str] = "batch_indexes"
    WEIGHTS: ClassVar[str] = "weights"
    TD_ERROR: ClassVar[str] = "td_error"

    ALIASES: ClassVar[dict[str, str]] = {"next_obs": "new_obs"}  # rlrun's earlier names -> RLlib's

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for k in [k for k in self if k in self.ALIASES]:
            dict.__setitem__(self, self.ALIASES[k], dict.pop(self, k))
        for k, v in self.items():
            dict.__setitem__(self, k, _as_column(v))
        self._check_lengths()

    # ----------------------------------------------------------------- basics
    def _check_lengths(self) -> None:
        lengths = {k: _rows(v) for k, v in self.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"SampleBatch columns have different lengths: {lengths}")

    def __setitem__(self, key: str, value: Any) -> None:
        key = self.ALIASES.get(key, key)
        value = _as_column(value)
        if self and _rows(value) != len(self):
            raise ValueError(f"column '{key}' has {_rows(value)} rows, the batch has {len(self)}")
        super().__setitem__(key, value)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, self.ALIASES.get(key, key) if isinstance(key, str) else key)

    def __len__(self) -> int:  # number of rows, not of columns
        for v in self.values():
            return _rows(v)
        return 0

    @property
    def count(self) -> int:
        """Number of rows (agent steps)."""
        return len(self)

    def env_steps(self) -> int:
        """Rows; each row is one env step (as ``MultiAgentBatch.env_steps``)."""
        return len(self)

    def agent_steps(self) -> int:
        return len(self)

    def as_multi_agent(self) -> MultiAgentBatch:
        """This batch as the default policy's part of a MultiAgentBatch (a single-agent run is the
        one-policy case): the rows are shared, not copied."""
        return MultiAgentBatch({DEFAULT_POLICY_ID: self}, len(self))

    @property
    def columns(self) -> list[str]:
        return list(self.keys())

    def __bool__(self) -> bool:
        return dict.__len__(self) > 0

    def copy(self, shallow: bool = False) -> SampleBatch:
        return SampleBatch({k: v if shallow else _map(lambda a: a.copy(), v) for k, v in self.items()})

    # ----------------------------------------------------------------- slicing
    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return dict.__getitem__(self, self.ALIASES.get(key, key))
        if isinstance(key, slice | np.ndarray | list):
            return self.slice(key)
        raise TypeError(f"SampleBatch index must be a column name, slice or index array, not {key!r}")

    def slice(self, index: slice | np.ndarray | list[int]) -> SampleBatch:
        """Rows selected by a slice (a view, no copy) or an index/bool array (a copy)."""
        out = SampleBatch()
        for k, v in self.items():
            dict.__setitem__(out, k, _map(lambda a: a[index], v))
        return out

    def rows(self) -> Iterator[dict[str, Any]]:
        """Iterate rows as ``{column: value}`` dicts (slow; for inspection and tests)."""
        for i in range(len(self)):
            yield {k: _map(lambda a, i=i: a[i], v) for k, v in self.items()}

    def shuffle(self, rng: np.random.Generator | None = None) -> SampleBatch:
        """Permute the rows in place, as RLlib's does, and return ``self`` (episodes are no longer
        contiguous afterwards)."""
        rng = rng if rng is not None else np.random.default_rng()
        order = rng.permutation(len(self))
        for k, v in list(self.items()):
            dict.__setitem__(self, k, _map(lambda a: a[order], v))
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

    def split_by_episode(self) -> list[SampleBatch]:
        """One batch per contiguous run of equal ``eps_id`` (episodes must be contiguous); without an
        ``eps_id`` column, a new episode starts after every terminated or truncated row."""
        n = len(self)
        if n == 0:
            return []
        if self.EPS_ID in self:
            ids = self[self.EPS_ID]
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        elif self.TERMINATEDS in self or self.TRUNCATEDS in self:
            done = np.zeros(n, dtype=bool)
            for col in (self.TERMINATEDS, self.TRUNCATEDS):
                if col in self:
                    done |= self[col].astype(bool)
            starts = np.flatnonzero(np.r_[True, done[:-1]])
        else:
            raise KeyError(f"split_by_episode needs '{self.EPS_ID}' or '{self.TERMINATEDS}'/'{self.TRUNCATEDS}'; "
                           f"columns: {self.columns}")
        ends = np.r_[starts[1:], n]
        return [self.slice(slice(int(s), int(e))) for s, e in zip(starts, ends, strict=True)]

    # ----------------------------------------------------------------- summary
    def summary(self) -> str:
        """``{'obs': np.ndarray((200, 4), dtype=float32, min=-2.46, max=2.259, mean=0.016), ...}``."""
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in self.items()) + "}"

    def __repr__(self) -> str:
        return f"SampleBatch({len(self)}: {self.summary()})"

    def __str__(self) -> str:
        return self.summary()


def _as_column(v: Any) -> Any:
    """A column: a numpy array (a list of dicts becomes an object array), or a dict of columns."""
    if isinstance(v, Mapping):
        return {k: _as_column(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, list | tuple) and v and isinstance(v[0], Mapping):
        out = np.empty(len(v), dtype=object)
        out[:] = list(v)
        return out
    return np.asarray(v)


def _rows(v: Any) -> int:
    if isinstance(v, Mapping):
        lengths = {_rows(x) for x in v.values()}
        if len(lengths) > 1:
            raise ValueError(f"a nested SampleBatch column has parts of different lengths: {sorted(lengths)}")
        return lengths.pop() if lengths else 0
    return int(v.shape[0])


def _map(fn: Any, v: Any) -> Any:
    """``fn`` on every array of a (possibly nested) column."""
    return {k: _map(fn, x) for k, x in v.items()} if isinstance(v, Mapping) else fn(v)


def _describe(v: Any) -> str:
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k!r}: {_describe(x)}" for k, x in v.items()) + "}"
    head = f"np.ndarray({tuple(v.shape)}, dtype={v.dtype}"
    if v.dtype == object:
        return f"{head}, head={v[0]!r})" if v.size else head + ")"
    if v.size == 0 or not (np.issubdtype(v.dtype, np.number) or v.dtype == np.bool_):
        return head + ")"
    x = v.astype(np.float64, copy=False)
    return f"{head}, min={_g(x.min())}, max={_g(x.max())}, mean={_g(x.mean())})"


def _g(x: float) -> str:
    return f"{float(x):.4g}"


def concat_samples(batches: Sequence[Any] | Iterable[Any]) -> Any:
    """Concatenate batches row-wise; every batch must have the same columns. MultiAgentBatches are
    concatenated per policy (as RLlib's ``concat_samples`` does)."""
    batches = list(batches)
    if batches and all(isinstance(b, MultiAgentBatch) for b in batches):
        return MultiAgentBatch.concat(batches)
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
    out = SampleBatch()
    for k in keys:
        dict.__setitem__(out, k, _concat([b[k] for b in batches]))
    return out


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], Mapping):
        return {k: _concat([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


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
