"""AdmissionQueue: band order, deficit round robin per tenant, per-item holds instead of head-of-line
blocking, the P2 minimum share, deadlines and bounds."""

from __future__ import annotations

import pytest

from gpupool.core import P0, P1, P2, InvalidInput
from gpupool.core.admission import NOTHING, AdmissionConfig, AdmissionQueue, Ticketed, Verdict
from tests.builders import a_request


def item(
    q: AdmissionQueue,
    t: str,
    *,
    prio: int = P1,
    tenant: str = "a",
    gib: float = 1,
    deadline: float = 100.0,
) -> Ticketed:
    return Ticketed(
        ticket=t,
        request=a_request(t, vram_gib=gib, priority=prio, tenant=tenant),
        enqueued_at=0.0,
        deadline_at=deadline,
        seq=q.next_seq(),
    )


def grant_all(_: Ticketed, __: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
    return Verdict.GRANTED, NOTHING


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


def test_round_robin_skips_idle_rounds_for_huge_costs() -> None:
    # 64 GiB items with a 1 MiB quantum: 65,536 rounds of deficit, skipped at once, same order.
    q = AdmissionQueue(AdmissionConfig(quantum_mib=1))
    q.push(item(q, "a0", tenant="a", gib=64))
    q.push(item(q, "b0", tenant="b", gib=32))
    q.push(item(q, "b1", tenant="b", gib=32))
    assert [x.ticket for x in q.drain(grant_all)] == ["b0", "a0", "b1"]


def test_a_blocked_item_holds_only_its_units_and_holds_back_its_band_and_lower_only() -> None:
    q = AdmissionQueue(AdmissionConfig(p2_min_share=0.0))
    q.push(item(q, "big-p1", prio=P1, gib=40), frozenset({"s1"}))
    q.push(item(q, "p1-small", prio=P1))
    q.push(item(q, "p2-small", prio=P2))
    offered: dict[str, frozenset[str]] = {}

    def pool(x: Ticketed, avoid: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
        offered[x.ticket] = avoid
        if x.ticket == "big-p1":
            return Verdict.BLOCKED, frozenset({"s1"})
        return Verdict.GRANTED, NOTHING

    # Nobody waits behind big-p1: the later items are offered everything but the unit it holds.
    assert [x.ticket for x in q.drain(pool)] == ["p1-small", "p2-small"]
    assert offered == {"big-p1": NOTHING, "p1-small": {"s1"}, "p2-small": {"s1"}}
    assert q.holds("big-p1") == {"s1"}
    assert q.avoid(P1) == {"s1"} and q.avoid(P2) == {"s1"}
    assert q.avoid(P0) == NOTHING  # a strictly lower band never holds back a higher one
    assert q.remove("big-p1") is not None and q.avoid(P2) == NOTHING and q.holds("big-p1") == NOTHING


def test_holds_are_recomputed_by_every_pass() -> None:
    q = AdmissionQueue()
    q.push(item(q, "w"), frozenset({"s1"}))
    q.drain(lambda x, avoid: (Verdict.BLOCKED, frozenset({"s2"})))
    assert q.holds("w") == {"s2"} and q.avoid(P1) == {"s2"}
    q.drain(lambda x, avoid: (Verdict.BLOCKED, NOTHING))
    assert q.avoid(P1) == NOTHING


def test_a_blocked_item_costs_its_tenant_no_deficit() -> None:
    q = AdmissionQueue(AdmissionConfig(quantum_mib=1024))
    q.push(item(q, "a-big", tenant="a", gib=1))
    q.push(item(q, "a-small", tenant="a", gib=1))
    q.push(item(q, "b0", tenant="b", gib=1))

    def pool(x: Ticketed, _: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
        return (Verdict.BLOCKED, frozenset({"s"})) if x.ticket == "a-big" else (Verdict.GRANTED, NOTHING)

    assert [x.ticket for x in q.drain(pool)] == ["a-small", "b0"]
    assert [x.ticket for x in q] == ["a-big"]


def test_minimum_share_lets_batch_ignore_online_holds() -> None:
    q = AdmissionQueue(AdmissionConfig(p2_min_share=0.25, share_window=8))
    for _ in range(8):
        q.record_grant(P1)  # the window is full of online grants
    q.push(item(q, "stuck", prio=P1, gib=70))
    for i in range(4):
        q.push(item(q, f"b{i}", prio=P2))

    def pool(x: Ticketed, avoid: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
        if x.ticket == "stuck":
            return Verdict.BLOCKED, frozenset({"s1"})
        # batch only fits on s1, the unit the online request holds
        return (Verdict.BLOCKED, frozenset({"s1"})) if "s1" in avoid else (Verdict.GRANTED, NOTHING)

    # share 0/8 < 25 %: b0 passes (1/8), b1 passes (2/8); then 2/8 is not < 2: b2 waits, and it
    # holds s1 itself, so b3 (same band, behind it) waits too.
    assert [x.ticket for x in q.drain(pool)] == ["b0", "b1"]
    assert not q.share_ok()
    for _ in range(6):
        q.record_grant(P0)
    assert not q.share_ok()  # b0 and b1 are still in the window of 8
    q.record_grant(P0)
    assert q.share_ok()
    assert q.avoid(P2) == {"s1"}  # held by b2 and b3 themselves: online holds are ignored now
    # b1 rolled out: 1/8; b2 passes and pushes b1 out of the window (still 1/8): b3 passes too
    assert [x.ticket for x in q.drain(pool)] == ["b2", "b3"]


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
    out = q.drain(lambda x, _: (Verdict.DROPPED if x.ticket == "bad" else Verdict.GRANTED, NOTHING))
    assert [x.ticket for x in out] == ["good"] and len(q) == 0


def test_config_validation_names_the_field() -> None:
    with pytest.raises(InvalidInput, match="p2_min_share"):
        AdmissionConfig(p2_min_share=2.0)
    with pytest.raises(InvalidInput, match="quantum_mib"):
        AdmissionConfig(quantum_mib=0)
