"""RLlib's classic functional policy API: ``build_policy`` (RLlib's ``build_torch_policy`` and
``build_tf_policy``) turns a loss written the RLlib way into an rlrun loss and algorithm.

What a classic function is handed, and what rlrun hands it instead:

- ``loss_fn(policy, model, dist_class, train_batch)``: ``model(input_dict)`` returns
  ``(dist_inputs, state)`` and ``model.value_function()`` the values of that call (``ModelView``
  over rlrun's model); ``dist_class(logits)`` or ``dist_class(logits, model)``; ``train_batch`` maps
  column names to torch tensors. It may return a scalar tensor (RLlib's way) or a ``LossOutput``.
- ``postprocess_fn(policy, sample_batch, other_agent_batches=None, episode=None)``: one
  trajectory piece (one sub-env's rows of one episode within a fragment, 1-D, time order), as RLlib
  hands it; columns it adds or changes go back into the fragment.
- ``stats_fn(policy, train_batch)``: a dict of numbers, logged as ``train/<name>``.
- ``optimizer_fn(policy, config)``: the torch optimizer over ``policy.model.parameters()``.
- ``policy.config`` is a dict (``policy.config["gamma"]``): the algorithm's settings over
  ``get_default_config()``'s.

``build_trainer`` (``rlrun.app.rllib``) makes the algorithm runnable from Python; once the module
that builds them is imported (``plugins: [my_module]``), both are selectable from YAML:
``algo.name: <trainer name>``, ``loss.name: <policy name>``.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from rlrun.core.errors import PluginError
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.columns import map_column
from rlrun.data.postprocessing import fragment_ends
from rlrun.models.distributions import ActionDistribution
from rlrun.policy.policy import LossOutput, Policy, TorchBatch

VALID = "valid"  # the row mask of a worker's time-major fragment (sources/worker_base.py)


class ModelView:
    """rlrun's model as RLlib's classic losses call theirs: ``model(input_dict) -> (dist_inputs,
    state)``, ``model.from_batch(train_batch)``, ``model.value_function()``; anything else is the
    model's own (``parameters()``, submodules)."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._values: torch.Tensor | None = None

    def __call__(self, input_dict: Any, state: list[Any] | None = None,
                 seq_lens: Any = None) -> tuple[torch.Tensor, list[Any]]:
        obs = input_dict[SB.OBS] if isinstance(input_dict, Mapping) and SB.OBS in input_dict else input_dict
        out = self._model(obs)
        self._values = out.values
        return out.dist_inputs, list(state or [])

    def from_batch(self, train_batch: Mapping[str, Any], is_training: bool = True) -> tuple[torch.Tensor, list[Any]]:
        return self(train_batch)

    def value_function(self) -> torch.Tensor:
        if self._values is None:
            raise RuntimeError("model.value_function() is the values of the last model(input_dict) call; "
                               "call the model first")
        return self._values

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


# a policy's config key that is a Python keyword (RLlib's "lambda") is the config field "<key>_"
_KEYWORD_FIELDS = {f"{k}_": k for k in keyword.kwlist}


def field_name(key: str) -> str:
    """The algo config field for a policy's config key (``lambda`` -> ``lambda_``)."""
    return f"{key}_" if keyword.iskeyword(key) else key


class PolicyView:
    """The Policy as a classic function sees it: ``config`` is a dict; everything else is the Policy's."""

    def __init__(self, policy: Policy, defaults: Mapping[str, Any]) -> None:
        self._policy = policy
        own = {_KEYWORD_FIELDS.get(k, k): v for k, v in dataclasses.asdict(policy.config).items()}
        self.config = {**defaults, **own}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


def _dist_factory(dist_class: type[ActionDistribution]) -> Callable[..., ActionDistribution]:
    def make(inputs: torch.Tensor, model: Any = None) -> ActionDistribution:  # RLlib's dist_class(inputs, model)
        return dist_class(inputs)

    return make


