"""Off-policy evaluation during training: ``offline.evaluation: [is, wis, dm, dr, wdr]`` on held-out episodes.

The episodes (``offline.evaluation_input``, else the run's ``input`` files) are loaded once: whole
episodes only, at most ``offline.evaluation_episodes``. Every ``offline.evaluation_interval``
iterations the learner's policy (its action distribution, i.e. what it samples) is evaluated on
them; ``dm`` and ``dr`` first fit Q^pi by fitted Q evaluation (FQE: ``offline.fqe_steps`` minibatch
steps of r + gamma * sum_a' pi(a'|s') Q_target(s', a'), clamped to the range a value can take; target
network copied every 10 steps).
Results are logged as ``ope/<method>/v_target``, ``v_behavior``, ``v_gain`` and a 95% interval.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

from rlrun.config.offline import MINARI, input_files, parse_input
from rlrun.config.typed import ConfigError
from rlrun.core.registry import HOOKS
from rlrun.data.batch import SampleBatch, concat_samples
from rlrun.data.estimators import NEEDS_Q, Episode, estimate
from rlrun.data.parquet import ACTION_PROB, DataError, batch_from_table, read_meta
from rlrun.policy.optim import make_optimizer

SB = SampleBatch
FQE_TARGET_EVERY = 10
FQE_LR = 1e-3
FQE_BATCH = 256


def evaluation_source(cfg: Any) -> str:
    o = cfg.offline
    if o.evaluation_input is not None:
        return str(o.evaluation_input)
    files = [s for s, _ in parse_input(cfg.input) if s != "sampler"]
    if not files:
        raise ConfigError("offline.evaluation: the estimators need recorded episodes: set offline.evaluation_input="
                          "<dir of rlrun Parquet files> (held-out data of the behaviour policy)")
    return files[0]


OPE_COLUMNS = (SB.OBS, SB.NEXT_OBS, SB.ACTIONS, SB.REWARDS, SB.TERMINATEDS, SB.TRUNCATEDS, SB.EPS_ID, ACTION_PROB)


def load_episodes(source: str, max_episodes: int, action_space: gym.Space) -> list[SampleBatch]:
    """Whole episodes (in file order) with the behaviour policy's action probabilities."""
    if source.startswith(MINARI):
        raise DataError(f"offline.evaluation_input: {source}: Minari datasets do not record the behaviour "
                        "policy's action probabilities, which the estimators need; use rlrun Parquet files")
    episodes: list[SampleBatch] = []
    for path in input_files(source, "offline.evaluation_input"):
        meta = read_meta(path)
        names = pq.read_schema(path).names
        for col in OPE_COLUMNS:
            if col not in names:
                raise DataError(f"{path}: column '{col}' is missing (off-policy estimators need it)")
        # only what the estimators use: files with and without postprocessed columns then concatenate
        batch = batch_from_table(pq.read_table(path, columns=list(OPE_COLUMNS)), meta["columns"], str(path))
        for ep in batch.split_by_episode():
            if ep[SB.TERMINATEDS][-1] or ep[SB.TRUNCATEDS][-1]:
                episodes.append(ep)
            if len(episodes) >= max_episodes:
                return episodes
    if not episodes:
        raise DataError(f"offline.evaluation_input: {source} holds no whole episode")
    return episodes


class OffPolicyEvaluator:
    def __init__(self, cfg: Any, action_space: gym.Space) -> None:
        o = cfg.offline
        self.methods = list(o.evaluation)
        if any(m in NEEDS_Q for m in self.methods) and not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"offline.evaluation: dm, dr and wdr fit Q(s, a) for discrete actions; this env's "
                              f"actions are {action_space}; use is or wis")
        self.episodes = load_episodes(evaluation_source(cfg), o.evaluation_episodes, action_space)
        self.data = concat_samples(self.episodes)
        self.gamma = cfg.algo.gamma
        self.fqe_steps = o.fqe_steps
        self.seed = cfg.seed

    def evaluate(self, policy: Any) -> dict[str, float]:
        """``ope/<method>/...`` for the policy's current action distribution."""
        d = self.data
        probs = action_probs(policy, d[SB.OBS])
        target = probs[np.arange(len(d)), d[SB.ACTIONS]] if probs is not None else \
            np.exp(action_logp(policy, d[SB.OBS], d[SB.ACTIONS]))
        q_taken = v = None
        if any(m in NEEDS_Q for m in self.methods):
            next_probs = action_probs(policy, d[SB.NEXT_OBS])
            assert probs is not None and next_probs is not None  # discrete actions (checked in __init__)
            q = fit_fqe(d, next_probs, probs.shape[1], self.gamma, self.fqe_steps, self.seed)
            all_q = q_values(q, d[SB.OBS])
            q_taken, v = all_q[np.arange(len(d)), d[SB.ACTIONS]], (all_q * probs).sum(-1)
        episodes, start = [], 0
        for ep in self.episodes:
            s = slice(start, start + len(ep))
            start += len(ep)
            episodes.append(Episode(ep[SB.REWARDS], ep[ACTION_PROB], target[s], None if q_taken is None else q_taken[s],
                                    None if v is None else v[s]))
        out: dict[str, float] = {}
        for m in self.methods:
            out.update(estimate(m, episodes, self.gamma).metrics(m))
        return out


