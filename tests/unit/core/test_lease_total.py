"""`Lease.total`: the sum of its grants' resources, whatever their number (one grant: that grant's)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.core.model import Grant, Lease, Request
from gpupool.hardware.units import Resources

_res = st.builds(Resources, st.integers(0, 1 << 20), st.integers(0, 1000))


@given(st.lists(_res, max_size=8))
def test_total_is_the_sum_of_the_grants(amounts: list[Resources]) -> None:
    req = Request(id="r", tenant="t", priority=0, demand=Resources(1, 0), ttl_s=1.0)
    grants = tuple(Grant(f"s{i}", f"g{i}", r) for i, r in enumerate(amounts))
    lease = Lease(id="l", request=req, node="n", grants=grants, granted_at=0.0, expires_at=1.0)
    vram = sum(r.vram_mib for r in amounts)
    compute = sum(r.compute_milli for r in amounts)
    assert lease.total == Resources(vram, compute)
    assert type(lease.total.vram_mib) is int and type(lease.total.compute_milli) is int
