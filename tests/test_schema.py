"""rlrun.config.typed: plain data -> dataclasses with one clear error per mistake."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from rlrun.config.typed import ConfigError, from_dict, to_dict


@dataclass
class Inner:
    k: int = 1


@dataclass
class Outer:
    a: float = 0.5
    n: int | Literal["auto"] = 3
    mode: Literal["x", "y"] = "x"
    opt: str | None = None
    xs: list[list[float]] = field(default_factory=list)
    kw: dict[str, int] = field(default_factory=dict)
    flag: bool = False
    inner: Inner = field(default_factory=Inner)


def test_round_trip_and_coercion():
    o = from_dict(Outer, {"a": 2, "n": "auto", "xs": [[0, 1.5]], "kw": {"q": 3}, "inner": {"k": 4}}, "sec")
    assert o.a == 2.0 and isinstance(o.a, float) and o.n == "auto" and o.inner == Inner(4)
    assert to_dict(o)["inner"] == {"k": 4}


@pytest.mark.parametrize(("data", "message"), [
    ({"aa": 1}, "sec.aa: unknown key (did you mean 'a'?)"),
    ({"a": "fast"}, "sec.a: expected a number, got 'fast' (str)"),
    ({"a": True}, "sec.a: expected a number, got True (bool)"),
    ({"n": 2.5}, "sec.n: 2.5 (float) matches none of"),
    ({"mode": "z"}, "sec.mode: 'z' is not one of 'x', 'y'"),
    ({"flag": 1}, "sec.flag: expected true or false, got 1 (int)"),
    ({"xs": [[0, "a"]]}, "sec.xs[0][1]: expected a number"),
    ({"kw": {"q": "3"}}, "sec.kw.q: expected an integer, got '3' (str)"),
    ({"inner": {"k": 1.0}}, "sec.inner.k: expected an integer, got 1.0 (float)"),
    ([1, 2], "sec: expected a mapping of options, got [1, 2] (list)"),
])
def test_each_mistake_names_the_key_and_the_value(data, message):
    with pytest.raises(ConfigError) as e:
        from_dict(Outer, data, "sec")
    assert str(e.value).startswith(message), str(e.value)
