"""The admission rule through the controller: no head-of-line blocking between requests that compete
for different capacity, unresolvable requests never queue, pump errors end only their own ticket,
cancelling a granted ticket keeps its lease, and a load mix rarely queues while VRAM is free."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P1, P2, ManualClock, OutcomeCode, SliceKind
from gpupool.core.controller import ControllerConfig, LeaseController
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.watermarks import Reading
from gpupool.hardware.slices import Slice
from tests.builders import GIB, a_request, a_slice
from tests.unit.core.load_mix import run_mix


def make(slices: list[Slice], **kw: object) -> tuple[LeaseController, ManualClock, MemoryLeaseStore]:
    clock = ManualClock(1000.0)
    store = MemoryLeaseStore()
    c = LeaseController(
        slices,
        clock=clock,
        store=store,
        lease_ids=kw.pop("lease_ids", seeded_lease_ids(3)),  # type: ignore[arg-type]
        ticket_ids=seeded_lease_ids(4),
        config=ControllerConfig(**kw),  # type: ignore[arg-type]
    )
    return c, clock, store


def test_a_waiting_request_holds_back_only_requests_that_could_use_what_it_waits_for() -> None:
    # One whole card and one MIG slice. A big P1 waits for the card; a small P1 that accepts MIG is
    # placed on MIG at once (old code: 202 behind the big one); a small P2 that only takes whole
    # cards waits (it could use the card the P1 waits for); a P0 of the same shape is never held back.
    c, _, _ = make(
        [
            a_slice("card", gpu="g0", vram_gib=80),
            a_slice("mig", gpu="g1", vram_gib=40, kind=SliceKind.MIG, compute=428),
        ]
    )
    holder = c.acquire(a_request("holder", vram_gib=50, priority=P2, tenant="x", kinds=(SliceKind.WHOLE,)))
    assert holder.granted
    big = c.acquire(a_request("big", vram_gib=70, priority=P1, tenant="a"))
    assert big.code is OutcomeCode.QUEUED
    small = c.acquire(a_request("small", vram_gib=8, priority=P1, tenant="b"))
    assert small.granted and small.lease is not None and small.lease.slice_ids == ("mig",)
    p2_card = c.acquire(a_request("p2c", vram_gib=8, priority=P2, tenant="b", kinds=(SliceKind.WHOLE,)))
    assert p2_card.code is OutcomeCode.QUEUED  # 30 GiB free on the card, but the P1 waits for it
    p0 = c.acquire(a_request("p0", vram_gib=8, priority=P0, tenant="b", kinds=(SliceKind.WHOLE,)))
    assert p0.granted and p0.lease is not None and p0.lease.slice_ids == ("card",)
    assert holder.lease is not None
    c.release(holder.lease.id)
    assert c.ticket(big.ticket or "").state == "granted"
    c.check_invariants()


def test_the_same_band_waits_only_for_the_unit_held_not_for_the_whole_pool() -> None:
    # Four whole cards, all half used; a P1 that needs a whole free card waits holding ONE card; the
    # next P1 small requests still land on the other three (old code: all 202).
    slices = [a_slice(f"c{i}", gpu=f"g{i}") for i in range(4)]
    c, _, _ = make(slices)
    for i in range(4):
        assert c.acquire(a_request(f"h{i}", vram_gib=40, priority=P2, tenant="x"), gpu_id=f"g{i}").granted
    wait = c.acquire(a_request("whole", vram_gib=80, priority=P1, tenant="a"))
    assert wait.code is OutcomeCode.QUEUED
    held = c.queue.holds(wait.ticket or "")
    assert len(held) == 1
    placed = [c.acquire(a_request(f"s{i}", vram_gib=10, priority=P1, tenant="b")) for i in range(6)]
    assert all(o.granted for o in placed)
    assert all(o.lease is not None and o.lease.slice_ids[0] not in held for o in placed)


def test_unresolvable_is_503_on_an_empty_and_a_full_queue_and_holds_nobody_back() -> None:
    c, _, _ = make([a_slice("c0", gpu="g0", node="n0"), a_slice("c1", gpu="g1", node="n1")])
    bad = a_request("bad", vram_gib=0.1, priority=P1, nodes=("no-such-node",))
    out = c.acquire(bad, wait_s=3600)
    assert out.code is OutcomeCode.UNRESOLVABLE and "no-such-node" in out.reason and len(c.queue) == 0
    assert c.acquire(a_request("ok", vram_gib=1, priority=P2, tenant="other")).granted
    two = a_request("two", vram_gib=1, priority=P1, gpu_count=2, nodes=("n0",))
    assert c.acquire(two).code is OutcomeCode.UNRESOLVABLE  # n0 has one card
    for i in range(2):
        c.acquire(a_request(f"fill{i}", vram_gib=79, priority=P1), gpu_id=f"g{i}")
    assert c.acquire(a_request("q", vram_gib=10, priority=P1)).code is OutcomeCode.QUEUED
    assert c.acquire(bad, wait_s=3600).code is OutcomeCode.UNRESOLVABLE
    assert len(c.queue) == 1


def test_a_paused_gpu_does_not_break_a_queued_two_card_batch_request_nor_other_callers() -> None:
    # Old code: the queued P2 x2 whole-card request, retried with a paused GPU in the pool, raised
    # "need 2 distinct slice(s)" (422) out of other tenants' release and renew calls.
    slices = [a_slice(f"c{i}", gpu=f"g{i}", node="n0") for i in range(3)]
    c, clock, _ = make(slices)
    held = [
        c.acquire(a_request(f"h{i}", vram_gib=20, priority=P1, tenant="t"), gpu_id=f"g{i}") for i in range(3)
    ]
    assert all(o.granted for o in held)
    q = c.acquire(
        a_request("batch", vram_gib=20, priority=P2, tenant="u", gpu_count=2, kinds=(SliceKind.WHOLE,))
    )
    assert q.code is OutcomeCode.QUEUED
    ev = c.feed_reading(Reading("g0", vram_used_mib=79 * GIB, vram_total_mib=80 * GIB, at_s=clock.now()))
    assert ev is not None and ev.kind == "pause"
    assert held[1].lease is not None and held[2].lease is not None
    assert c.renew(held[1].lease.id).code is OutcomeCode.RENEWED
    assert c.release(held[1].lease.id).code is OutcomeCode.RELEASED
    assert c.ticket(q.ticket or "").state == "queued"  # g1 free, g0 free of P2 room (paused), g2 busy
    assert c.release(held[2].lease.id).code is OutcomeCode.RELEASED
    st = c.ticket(q.ticket or "")
    assert st.state == "granted" and st.lease is not None
    assert sorted(g.gpu_id for g in st.lease.grants) == ["g1", "g2"]  # never the paused g0
    c.check_invariants()


def _ids(*ids: str) -> Iterator[str]:
    yield from ids


def test_an_error_while_pumping_ends_that_ticket_only() -> None:
    # The lease-id factory hands out an id twice: granting the queued request raises DuplicateId
    # inside the pump. The release that pumped succeeds; the ticket ends "failed" with the reason.
    ids = _ids("L1", "L2", "L1", "L3")
    c, _, _ = make([a_slice("c0", gpu="g0")], lease_ids=lambda: next(ids))
    first = c.acquire(a_request("a", vram_gib=60, priority=P1, tenant="a"))
    assert first.lease is not None and first.lease.id == "L1"
    q = c.acquire(a_request("b", vram_gib=60, priority=P1, tenant="b"))
    assert q.code is OutcomeCode.QUEUED
    assert c.release("L1", tenant="a").code is OutcomeCode.RELEASED  # pumps: "L2"... is taken next
    st = c.ticket(q.ticket or "")
    assert st.state == "granted" and st.lease is not None and st.lease.id == "L2"
    q2 = c.acquire(a_request("c", vram_gib=60, priority=P1, tenant="c"))
    assert q2.code is OutcomeCode.QUEUED
    assert c.release("L2", tenant="b").code is OutcomeCode.RELEASED  # pump draws "L1" again: raises
    failed = c.ticket(q2.ticket or "")
    assert failed.state == "failed" and "L1" in failed.reason and failed.lease is None
    assert len(c.queue) == 0 and c.leases() == []
    assert c.acquire(a_request("d", vram_gib=60, priority=P1, tenant="d")).granted  # "L3"
    c.check_invariants()


def test_cancelling_a_granted_ticket_keeps_its_lease_and_says_granted() -> None:
    c, _, _ = make([a_slice("c0", gpu="g0")])
    first = c.acquire(a_request("a", vram_gib=60, priority=P1))
    q = c.acquire(a_request("b", vram_gib=60, priority=P1, tenant="b"))
    assert first.lease is not None and q.ticket
    c.release(first.lease.id)
    st = c.cancel(q.ticket, tenant="b")
    assert st.state == "granted" and st.lease is not None
    assert [x.id for x in c.leases()] == [st.lease.id]


def test_cancelling_a_queued_ticket_lets_the_next_one_take_what_it_held() -> None:
    c, _, _ = make([a_slice("c0", gpu="g0")])
    c.acquire(a_request("a", vram_gib=50, priority=P2))
    big = c.acquire(a_request("big", vram_gib=60, priority=P1, tenant="b"))
    small = c.acquire(a_request("small", vram_gib=20, priority=P1, tenant="c"))
    assert big.code is small.code is OutcomeCode.QUEUED  # small could use the card big waits for
    c.cancel(big.ticket or "", tenant="b")
    assert c.ticket(small.ticket or "").state == "granted"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_load_mix_rarely_queues_while_most_vram_is_free(seed: int) -> None:
    # 48 clients of two tenants, random P0/P1/P2 sizes and shapes (see load_mix). Measured before the
    # fix (seeds 0-2): 52-74 % of the acquires made while < 60 % of the pool VRAM was granted were 202.
    r = run_mix(seed, clients=48, duration_s=150.0, roomy_below=0.6)
    assert r.acquires > 300 and r.granted_from_queue > 50
    assert r.roomy_queued <= max(3, 0.2 * r.roomy), (r.roomy_queued, r.roomy)
    assert r.mean_used > 0.78


def test_a_cancelled_ticket_ends_with_a_cancelled_event_not_a_shed_one() -> None:
    c, clock, _ = make([a_slice("c0", gpu="g0")])
    seen: list[str] = []
    c.sink = lambda e: seen.append(e.kind) if e.ticket else None
    c.acquire(a_request("a", vram_gib=60, priority=P1))
    q = c.acquire(a_request("b", vram_gib=60, priority=P1, tenant="b"))
    late = c.acquire(a_request("c", vram_gib=60, priority=P1, tenant="c"), wait_s=1.0)
    assert q.ticket and late.ticket
    assert c.cancel(q.ticket, tenant="b").state == "cancelled"
    clock.advance(2.0)
    c.tick()
    c.flush()
    assert seen == ["queued", "queued", "cancelled", "shed"]  # (the deadline passed: shed)
