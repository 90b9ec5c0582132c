"""Deeply nested JSON: a 400 naming the problem on every extender verb, and the bound is exact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.adapters.k8s.k8s_helpers import Client, fixture_json, make_pool

from gpupool.adapters.k8s import boundedjson
from gpupool.adapters.k8s.extender import Extender, ExtenderServer

VERBS = ("filter", "prioritize", "bind", "preempt")


@pytest.fixture(scope="module")
def extender_http() -> Iterator[Client]:
    """One extender without a Kubernetes API for all examples (bind then only commits leases)."""
    server = ExtenderServer(Extender(make_pool())).start()
    client = Client(server)
    yield client
    client.close()
    server.stop()


def _nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b'{"Pod": ' + b"[" * depth + b"]" * depth + b"}"
    return b'{"Pod": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("kind", ["list", "object"])
def test_1000_levels_of_nesting_is_a_400_on_every_verb(extender: Any, verb: str, kind: str) -> None:
    ext, _, client = extender
    before = ext.state()
    status, body = client.raw(verb, _nested(1000, kind))
    assert status == 400, body
    assert "nested deeper than 100 levels" in body["Error"]
    # the connection and the server keep working, nothing changed
    status, _ = client.raw(verb, json.dumps(fixture_json("filter_nodenames.json")).encode())
    assert status == 200
    assert ext.state()["pods"] == before["pods"]


def test_nesting_at_the_limit_is_decoded(extender: Any) -> None:
    _, _, client = extender
    status, body = client.raw("prioritize", _nested(boundedjson.MAX_DEPTH - 1, "object"))
    assert status == 200, body


def _depth(doc: Any) -> int:
    if isinstance(doc, dict):
        return 1 + max((_depth(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((_depth(v) for v in doc), default=0)
    return 0


_scalars = st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n\u00e9', max_size=6)
_docs = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(doc=_docs, limit=st.integers(0, 8), ascii_only=st.booleans())
def test_the_bound_is_exact_and_strings_do_not_count(doc: Any, limit: int, ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode()
    assert boundedjson.nesting_exceeds(raw, limit) == (_depth(doc) > limit)
    if _depth(doc) <= limit:
        assert boundedjson.loads(raw, limit) == doc
    else:
        with pytest.raises(boundedjson.JsonDepthError):
            boundedjson.loads(raw, limit)


@pytest.mark.parametrize("raw", [b"[" * 5000, b"{" * 5000, b'[{"a":' * 3000, b"[" * 200 + b"}" * 200])
def test_unbalanced_deep_input_is_refused_before_decoding(raw: bytes) -> None:
    with pytest.raises(boundedjson.JsonDepthError):
        boundedjson.loads(raw)


_values = st.recursive(
    _scalars | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "containers",
                    "initContainers",
                    "resources",
                    "limits",
                    "name",
                    "uid",
                    "items",
                    "Pods",
                    "NumPDBViolations",
                ]
            ),
            inner,
            max_size=3,
        )
    ),
    max_leaves=20,
)
_args = st.dictionaries(
    st.sampled_from(
        ["Pod", "Nodes", "NodeNames", "NodeNameToVictims", "NodeNameToMetaVictims", "PodName",
         "PodNamespace", "PodUID", "Node"]
    ),
    _values,
    max_size=5,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(verb=st.sampled_from(VERBS), args=_args)
def test_no_json_object_is_a_5xx_on_any_verb(extender_http: Any, verb: str, args: dict[str, Any]) -> None:
    status, body = extender_http.raw(verb, json.dumps(args).encode())
    assert status == 200, body


def _pod(limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-odd"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], **spec},
    }


_VRAM = {"gpupool.io/vram-mib": "1000"}
_N = {"NodeNames": ["gpu-a"]}


@pytest.mark.parametrize(
    ("verb", "args", "fragment"),
    [
        ("filter", {"Pod": _pod({"gpupool.io/vram-mib": "²"}), **_N}, 'vram-mib]="²"'),
        ("filter", {"Pod": _pod({"gpupool.io/vram-mib": "１２"}), **_N}, 'vram-mib]="１２"'),
        ("filter", {"Pod": _pod(_VRAM, initContainers=5), **_N}, 'initContainers="int"'),
        ("prioritize", {"Pod": _pod(_VRAM, initContainers=5), **_N}, None),
        ("filter", {"Pod": _pod(_VRAM), "Nodes": {"items": [{"metadata": 5}]}}, "items[0].metadata.name"),
        ("preempt", {"Pod": _pod({}), "NodeNameToMetaVictims": {"gpu-a": {"Pods": 5}}}, None),
        ("preempt", {"Pod": _pod({}), "NodeNameToMetaVictims": {"gpu-a": {"Pods": [{"metadata": 5}]}}}, None),
        ("preempt", {"Pod": _pod({}), "NodeNameToVictims": {"gpu-a": {"NumPDBViolations": "x"}}}, None),
    ],
)
def test_odd_field_types_are_answered_not_a_500(
    extender_http: Any, verb: str, args: dict[str, Any], fragment: str | None
) -> None:
    """Each of these was an HTTP 500 (a TypeError, AttributeError or ValueError in the verb)."""
    status, body = extender_http.raw(verb, json.dumps(args).encode())
    assert status == 200, body
    if fragment is not None:
        assert fragment in body["Error"]
    if verb == "preempt":
        for victims in body["NodeNameToMetaVictims"].values():
            assert isinstance(victims["Pods"], list) and isinstance(victims["NumPDBViolations"], int)


def test_an_error_about_a_huge_value_stays_short(extender_http: Any) -> None:
    """A multi-megabyte quantity string is named in the Error, abridged: the answer does not echo it."""
    huge = "9" * 2_000_000 + "x"
    status, body = extender_http.raw(
        "filter", json.dumps({"Pod": _pod({"gpupool.io/vram-mib": huge}), **_N}).encode()
    )
    assert status == 200 and 'vram-mib]="9999' in body["Error"] and "..." in body["Error"], body["Error"][
        :300
    ]
    assert len(body["Error"]) < 2_000