def action_probs(policy: Any, obs: np.ndarray) -> np.ndarray | None:
    """pi(a|s) for every action of a discrete action space (None for other spaces)."""
    if not isinstance(policy.action_space, gym.spaces.Discrete):
        return None
    with torch.inference_mode():
        logits = policy.model(torch.as_tensor(policy.filter_obs(obs))).dist_inputs
        return torch.softmax(logits, -1).numpy().astype(np.float64)


def action_logp(policy: Any, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        out = policy.model(torch.as_tensor(policy.filter_obs(obs)))
        return policy.dist_class(out.dist_inputs).logp(torch.as_tensor(actions)).numpy().astype(np.float64)


def fit_fqe(data: SampleBatch, next_probs: np.ndarray, num_actions: int, gamma: float, steps: int, seed: int,
            hiddens: Sequence[int] = (64, 64)) -> nn.Module:
    """Q^pi by fitted Q evaluation on ``data`` (rows with obs, actions, rewards, terminateds, new_obs)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    dims = [int(np.prod(data[SB.OBS].shape[1:])), *hiddens]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    q = nn.Sequential(nn.Flatten(), *layers, nn.Linear(dims[-1], num_actions))
    target = copy.deepcopy(q)
    opt = make_optimizer("adam", list(q.parameters()), FQE_LR, 1e-8, {})  # rlrun's Adam: no torch._dynamo import
    obs = torch.as_tensor(data[SB.OBS], dtype=torch.float32)
    nxt = torch.as_tensor(data[SB.NEXT_OBS], dtype=torch.float32)
    act = torch.as_tensor(data[SB.ACTIONS]).long()
    rew = torch.as_tensor(data[SB.REWARDS], dtype=torch.float32)
    cont = gamma * (1.0 - torch.as_tensor(data[SB.TERMINATEDS], dtype=torch.float32))
    pi_next = torch.as_tensor(next_probs, dtype=torch.float32)
    # Q^pi lies in [min(r, 0), max(r, 0)] / (1 - gamma): clamping the targets there keeps an
    # overestimate on actions the data never took from feeding on itself (FQE diverged without it)
    horizon = 1.0 / max(1.0 - gamma, 1e-3)
    lo, hi = min(float(rew.min()), 0.0) * horizon, max(float(rew.max()), 0.0) * horizon
    for step in range(steps):
        idx = torch.randint(len(obs), (FQE_BATCH,), generator=gen)
        with torch.no_grad():
            y = (rew[idx] + cont[idx] * (pi_next[idx] * target(nxt[idx])).sum(-1)).clamp(lo, hi)
        loss = (q(obs[idx]).gather(-1, act[idx, None]).squeeze(-1) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % FQE_TARGET_EVERY == 0:
            target.load_state_dict(q.state_dict())
    return q


def q_values(q: nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return q(torch.as_tensor(obs, dtype=torch.float32)).numpy().astype(np.float64)


def check_evaluation_data(cfg: Any, action_space: gym.Space) -> None:
    """Before compute: the held-out episodes exist, have the columns, and fit the methods."""
    if cfg.offline.evaluation:
        OffPolicyEvaluator(cfg, action_space)


class OffPolicyEstimationHook:
    """``offline.evaluation``: every ``offline.evaluation_interval`` iterations, ``ope/<method>/*`` for
    the default policy on the held-out episodes."""

    def __init__(self, evaluator: OffPolicyEvaluator, interval: int) -> None:
        self.evaluator, self.interval = evaluator, interval

    def after_iteration(self, trainer: Any, result: dict[str, float]) -> None:
        if trainer.iteration % self.interval == 0:
            result.update(self.evaluator.evaluate(trainer.policy))

    def close(self) -> None:
        pass


@HOOKS.register("off_policy_estimation", order=20)
def off_policy_estimation_hook(trainer: Any) -> OffPolicyEstimationHook | None:
    cfg = trainer.cfg
    if not cfg.offline.evaluation:
        return None
    evaluator = OffPolicyEvaluator(cfg, trainer.workers.local_worker.action_space)
    return OffPolicyEstimationHook(evaluator, cfg.offline.evaluation_interval)
