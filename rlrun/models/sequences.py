"""Sequences for recurrent models: where a train batch is cut, and minibatches of whole sequences.

A train batch is the concatenation of worker fragments, each sub-env's rows contiguous and in time
order. A sequence is a run of rows of one episode with consecutive step indices (``t``), at most
``max_seq_len`` long: it starts at every episode start, at every fragment boundary (the same episode
continues in a later fragment with the state the worker carried) and every ``max_seq_len`` rows. The
recurrent state a sequence starts from is the one the worker recorded for its first row
(``state_in_<k>`` columns). Padding exists only inside the model's forward pass (``SequenceView``):
losses see the real rows alone, so no padded row can reach any loss term.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrun.core.errors import PluginError
from rlrun.models.base import ModelOutput

STATE_IN = "state_in_"  # state_in_0, state_in_1, ...: the recurrent state before each row's step
SEQ_ROWS = "_seq_rows"  # [S, L] long: row of the minibatch at (sequence, position); 0 where padded
SEQ_MASK = "_seq_mask"  # [S, L] bool: the position holds a real row


def state_columns(batch: Any) -> list[str]:
    return sorted((k for k in batch if k.startswith(STATE_IN)), key=lambda k: int(k[len(STATE_IN):]))


def sequence_starts(eps_id: np.ndarray, t: np.ndarray, max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(first row, length) of every sequence, in row order."""
    n = len(eps_id)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new = np.ones(n, bool)
    new[1:] = (eps_id[1:] != eps_id[:-1]) | (t[1:] != t[:-1] + 1)
    run_start = np.flatnonzero(new)
    run_of_row = np.cumsum(new) - 1
    pos = np.arange(n) - run_start[run_of_row]
    new |= pos % max_seq_len == 0
    starts = np.flatnonzero(new)
    lens = np.diff(np.r_[starts, n])
    return starts, lens


def sequence_minibatches(lens: np.ndarray, rows_per_minibatch: int, rng: torch.Generator | None,
                         shuffle: bool = True) -> Iterator[np.ndarray]:
    """Sequence indices per minibatch: whole sequences, shuffled, each minibatch filled until it holds
    at least ``rows_per_minibatch`` real rows (the last one may hold fewer); ``shuffle=False``: one
    minibatch of every sequence in order."""
    if not shuffle:  # the minibatch is the whole batch
        yield np.arange(len(lens))
        return
    order = torch.randperm(len(lens), generator=rng).numpy()
    group: list[int] = []
    rows = 0
    for s in order:
        group.append(int(s))
        rows += int(lens[s])
        if rows >= rows_per_minibatch:
            yield np.asarray(group)
            group, rows = [], 0
    if group:
        yield np.asarray(group)


def sequence_minibatch(tb: dict[str, torch.Tensor], starts: np.ndarray, lens: np.ndarray,
                       seqs: np.ndarray) -> dict[str, torch.Tensor]:
    """The rows of sequences ``seqs`` (in that order) plus their layout: ``SEQ_ROWS`` and ``SEQ_MASK``."""
    sl = lens[seqs]
    rows = np.concatenate([np.arange(starts[s], starts[s] + lens[s]) for s in seqs])
    max_len = int(sl.max())
    offsets = np.r_[0, np.cumsum(sl)[:-1]]
    pos = np.arange(max_len)
    mask = pos[None, :] < sl[:, None]
    seq_rows = np.where(mask, offsets[:, None] + pos[None, :], 0)
    idx = torch.from_numpy(rows)
    out = {k: v[idx] for k, v in tb.items()}
    out[SEQ_ROWS] = torch.from_numpy(seq_rows)
    out[SEQ_MASK] = torch.from_numpy(mask)
    return out


class SequenceView(nn.Module):
    """What a loss gets as ``model`` for a recurrent policy: called with the minibatch's observations
    ``[N, ...]`` (real rows, sequence by sequence), it runs the recurrent model over the padded
    sequences from their recorded start states and returns ``ModelOutput`` for the N real rows."""

    def __init__(self, model: nn.Module, mbatch: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.model: Any = model
        self.rows = mbatch[SEQ_ROWS]
        self.mask = mbatch[SEQ_MASK]
        first = self.rows[:, 0]
        self.state = [mbatch[k][first] for k in state_columns(mbatch)]
        self.num_rows = int(self.mask.sum())

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        if obs.shape[0] != self.num_rows:
            raise PluginError(f"loss: a recurrent model is called with the minibatch's {self.num_rows} observation "
                              f"rows (in order); it got {obs.shape[0]} rows")
        padded = obs[self.rows]  # [S, L, ...]
        out, _ = self.model.forward_seq(padded, self.state)
        return ModelOutput(out.dist_inputs[self.mask], out.values[self.mask])
