"""Column helpers of ``SampleBatch``: what a column is, how many rows it has, how to map, stack,
describe and pad it. Columns are numpy arrays or dicts of them (nested observation spaces);
nothing here knows the batch class, so ``batch.py`` stays the one place batch behaviour is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np


class ColumnNames:
    """RLlib's column names, as class constants of ``SampleBatch`` (``SampleBatch.OBS``)."""

    OBS: ClassVar[str] = "obs"
    CUR_OBS: ClassVar[str] = "obs"
    NEXT_OBS: ClassVar[str] = "new_obs"  # RLlib's name; "next_obs" is accepted as an alias
    NEW_OBS: ClassVar[str] = "new_obs"
    INFOS: ClassVar[str] = "infos"
    ACTIONS: ClassVar[str] = "actions"
    REWARDS: ClassVar[str] = "rewards"
    PREV_ACTIONS: ClassVar[str] = "prev_actions"
    PREV_REWARDS: ClassVar[str] = "prev_rewards"
    DONES: ClassVar[str] = "dones"  # RLlib's name before terminated/truncated; split_by_episode(key="dones")
    TERMINATEDS: ClassVar[str] = "terminateds"
    TRUNCATEDS: ClassVar[str] = "truncateds"
    EPS_ID: ClassVar[str] = "eps_id"
    ENV_ID: ClassVar[str] = "env_id"
    AGENT_INDEX: ClassVar[str] = "agent_index"
    UNROLL_ID: ClassVar[str] = "unroll_id"
    T: ClassVar[str] = "t"
    ACTION_PROB: ClassVar[str] = "action_prob"
    ACTION_LOGP: ClassVar[str] = "action_logp"
    ACTION_DIST_INPUTS: ClassVar[str] = "action_dist_inputs"
    VF_PREDS: ClassVar[str] = "vf_preds"
    ADVANTAGES: ClassVar[str] = "advantages"
    VALUE_TARGETS: ClassVar[str] = "value_targets"
    SEQ_LENS: ClassVar[str] = "seq_lens"  # RLlib's sequence batches: rows per sequence
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


STATE_PREFIXES = ("state_in_", "state_out_")  # recurrent state: one row per sequence in a batch with seq_lens


def attempt_count_timesteps(columns: Mapping[str, Any]) -> int:
    """Timesteps in a dict of columns, as RLlib's function of this name counts them: ``sum(seq_lens)``
    when there are sequence lengths, else the rows of the first column that is not ``infos`` or
    recurrent state; 0 when there is none."""
    seq_lens = columns.get(ColumnNames.SEQ_LENS)
    if seq_lens is not None and len(seq_lens) > 0:
        return int(np.sum(as_column(seq_lens)))
    for k, v in columns.items():
        if k != ColumnNames.SEQ_LENS and k != ColumnNames.INFOS and not k.startswith(STATE_PREFIXES):
            return rows(as_column(v), k)
    return 0


def as_column(v: Any) -> Any:
    """A column: a numpy array (a list of dicts becomes an object array), or a dict of columns."""
    if isinstance(v, Mapping):
        return {k: as_column(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return v
    if hasattr(v, "detach") and hasattr(v, "cpu"):  # a torch tensor: its values, on the CPU
        return v.detach().cpu().numpy()
    if isinstance(v, list | tuple) and v and isinstance(v[0], Mapping):
        out = np.empty(len(v), dtype=object)
        out[:] = list(v)
        return out
    return np.asarray(v)


def rows(v: Any, key: str = "") -> int:
    """Rows of a column (the length of axis 0 of every array in it)."""
    if isinstance(v, Mapping):
        lengths = {rows(x, key) for x in v.values()}
        if len(lengths) > 1:
            raise ValueError(f"SampleBatch column '{key}': its nested parts have different lengths: {sorted(lengths)}")
        return lengths.pop() if lengths else 0
    if v.ndim == 0:
        raise ValueError(f"SampleBatch column '{key}' is a single value ({v!r}); a column has one row per step")
    return int(v.shape[0])


def map_column(fn: Callable[..., Any], v: Any) -> Any:
    """``fn`` on every array of a (possibly nested) column."""
    return {k: map_column(fn, x) for k, x in v.items()} if isinstance(v, Mapping) else fn(v)


def leaves(v: Any) -> list[np.ndarray]:
    return [a for x in v.values() for a in leaves(x)] if isinstance(v, Mapping) else [v]


def concat_columns(parts: list[Any]) -> Any:
    if isinstance(parts[0], Mapping):
        return {k: concat_columns([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def stack_rows(values: Sequence[Any]) -> Any:
    """The column whose rows are ``values`` (each a row as ``SampleBatch.rows`` yields it; an
    ``infos`` column, whose rows are dicts, is built with ``as_column`` instead)."""
    if isinstance(values[0], Mapping):
        return {k: stack_rows([v[k] for v in values]) for k in values[0]}
    return np.stack([np.asarray(v) for v in values])


def sequence_bounds(seq_lens: np.ndarray, padded_to: int | None) -> np.ndarray:
    """Row offsets of the sequences of a batch with ``seq_lens``: ``[0, end_0, end_1, ...]``. A
    zero-padded batch holds every sequence in ``padded_to`` rows."""
    lens = np.full(len(seq_lens), padded_to) if padded_to else np.asarray(seq_lens).reshape(-1).astype(np.int64)
    return np.r_[0, np.cumsum(lens)]


def pad_index(seq_lens: np.ndarray, max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(source rows, destination rows)`` that right-zero-pad sequences of ``seq_lens`` to
    ``max_seq_len`` rows each."""
    lens = np.asarray(seq_lens).reshape(-1).astype(np.int64)
    if len(lens) and int(lens.max()) > max_seq_len:
        raise ValueError(f"right_zero_pad: a sequence has {int(lens.max())} rows, more than max_seq_len={max_seq_len}")
    starts = np.r_[0, np.cumsum(lens)[:-1]]
    src = np.concatenate([s + np.arange(n) for s, n in zip(starts, lens, strict=True)]) if len(lens) else lens
    dst = np.concatenate([i * max_seq_len + np.arange(n) for i, n in enumerate(lens)]) if len(lens) else lens
    return src, dst


def padded(a: np.ndarray, src: np.ndarray, dst: np.ndarray, n_rows: int) -> np.ndarray:
    out = np.zeros((n_rows, *a.shape[1:]), dtype=a.dtype)
    out[dst] = a[src]
    return out


def describe(v: Any) -> str:
    """``np.ndarray((200, 4), dtype=float32, min=-2.46, max=2.259, mean=0.016)`` (RLlib's summary)."""
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe(x)}" for k, x in v.items()) + "}"
    head = f"np.ndarray({tuple(v.shape)}, dtype={v.dtype}"
    if v.dtype == object:
        return f"{head}, head={v[0]!r})" if v.size else head + ")"
    if v.size == 0 or not (np.issubdtype(v.dtype, np.number) or v.dtype == np.bool_):
        return head + ")"
    x = v.astype(np.float64, copy=False)
    return f"{head}, min={_g(x.min())}, max={_g(x.max())}, mean={_g(x.mean())})"


def _g(x: float) -> str:
    return f"{float(x):.4g}"