class ClassicPolicy:
    """What ``build_policy`` returns: a class naming a registered loss, holding the classic functions."""

    name: ClassVar[str]
    loss_fn: ClassVar[Callable[..., Any]]
    postprocess_fn: ClassVar[Callable[..., Any] | None]
    stats_fn: ClassVar[Callable[..., Mapping[str, Any]] | None]
    optimizer_fn: ClassVar[Callable[..., torch.optim.Optimizer] | None]
    default_config: ClassVar[dict[str, Any]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"{type(self).__name__} is a policy template: run it with build_trainer(default_policy="
                        f"{type(self).__name__}), or select its loss in YAML (loss.name: {self.name})")

    @classmethod
    def register(cls) -> None:
        """Its loss as ``loss.name: <name>`` in this process (also a Ray actor that unpickled the class)."""
        LOSSES.add(cls.name, cls.loss, requires=(SB.OBS, SB.ACTIONS, SB.REWARDS), override=True)

    @classmethod
    def view(cls, policy: Policy) -> PolicyView:
        return PolicyView(policy, cls.default_config)

    @classmethod
    def postprocess(cls, policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
        """rlrun's postprocess hook (a time-major ``[T, B]`` fragment) running ``postprocess_fn`` on
        every trajectory piece of it, as RLlib hands them."""
        fn = cls.postprocess_fn
        if fn is None:
            return fragment
        view = cls.view(policy)
        steps, envs = fragment[SB.REWARDS].shape[:2]
        valid = fragment[VALID] if VALID in fragment else np.ones((steps, envs), dtype=bool)
        ends = fragment_ends(fragment)
        written: dict[str, np.ndarray] = {}
        for b in range(envs):
            rows = np.flatnonzero(valid[:, b])
            if not len(rows):
                continue
            cuts = np.flatnonzero(ends[rows, b]) + 1
            for piece_rows in np.split(rows, cuts[cuts < len(rows)]):
                piece = SB({k: map_column(lambda a, r=piece_rows, e=b: a[r, e], v)
                            for k, v in fragment.items() if k != VALID})
                out = fn(view, piece, None, None)
                for k, v in out.items():  # every column back: the piece's are copies a function may change
                    if isinstance(v, np.ndarray):
                        col = written.setdefault(k, np.zeros((steps, envs, *v.shape[1:]), dtype=v.dtype))
                        col[piece_rows, b] = v
        for k, col in written.items():
            fragment[k] = col
        return fragment

    @classmethod
    def loss(cls, policy: Policy, model: nn.Module, dist_class: type[ActionDistribution],
             batch: TorchBatch) -> LossOutput:
        """rlrun's loss: the classic ``loss_fn`` on RLlib's views, its ``stats_fn`` as stats."""
        view = cls.view(policy)
        out = cls.loss_fn(view, ModelView(model), _dist_factory(dist_class), batch)
        if isinstance(out, list | tuple) and not isinstance(out, LossOutput):
            if len(out) != 1:
                raise PluginError(f"loss_fn of policy '{cls.name}' returned {len(out)} losses (one per optimizer); "
                                  "rlrun trains one optimizer per policy: return their sum")
            out = out[0]
        stats = {k: v for k, v in (cls.stats_fn(view, batch) if cls.stats_fn else {}).items()}
        if isinstance(out, LossOutput):
            return LossOutput(out.total, out.terms, {**out.stats, **stats})
        return LossOutput(out, {}, stats)


def build_policy(name: str, loss_fn: Callable[..., Any], *, postprocess_fn: Callable[..., Any] | None = None,
                 stats_fn: Callable[..., Mapping[str, Any]] | None = None,
                 optimizer_fn: Callable[..., torch.optim.Optimizer] | None = None,
                 get_default_config: Callable[[], Mapping[str, Any]] | None = None,
                 framework: str = "torch", **unsupported: Any) -> type[ClassicPolicy]:
    """RLlib's ``build_torch_policy(name=..., loss_fn=...)``: a policy class whose loss is registered
    as ``loss.name: <name>`` (``requires`` obs, actions, rewards); ``build_trainer`` runs it."""
    if unsupported:
        raise PluginError(f"build_policy({name!r}): {', '.join(sorted(unsupported))} not supported by rlrun; "
                          "supported: loss_fn, postprocess_fn, stats_fn, optimizer_fn, get_default_config")
    cls: type[ClassicPolicy] = type(name, (ClassicPolicy,), {
        "name": name, "loss_fn": staticmethod(loss_fn),
        "postprocess_fn": staticmethod(postprocess_fn) if postprocess_fn else None,
        "stats_fn": staticmethod(stats_fn) if stats_fn else None,
        "optimizer_fn": staticmethod(optimizer_fn) if optimizer_fn else None,
        "default_config": dict(get_default_config() if get_default_config else {}),
    })
    cls.register()
    return cls


build_torch_policy = build_policy  # RLlib's names; with torch in place of TensorFlow both build a torch policy
build_tf_policy = build_policy
