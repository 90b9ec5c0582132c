"""Core error messages name the field and the value as JSON (what clients and config files send),
abridged when the value is large; a value JSON cannot hold is shown as its repr."""

from __future__ import annotations

import enum
import json
import math

from gpupool.core.errors import InvalidInput, UnknownId, show_value


class Color(enum.Enum):
    RED = "red"


def test_short_values_read_as_json() -> None:
    for v in ("gpu-a", 12, 1.5, None, True, False, ["a", "b"], {"k": [1, 2]}, "é"):
        assert show_value(v) == json.dumps(v, ensure_ascii=False)
    assert show_value(("x",)) == '["x"]' and show_value({"b", "a"}) == '["a", "b"]'
    assert show_value(Color.RED) == '"red"' and show_value({1: None}) == '{"1": null}'
    assert show_value(math.nan) == "NaN" and show_value("\udc80") == '"\\udc80"'  # stays UTF-8
    assert show_value(b"x") == "b'x'"  # not JSON: its repr
    assert str(InvalidInput("nodes", ["n1"], "no such node")) == 'invalid nodes=["n1"]: no such node'
    assert str(InvalidInput("priority", True, "bad")) == "invalid priority=true: bad"
    assert str(UnknownId("lease", "x")) == 'unknown lease "x"'


def test_large_values_are_abridged_at_a_bounded_length() -> None:
    err = InvalidInput("name", "n" * 1_000_000, "too long")
    assert len(str(err)) < 300 and str(err).startswith('invalid name="nnn') and '..."' in str(err)
    many = str(InvalidInput("nodes", [f"node-{i}" for i in range(10_000)], "no such node"))
    assert len(many) < 500 and '"node-0"' in many and "..." in many
    deep: list[object] = []
    for _ in range(1000):
        deep = [deep]
    assert len(str(InvalidInput("x", deep, "deep"))) < 100
    assert len(str(UnknownId("lease", "l" * 100_000))) < 300
    assert len(show_value(10**4000)) < 100  # digits bounded (and no int-to-str limit error)
