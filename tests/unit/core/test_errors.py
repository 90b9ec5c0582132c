"""Core error messages name the field and the value, abridged when the value is large."""

from __future__ import annotations

from gpupool.core.errors import InvalidInput, UnknownId, show_value


def test_short_values_read_as_their_repr() -> None:
    for v in ("gpu-a", 12, 1.5, None, ["a", "b"], {"k": [1, 2]}, ("x",)):
        assert show_value(v) == repr(v)
    assert str(InvalidInput("nodes", ["n1"], "no such node")) == "invalid nodes=['n1']: no such node"


def test_large_values_are_abridged_at_a_bounded_length() -> None:
    err = InvalidInput("name", "n" * 1_000_000, "too long")
    assert len(str(err)) < 300 and "..." in str(err) and str(err).startswith("invalid name='nnn")
    many = str(InvalidInput("nodes", [f"node-{i}" for i in range(10_000)], "no such node"))
    assert len(many) < 500 and "'node-0'" in many and "..." in many
    deep: list[object] = []
    for _ in range(1000):
        deep = [deep]
    assert len(str(InvalidInput("x", deep, "deep"))) < 100
    assert len(str(UnknownId("lease", "l" * 100_000))) < 300
