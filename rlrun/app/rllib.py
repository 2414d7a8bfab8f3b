"""RLlib's classic ``build_trainer``: a policy from ``build_policy`` made into a registered rlrun
algorithm and a trainer class that runs it from Python the RLlib way::

    MyTrainer = build_trainer(name="MyCustomTrainer", default_policy=MyTorchPolicy)
    trainer = MyTrainer(config={"env": "CartPole-v1", "lr": 0.01})
    result = trainer.train()          # one iteration; result["episode_reward_mean"], ...

The algorithm is PG-shaped: workers sample, ``postprocess_fn`` runs on every trajectory piece, the
learner takes ``num_sgd_iter`` passes of the policy's loss over each train batch. Its config
(``algo.*``) is rlrun's common algorithm config plus every key of the policy's
``get_default_config()``, so ``algo.<key>=...`` sets them from YAML and ``policy.config["<key>"]``
reads them. A trainer takes RLlib's config keys as an RLlib file's PG experiment does
(``rllib_files.translate``: RLlib's defaults, unknown keys named), plus the policy's own keys.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, ClassVar

from rlrun.algos.algorithm import Algorithm, register_algorithm
from rlrun.algos.classic import ClassicPolicy, field_name
from rlrun.app.rllib_config import fmt
from rlrun.app.rllib_files import last_wins, translate
from rlrun.config.schemas import AlgoConfig
from rlrun.config.typed import ConfigError
from rlrun.policy.policy import LearnerState, Policy, no_state


def _config_class(name: str, defaults: Mapping[str, Any]) -> type[AlgoConfig]:
    """rlrun's common algorithm config with ``name`` and the policy's default config as fields
    (RLlib's ``grad_clip`` default: none)."""
    own = {f.name for f in dataclasses.fields(AlgoConfig)}
    specs: dict[str, Any] = {"name": (str, dataclasses.field(default=name)),
                             "grad_clip": (float | None, dataclasses.field(default=None))}
    for rllib_key, value in defaults.items():
        key = field_name(rllib_key)
        if key in own or not (isinstance(value, bool | int | float | str) or value is None):
            specs[key] = (Any, dataclasses.field(default_factory=functools.partial(copy.deepcopy, value)))
        else:
            specs[key] = (type(value) if value is not None else Any, dataclasses.field(default=value))
    return dataclasses.make_dataclass(f"{name}Config", [(k, *v) for k, v in specs.items()], bases=(AlgoConfig,))


def build_trainer(name: str, default_policy: type[ClassicPolicy], default_config: Mapping[str, Any] | None = None,
                  **unsupported: Any) -> type[ClassicTrainer]:
    """RLlib's ``build_trainer(name=..., default_policy=...)``: registers ``algo.name: <name>`` (its
    default loss: the policy's) and returns a trainer class for it."""
    if unsupported:
        raise ConfigError(f"build_trainer({name!r}): {', '.join(sorted(unsupported))} not supported by rlrun; "
                          "supported: name, default_policy, default_config")
    if not (isinstance(default_policy, type) and issubclass(default_policy, ClassicPolicy)):
        raise ConfigError(f"build_trainer({name!r}): default_policy must be a class from rlrun.build_policy, "
                          f"got {default_policy!r}")
    defaults = {**default_policy.default_config, **(default_config or {})}
    _register(name, default_policy, defaults)
    return type(name, (ClassicTrainer,), {"algo_name": name, "policy_cls": default_policy, "defaults": defaults})


def _register(name: str, default_policy: type[ClassicPolicy], defaults: dict[str, Any]) -> None:
    def make_state(policy: Policy) -> LearnerState:
        if default_policy.optimizer_fn is not None:
            view = default_policy.view(policy)
            policy.optimizer = default_policy.optimizer_fn(view, view.config)
        return no_state(policy)

    register_algorithm(Algorithm(
        name=name, config_cls=_config_class(name, defaults), default_loss=default_policy.name,
        postprocess=default_policy.postprocess, make_state=make_state,
        description=f"built with build_trainer from policy {default_policy.name}",
    ), override=True)


class ClassicTrainer:
    """A trainer class from ``build_trainer``: ``Trainer(config={...}, env=...)``, ``train()`` per
    iteration, ``stop()``. Extra rlrun overrides (``tracking=mlflow``, ``plugins=[...]``) go in
    ``overrides``; without them nothing is recorded (RLlib's trainers record through Tune)."""

    algo_name: ClassVar[str]
    policy_cls: ClassVar[type[ClassicPolicy]]
    defaults: ClassVar[dict[str, Any]]

    @classmethod
    def register(cls) -> None:
        """The algorithm and its policy's loss registered in this process (a Ray actor that unpickled
        the class, e.g. a Tune trial: rlrun/app/tune_trainable.py)."""
        cls.policy_cls.register()
        _register(cls.algo_name, cls.policy_cls, cls.defaults)

    def __init__(self, config: Mapping[str, Any] | None = None, env: str | None = None,
                 overrides: list[str] | None = None) -> None:
        from rlrun.app.runner import make_trainer

        self.overrides = [*self.overrides_for(config, env), "tracking=none", *(overrides or [])]
        self.overrides = last_wins(self.overrides)
        self._trainer = make_trainer(self.overrides)
        self.iteration = 0

    @classmethod
    def overrides_for(cls, config: Mapping[str, Any] | None, env: str | None = None) -> list[str]:
        """rlrun's overrides for RLlib's ``config`` (and ``env``) of this trainer's algorithm."""
        config = dict(config or {})
        env = env if env is not None else config.pop("env", "CartPole-v1")
        config.pop("env", None)
        own = {f.name for f in dataclasses.fields(AlgoConfig)} - {"name", "optimizer"}
        policy_keys = cls.policy_cls.default_config
        # RLlib's keys (the policy's defaults for the common ones first), translated as a PG file's are
        rllib = {**{k: v for k, v in policy_keys.items() if k in own},
                 **{k: v for k, v in config.items() if k not in policy_keys or k in own}}
        tr = translate({"run": "PG", "env": env, "config": rllib}, cls.algo_name)
        extra = [f"++algo.{field_name(k)}={fmt(v)}" for k, v in config.items() if k in policy_keys and k not in own]
        groups = ("loss=", "tracking.experiment_name=")
        return last_wins([*(o for o in tr.overrides if not o.startswith(groups)), f"algo.name={cls.algo_name}",
                          "loss=custom", f"loss.name={cls.policy_cls.name}", *extra])

    def train(self) -> dict[str, Any]:
        """One training iteration: rlrun's metrics plus RLlib's names for the usual ones."""
        result: dict[str, Any] = dict(self._trainer.train())
        self.iteration += 1
        result.setdefault("training_iteration", self.iteration)
        for rllib_name, ours in (("episode_reward_mean", "rollout/episode_return_mean"),
                                 ("timesteps_total", "time/timesteps_total")):
            if ours in result:
                result[rllib_name] = result[ours]
        return result

    def get_policy(self) -> Policy:
        return self._trainer.policy

    def stop(self) -> None:
        self._trainer.stop()
