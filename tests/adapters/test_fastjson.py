"""`gpupool.adapters.fastjson`: the same JSON values as the standard library, whichever encoder ran."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.adapters import fastjson
from gpupool.core.model import Grant, Lease, LeaseState, Request, Resources
from gpupool.core.ports import TicketRecord, decode_lease, decode_ticket, encode_lease, encode_ticket

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
