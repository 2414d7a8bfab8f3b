"""The multi-agent section of a config: checks that need no env, and each policy's own config.

A leaf below ``config`` (which runs ``check_multi_agent_config`` with its other checks and uses the
schemas here in ``RunConfig``); run configs are typed ``Any`` here so that this module does not
import ``config``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from rlrun.config.typed import ConfigError, from_dict
from rlrun.core.errors import suggest
from rlrun.core.metrics import DEFAULT_POLICY_ID
from rlrun.core.registry import ALGOS, ENVS, HEURISTICS, LOSSES, MODELS, POLICY_MAPPINGS, RegistryError

PETTINGZOO = "pettingzoo:"


@dataclass
class PolicyConfig:
    """One policy of a multi-agent run: learned (the run's algo/loss/model with these keys changed)
    or a registered heuristic that is never trained."""

    heuristic: str | None = None  # a registered non-learning policy (random, always_same, ...)
    heuristic_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the heuristic's constructor
    algo: dict[str, Any] = field(default_factory=dict)  # algo keys for this policy (lr, gamma, ...; same algorithm)
    loss: dict[str, Any] = field(default_factory=dict)  # loss coefficients for this policy
    model: dict[str, Any] = field(default_factory=dict)  # model keys for this policy (hiddens, ...)
    # a frozen copy of that learned policy (self-play against a past self), never trained: its weights
    # become the source's at the start and every snapshot_interval iterations (None: 10)
    snapshot_of: str | None = None
    snapshot_interval: int | None = None


@dataclass
class MultiAgentConfig:
    """Several policies, each acting for the agents mapped to it (empty ``policies``: single-agent)."""

    policies: dict[str, PolicyConfig] = field(default_factory=dict)
    # policy id -> agent id patterns (fnmatch: *, ?, [02]); patterns are tried in the order written
    # (policy by policy) and the first match wins
    policy_mapping: dict[str, list[str]] = field(default_factory=dict)
    policy_mapping_fn: str | None = None  # a registered mapping function (POLICY_MAPPINGS) instead
    policies_to_train: list[str] | None = None  # None: every learned policy (not heuristics, not snapshots)
    count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps"  # what train_batch_size counts


def is_multi_agent_env(env_id: str | None) -> bool:
    if env_id is None:  # no env: declared spaces
        return False
    return env_id.startswith(PETTINGZOO) or (env_id in ENVS and bool(ENVS.entry(env_id).info.get("multi_agent")))


def learned_policies(cfg: Any) -> list[str]:
    """The policies with a learner of their own (heuristics and snapshots have none)."""
    return [pid for pid, p in cfg.multiagent.policies.items() if p.heuristic is None and p.snapshot_of is None]


def policies_to_train(cfg: Any) -> list[str]:
    """The policies that learn: ``multiagent.policies_to_train``, else every learned one (not the
    heuristics and snapshots); a single-agent run's is its one default policy."""
    ma = cfg.multiagent
    if not ma.policies:
        return [DEFAULT_POLICY_ID]
    return list(ma.policies_to_train) if ma.policies_to_train is not None else learned_policies(cfg)


def snapshots(cfg: Any) -> dict[str, tuple[str, int]]:
    """Snapshot policy id -> (the learned policy it copies, every how many iterations)."""
    return {pid: (p.snapshot_of, p.snapshot_interval or 10) for pid, p in cfg.multiagent.policies.items()
            if p.snapshot_of is not None}


def policy_configs(cfg: Any) -> dict[str, PolicyConfig]:
    """The run's policies by id: a single-agent run's is ``default_policy`` with the run's own config."""
    return dict(cfg.multiagent.policies) or {DEFAULT_POLICY_ID: PolicyConfig()}


def policy_sections(cfg: Any, policy_id: str) -> Any:
    """The run's config with this policy's algo/loss/model keys applied (checked like the top level)."""
    p = policy_configs(cfg)[policy_id]
    if p.snapshot_of is not None:  # the source's network, so that its weights fit
        _check_snapshot(cfg.multiagent, policy_id, p, list(cfg.multiagent.policies))
        return policy_sections(cfg, p.snapshot_of)
    where = f"multiagent.policies.{policy_id}"
    out = cfg
    for key, registry, section, changes in (("algo", ALGOS, cfg.algo, p.algo), ("loss", LOSSES, cfg.loss, p.loss),
                                            ("model", MODELS, cfg.model, p.model)):
        if not changes:
            continue
        if "name" in changes and changes["name"] != section.name:
            raise ConfigError(f"{where}.{key}.name: a policy changes {key} keys, not the {key} itself "
                              f"('{changes['name']}' vs the run's '{section.name}')")
        cls = registry.entry(section.name).config_cls or type(section)
        merged = from_dict(cls, {**asdict(section), **changes}, f"{where}.{key}")
        out = replace(out, **{key: merged})
    return out


def learned_policy_sections(cfg: Any) -> Iterator[tuple[str, str, Any]]:
    """(policy id, key prefix, sections) of each policy that learns (heuristic ones left out): the prefix is ""
    for a single-agent run's policy and ``multiagent.policies.<id>.`` for a named one, the sections the run's
    config with the policy's own keys applied (``policy_sections``)."""
    for pid, p in policy_configs(cfg).items():
        if p.heuristic is None and p.snapshot_of is None:
            yield pid, "" if pid == DEFAULT_POLICY_ID else f"multiagent.policies.{pid}.", policy_sections(cfg, pid)


def check_multi_agent_config(cfg: Any) -> None:
    """Checks that need no env: policy ids in the mapping, heuristics, policies_to_train, step counting."""
    ma = cfg.multiagent
    if not ma.policies:
        for key, value in (("policy_mapping", ma.policy_mapping), ("policy_mapping_fn", ma.policy_mapping_fn),
                           ("policies_to_train", ma.policies_to_train)):
            if value:
                raise ConfigError(f"multiagent.{key}: set, but multiagent.policies is empty (a single-agent run)")
        if is_multi_agent_env(cfg.env.id):
            raise ConfigError(f"env.id: '{cfg.env.id}' is a multi-agent env; declare multiagent.policies "
                              "(and policy_mapping), e.g. +experiment=ppo_multi_cartpole")
        return
    ids = list(ma.policies)
    if DEFAULT_POLICY_ID in ids:
        raise ConfigError(f"multiagent.policies.{DEFAULT_POLICY_ID}: the id of a single-agent run's policy; "
                          "name the policies of a multi-agent run otherwise")
    if cfg.callbacks:  # the multi-agent worker has no per-agent episode objects yet
        raise ConfigError(f"callbacks: {cfg.callbacks} are not supported in multi-agent runs yet "
                          "(multiagent.policies is set); remove them or run single-agent")
    if cfg.env.wrappers:
        raise ConfigError("env.wrappers: gymnasium wrappers apply to single-agent envs; wrap a multi-agent env "
                          "in its own module (PettingZoo's SuperSuit wrappers) and register it")
    if not is_multi_agent_env(cfg.env.id):
        raise ConfigError(f"env.id: '{cfg.env.id}' is a single-agent env but multiagent.policies is set; use a "
                          f"multi-agent env (registered with multi_agent=True, or pettingzoo:<module>)")
    if cfg.env.observation_space is not None or cfg.env.action_space is not None:
        raise ConfigError("env.observation_space: a multi-agent env's spaces are its agents'; remove "
                          "env.observation_space and env.action_space")
    for pid, p in ma.policies.items():
        _check_policy(cfg, pid, p, ids)
    for pid in ma.policies_to_train or []:
        if pid not in ma.policies:
            raise ConfigError(f"multiagent.policies_to_train: unknown policy '{pid}'; policies: {', '.join(ids)}")
        if ma.policies[pid].heuristic is not None:
            raise ConfigError(f"multiagent.policies_to_train: '{pid}' is a heuristic "
                              f"({ma.policies[pid].heuristic}) and cannot be trained")
        if ma.policies[pid].snapshot_of is not None:
            raise ConfigError(f"multiagent.policies_to_train: '{pid}' is a snapshot of "
                              f"'{ma.policies[pid].snapshot_of}' and is not trained")
    for pid in ma.policy_mapping:
        if pid not in ma.policies:
            raise ConfigError(f"multiagent.policy_mapping.{pid}: unknown policy '{pid}'{suggest(pid, ids)}; "
                              f"policies: {', '.join(ids)}")
    if snapshots(cfg) and cfg.rollout.observation_filter != "none":
        raise ConfigError(f"rollout.observation_filter: {cfg.rollout.observation_filter} with a snapshot policy "
                          "(snapshot_of): its filter statistics would not be its source's; use none")
    if ma.policy_mapping and ma.policy_mapping_fn:
        raise ConfigError("multiagent.policy_mapping_fn: set together with multiagent.policy_mapping; use one")
    if ma.policy_mapping_fn is not None:
        try:
            POLICY_MAPPINGS.entry(ma.policy_mapping_fn, "multiagent.policy_mapping_fn")
        except RegistryError as e:
            raise ConfigError(str(e)) from None
    if not ma.policy_mapping and ma.policy_mapping_fn is None and len(ids) > 1:
        raise ConfigError(f"multiagent.policy_mapping: {len(ids)} policies ({', '.join(ids)}) but no mapping; "
                          f"give each its agent id patterns, e.g. {{{ids[0]}: ['agent_[02]'], {ids[1]}: ['*']}}")


def _check_policy(cfg: Any, pid: str, p: PolicyConfig, ids: list[str]) -> None:
    if p.snapshot_of is not None:
        _check_snapshot(cfg.multiagent, pid, p, ids)
    elif p.heuristic is not None:
        try:
            HEURISTICS.entry(p.heuristic, f"multiagent.policies.{pid}.heuristic")
        except RegistryError as e:
            raise ConfigError(str(e)) from None
        if p.algo or p.loss or p.model:
            raise ConfigError(f"multiagent.policies.{pid}: a heuristic policy has no algo/loss/model keys")
    elif p.heuristic_kwargs:
        raise ConfigError(f"multiagent.policies.{pid}.heuristic_kwargs: set without a heuristic")
    elif p.snapshot_interval is not None:
        raise ConfigError(f"multiagent.policies.{pid}.snapshot_interval: set without snapshot_of")
    else:
        policy_sections(cfg, pid)


def _check_snapshot(ma: Any, pid: str, p: PolicyConfig, ids: list[str]) -> None:
    where = f"multiagent.policies.{pid}"
    src = ma.policies.get(p.snapshot_of)
    if src is None:
        raise ConfigError(f"{where}.snapshot_of: unknown policy '{p.snapshot_of}'{suggest(str(p.snapshot_of), ids)}; "
                          f"policies: {', '.join(ids)}")
    if src.heuristic is not None or src.snapshot_of is not None:
        raise ConfigError(f"{where}.snapshot_of: '{p.snapshot_of}' is a "
                          f"{'heuristic' if src.heuristic is not None else 'snapshot'}; a snapshot copies a "
                          "learned policy")
    if p.heuristic is not None or p.heuristic_kwargs or p.algo or p.loss or p.model:
        raise ConfigError(f"{where}: a snapshot has its source's network; remove its heuristic/algo/loss/model keys")
    n = p.snapshot_interval
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"{where}.snapshot_interval: {p.snapshot_interval!r} must be a whole number of "
                          "iterations >= 1")
