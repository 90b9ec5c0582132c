"""AdmissionQueue: band order, deficit round robin per tenant, head-of-line blocking by competition,
the P2 minimum share, deadlines and bounds."""

from __future__ import annotations

import pytest

from gpupool.core import P0, P1, P2, InvalidInput
from gpupool.core.admission import AdmissionConfig, AdmissionQueue, Ticketed, Verdict
from tests.builders import a_request


def item(
    q: AdmissionQueue,
    t: str,
    *,
    prio: int = P1,
    tenant: str = "a",
    gib: float = 1,
    keys: tuple[str, ...] = ("mig",),
    deadline: float = 100.0,
) -> Ticketed:
    return Ticketed(
        ticket=t,
        request=a_request(t, vram_gib=gib, priority=prio, tenant=tenant),
        enqueued_at=0.0,
        deadline_at=deadline,
        seq=q.next_seq(),
        keys=frozenset(keys),
    )


def grant_all(_: Ticketed) -> Verdict:
    return Verdict.GRANTED


def test_bands_highest_first_fifo_inside_a_tenant() -> None:
    q = AdmissionQueue()
    for t, p in (("p2", P2), ("p1a", P1), ("p0", P0), ("p1b", P1)):
        assert q.push(item(q, t, prio=p))
    assert [x.ticket for x in q] == ["p0", "p1a", "p1b", "p2"]
    assert [x.ticket for x in q.drain(grant_all)] == ["p0", "p1a", "p1b", "p2"]
    assert len(q) == 0 and q.depth_by_band() == {"P0": 0, "P1": 0, "P2": 0}


def test_deficit_round_robin_shares_by_vram_between_tenants() -> None:
    # tenant a: four 8 GiB requests; tenant b: eight 4 GiB. Quantum 8 GiB: per round a gets one, b two.
    q = AdmissionQueue(AdmissionConfig(quantum_mib=8192))
    for i in range(4):
        q.push(item(q, f"a{i}", tenant="a", gib=8))
    for i in range(8):
        q.push(item(q, f"b{i}", tenant="b", gib=4))
    order = [x.ticket for x in q.drain(grant_all)]
    assert order[:6] == ["a0", "b0", "b1", "a1", "b2", "b3"]
    assert sorted(order) == sorted([f"a{i}" for i in range(4)] + [f"b{i}" for i in range(8)])


def test_blocked_head_blocks_competing_lower_bands_only() -> None:
    q = AdmissionQueue(AdmissionConfig(p2_min_share=0.0))
    q.push(item(q, "big-p1", prio=P1, gib=40, keys=("mig",)))
    q.push(item(q, "p2-mig", prio=P2, keys=("mig",)))
    q.push(item(q, "p2-mps", prio=P2, keys=("mps",)))

    def verdict(x: Ticketed) -> Verdict:
        return Verdict.BLOCKED if x.ticket == "big-p1" else Verdict.GRANTED

    # p2-mig competes with the blocked P1 head and waits (and blocks its own band: HOL inside a band).
    assert [x.ticket for x in q.drain(verdict)] == []
    q.remove("p2-mig")
    assert [x.ticket for x in q.drain(verdict)] == ["p2-mps"]
    assert q.must_wait(P2, frozenset({"mig"})) and not q.must_wait(P2, frozenset({"mps"}))
    assert q.must_wait(P1, frozenset({"mig"})) and not q.must_wait(P0, frozenset({"mig"}))


def test_minimum_share_lets_batch_trickle_past_a_blocked_online_head() -> None:
    q = AdmissionQueue(AdmissionConfig(p2_min_share=0.25, share_window=8))
    for _ in range(8):
        q.record_grant(P1)  # the window is full of online grants
    q.push(item(q, "stuck", prio=P1, gib=70))
    for i in range(4):
        q.push(item(q, f"b{i}", prio=P2))

    def verdict(x: Ticketed) -> Verdict:
        return Verdict.BLOCKED if x.ticket == "stuck" else Verdict.GRANTED

    # share 0/8 < 25 %: b0 passes (1/8), b1 passes (2/8), then 2/8 is not < 2: the rest wait.
    assert [x.ticket for x in q.drain(verdict)] == ["b0", "b1"]
    assert not q.share_ok()
    for _ in range(6):
        q.record_grant(P0)
    assert not q.share_ok()  # b0 and b1 are still in the window of 8
    q.record_grant(P0)
    assert q.share_ok()
    assert [x.ticket for x in q.drain(verdict)] == ["b2", "b3"]  # b1 rolled out: 1/8, then 1/8


def test_deadlines_bounds_and_removal() -> None:
    q = AdmissionQueue(AdmissionConfig(max_per_band=2, max_total=3))
    assert q.push(item(q, "x", deadline=5.0))
    assert q.push(item(q, "y", deadline=1.0))
    assert not q.push(item(q, "z"))  # band full
    assert q.push(item(q, "w", prio=P2))
    assert not q.push(item(q, "v", prio=P0))  # queue full
    assert [x.ticket for x in q.expire(4.0)] == ["y"]
    assert q.remove("x") is not None and q.remove("x") is None
    assert [x.ticket for x in q] == ["w"]
    with pytest.raises(InvalidInput):
        q.push(item(q, "w", prio=P2))


def test_dropped_items_leave_and_drain_goes_on() -> None:
    q = AdmissionQueue()
    q.push(item(q, "bad"))
    q.push(item(q, "good"))
    out = q.drain(lambda x: Verdict.DROPPED if x.ticket == "bad" else Verdict.GRANTED)
    assert [x.ticket for x in out] == ["good"] and len(q) == 0


def test_config_validation_names_the_field() -> None:
    with pytest.raises(InvalidInput, match="p2_min_share"):
        AdmissionConfig(p2_min_share=2.0)
    with pytest.raises(InvalidInput, match="quantum_mib"):
        AdmissionConfig(quantum_mib=0)
