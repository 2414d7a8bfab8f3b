"""RLlib's module names mapped onto rlrun, so RLlib's own unit tests for its classic SampleBatch and
MultiAgentBatch run against rlrun's batches unmodified.

Loaded as a pytest plugin (``pytest -p rllib_names``, with ``tests/`` on ``sys.path``) by
``experiments/rllib_compat/run_rllib_tests.py``. It installs stand-in modules under RLlib's names:

- ``ray.rllib.policy.sample_batch`` -> ``rlrun.data.batch`` (the classes under test);
- ``ray.rllib.utils.test_utils`` -> ``check`` and ``check_same_batch``, written here with the
  meaning RLlib's tests give them (nested equality of dicts, lists, arrays and batches);
- ``ray.init``/``ray.shutdown`` -> no-ops: the tests start Ray in ``setUpClass`` but use nothing of it,
  and rlrun's batches need no Ray;
- names of RLlib internals rlrun does not have (observation compression, ``RepeatedValues``, torch
  conversion helpers) -> stand-ins that raise ``NotImplementedError`` naming the internal, so the
  test files import and only the tests of those internals fail.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

import rlrun.data.batch as rlrun_batch

BATCH_NAMES = ("SampleBatch", "MultiAgentBatch", "concat_samples", "attempt_count_timesteps", "DEFAULT_POLICY_ID")


def _missing(what: str) -> Any:
    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{what}: an RLlib internal rlrun does not have")

    return stand_in


def check(x: Any, y: Any, decimals: int = 5, atol: float | None = None, rtol: float | None = None,
          false: bool = False) -> None:
    """``x`` equals ``y`` (nested dicts, lists, tuples, arrays, tensors, scalars); ``false=True``: they differ."""
    try:
        _equal(x, y, decimals, atol, rtol)
    except AssertionError:
        if false:
            return
        raise
    if false:
        raise AssertionError(f"expected a difference, both are {x!r}")


def _equal(x: Any, y: Any, decimals: int, atol: float | None, rtol: float | None) -> None:
    if isinstance(x, Mapping) or isinstance(y, Mapping):
        assert isinstance(x, Mapping) and isinstance(y, Mapping), f"{type(x)} vs {type(y)}"
        assert set(x.keys()) == set(y.keys()), f"keys {sorted(x.keys())} vs {sorted(y.keys())}"
        for k in x:
            _equal(x[k], y[k], decimals, atol, rtol)
        return
    if isinstance(x, list | tuple) and isinstance(y, list | tuple) and not _numeric(x):
        assert len(x) == len(y), f"lengths {len(x)} vs {len(y)}"
        for a, b in zip(x, y, strict=True):
            _equal(a, b, decimals, atol, rtol)
        return
    a, b = _array(x), _array(y)
    if a.dtype == object or b.dtype == object:
        assert a.shape == b.shape and all(p == q for p, q in zip(a.ravel(), b.ravel(), strict=True)), f"{x!r} vs {y!r}"
    elif atol is not None or rtol is not None:
        np.testing.assert_allclose(a, b, atol=atol or 0, rtol=rtol or 1e-7)
    else:
        np.testing.assert_almost_equal(a, b, decimal=decimals)


def _numeric(v: Any) -> bool:
    return all(isinstance(e, int | float | bool | np.number | list) for e in v)


def _array(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.asarray(v)


def check_same_batch(a: Any, b: Any) -> None:
    """Two batches of the same type hold the same columns and values (``unroll_id`` is compared only
    where both have it); MultiAgentBatches also the same policies and env-step count."""
    assert type(a) is type(b), f"{type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, rlrun_batch.MultiAgentBatch):
        assert a.count == b.count, f"env steps {a.count} vs {b.count}"
        ids_a, ids_b = sorted(a.policy_batches), sorted(b.policy_batches)
        assert ids_a == ids_b, f"policies {ids_a} vs {ids_b}"
        for pid in a.policy_batches:
            check_same_batch(a.policy_batches[pid], b.policy_batches[pid])
        return
    keys = set(a.keys()) | set(b.keys())
    both_unroll = "unroll_id" in a and "unroll_id" in b
    for k in keys - ({"unroll_id"} if not both_unroll else set()):
        assert k in a and k in b, f"column {k!r} in one batch only"
        check(a[k], b[k])


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = []  # every name here may be a package
    return mod


def install() -> None:
    """Put the stand-in modules into ``sys.modules`` under RLlib's names."""
    import torch

    # a name rlrun lacks gets a stand-in that raises, so the test file imports and only its users fail
    batch_names = {n: getattr(rlrun_batch, n, None) or _missing(n) for n in BATCH_NAMES}
    modules = {
        "ray": _module("ray", init=lambda *a, **k: None, shutdown=lambda *a, **k: None),
        "ray.rllib": _module("ray.rllib"),
        "ray.rllib.policy": _module("ray.rllib.policy"),
        "ray.rllib.policy.sample_batch": _module("ray.rllib.policy.sample_batch", **batch_names),
        "ray.rllib.utils": _module("ray.rllib.utils"),
        "ray.rllib.utils.test_utils": _module("ray.rllib.utils.test_utils", check=check,
                                              check_same_batch=check_same_batch),
        "ray.rllib.utils.compression": _module("ray.rllib.utils.compression",
                                               is_compressed=_missing("ray.rllib.utils.compression")),
        "ray.rllib.utils.framework": _module("ray.rllib.utils.framework",
                                             try_import_torch=lambda: (torch, torch.nn)),
        "ray.rllib.utils.torch_utils": _module("ray.rllib.utils.torch_utils",
                                               convert_to_torch_tensor=_missing("convert_to_torch_tensor")),
        "ray.rllib.models": _module("ray.rllib.models"),
        "ray.rllib.models.repeated_values": _module("ray.rllib.models.repeated_values",
                                                    RepeatedValues=_missing("RepeatedValues")),
    }
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, mod)
    sys.modules.update(modules)


def pytest_configure(config: Any) -> None:
    install()
