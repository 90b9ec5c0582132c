"""`gpupool.adapters.fastjson`: the same JSON values as the standard library, whichever encoder ran."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.adapters import fastjson
from gpupool.core.model import Grant, Lease, LeaseState, Request, Resources
from gpupool.core.ports import (
    TicketRecord,
    decode_lease,
    decode_ticket,
    encode_lease,
    encode_ticket,
    lease_to_dict,
)
from gpupool.hardware.slices import SliceKind

NAMES = st.text(min_size=1, max_size=12)
LEASES = st.builds(
    lambda lid, tenant, label, vram, t0, ttl, ended: Lease(
        id=lid,
        request=Request(
            id="r-" + lid,
            tenant=tenant,
            priority=1,
            demand=Resources(vram, 100),
            ttl_s=ttl,
            labels=((label, tenant),),
        ),
        node="n0",
        grants=(Grant("n0/0/whole", "n0/0", Resources(vram, 100)),),
        granted_at=t0,
        expires_at=t0 + ttl,
        state=LeaseState.RELEASED if ended else LeaseState.ACTIVE,
        ended_at=t0 + 1.5 if ended else None,
        reason="released by holder ✓" if ended else "",
    ),
    NAMES,
    NAMES,
    NAMES,
    st.integers(1, 2**20),
    st.floats(0, 2e9, allow_nan=False),
    st.floats(1, 86_400, allow_nan=False),
    st.booleans(),
)


@given(LEASES)
def test_lease_record_decodes_to_the_same_lease_as_the_core_encoder(lease: Lease) -> None:
    fast = fastjson.lease_record(lease)
    assert json.loads(fast) == json.loads(encode_lease(lease))
    assert decode_lease(fast.decode()) == lease
    keys = list(json.loads(fast))
    assert keys == sorted(keys)  # stored records keep their keys sorted


def test_ticket_record_decodes_to_the_same_ticket() -> None:
    req = Request(id="r-1", tenant="acme", priority=2, demand=Resources(4096, 250), ttl_s=60.0)
    t = TicketRecord(
        ticket="t-1", state="granted", request=req, enqueued_at=1.0, deadline_at=2.0, lease_id="l-1"
    )
    assert json.loads(fastjson.ticket_record(t)) == json.loads(encode_ticket(t))
    assert decode_ticket(fastjson.ticket_record(t).decode()) == t


@pytest.mark.parametrize(
    "value",
    [
        {"big": 2**70},  # beyond 64 bits: orjson refuses, the standard library encodes it
        {1: "int key"},  # a non-string key: the standard library writes it as "1"
        {"text": "gpu ✓ \u00e9", "nested": [1, 2.5, None, True, {"b": 1, "a": 2}]},
    ],
)
def test_dumps_matches_the_standard_library_value(value: object) -> None:
    expected = json.loads(json.dumps(value, sort_keys=True))
    assert json.loads(fastjson.dumps(value, sort_keys=True)) == expected
    assert b" " not in fastjson.dumps({"a": [1, 2]})  # compact, as the gateway's answers were


def test_the_standard_library_fallback_gives_the_same_bytes_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastjson, "_fast_dumps", None)
    out = fastjson.dumps({"b": 1, "a": "é"}, sort_keys=True)
    assert out == '{"a":"é","b":1}'.encode()
    with pytest.raises(ValueError, match="Out of range float"):
        fastjson.dumps({"x": float("nan")})  # refused, as starlette's JSONResponse refused it


_TEXT = st.text(max_size=8)
_GRANTS = st.lists(
    st.builds(
        Grant,
        _TEXT,
        _TEXT,
        st.builds(Resources, st.integers(0, 2**70), st.integers(0, 1000)),  # (2**70: orjson refuses)
    ),
    max_size=3,
)
RICH_LEASES = st.builds(
    lambda lid, req, grants, t0, state, rev, ended_at, reason: Lease(
        id=lid,
        request=req,
        node="n0",
        grants=tuple(grants),
        granted_at=t0,
        expires_at=t0 + 60.0,
        state=state,
        revision=rev,
        ended_at=ended_at,
        reason=reason,
    ),
    _TEXT,
    st.builds(
        Request,
        id=_TEXT,
        tenant=_TEXT,
        priority=st.integers(-100, 100),
        demand=st.builds(Resources, st.integers(1, 2**20), st.integers(0, 1000)),
        ttl_s=st.floats(1e-3, 1e6, allow_nan=False),
        kinds=st.frozensets(st.sampled_from(list(SliceKind))),
        preemptible=st.one_of(st.none(), st.booleans()),
        gpu_count=st.integers(1, 8),
        nodes=st.frozensets(_TEXT, max_size=3),
        model=_TEXT,
        labels=st.lists(st.tuples(_TEXT, _TEXT), max_size=3).map(tuple),
    ),
    _GRANTS,
    st.floats(0, 2e9, allow_nan=False),
    st.sampled_from(list(LeaseState)),
    st.integers(1, 2**40),
    st.one_of(st.none(), st.floats(0, 2e9, allow_nan=False)),
    _TEXT,
)


@given(RICH_LEASES)
def test_lease_record_writes_the_bytes_of_the_sorted_core_dictionary(lease: Lease) -> None:
    """`lease_record` builds its object with the keys already sorted: the same bytes as encoding
    `lease_to_dict` with sorted keys, whichever encoder ran (big numbers fall back to the standard
    library), and the same value as the core's own encoder."""
    sorted_dict = fastjson.dumps(lease_to_dict(lease), sort_keys=True)
    assert fastjson.lease_record(lease) == sorted_dict
    assert json.loads(fastjson.lease_record(lease)) == json.loads(encode_lease(lease))
