"""Tickets are durable: each change is written in the same store batch as the lease writes of the
same call, and `recover` brings them back (queued ones wait on until their original deadline, those
past it are shed, granted ones point at their lease)."""

from __future__ import annotations

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P1, ManualClock, OutcomeCode
from gpupool.core.controller import LeaseController
from gpupool.core.ids import seeded_lease_ids
from tests.builders import a_request, a_slice


def controller(store: MemoryLeaseStore, clock: ManualClock, seed: int = 1) -> LeaseController:
    c = LeaseController(
        [a_slice("c0", gpu="g0"), a_slice("c1", gpu="g1")],
        clock=clock,
        store=store,
        lease_ids=seeded_lease_ids(seed),
        ticket_ids=seeded_lease_ids(seed + 100),
    )
    c.recover()
    return c


def test_a_grant_from_the_queue_and_its_ticket_land_in_one_commit() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(1000.0)
    c = controller(store, clock)
    first = c.acquire(a_request("a", vram_gib=60, priority=P1), gpu_id="g0")
    q = c.acquire(a_request("b", vram_gib=60, priority=P1, tenant="u"), gpu_id="g0")
    assert first.lease is not None and q.ticket
    rec = store.get_ticket(q.ticket)
    assert rec is not None and rec.state == "queued" and rec.ended_at is None
    commits = store.commits
    c.release(first.lease.id)
    assert store.commits == commits + 1  # the release, the grant and the ticket: one batch
    rec = store.get_ticket(q.ticket)
    st = c.ticket(q.ticket)
    assert rec is not None and st.lease is not None
    assert rec.state == "granted" and rec.lease_id == st.lease.id and store.get(st.lease.id) == st.lease


def test_recover_brings_tickets_back() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(1000.0)
    c = controller(store, clock)
    for g in ("g0", "g1"):
        assert c.acquire(a_request(f"fill-{g}", vram_gib=70, priority=P1), gpu_id=g).granted
    short = c.acquire(a_request("short", vram_gib=20, priority=P1, tenant="u"), wait_s=5.0)
    long = c.acquire(a_request("long", vram_gib=20, priority=P1, tenant="v"), wait_s=600.0)
    assert short.code is long.code is OutcomeCode.QUEUED and short.ticket and long.ticket
    before = c.ticket(long.ticket)

    clock.advance(10.0)  # the gateway is down for 10 s: "short" passed its deadline meanwhile
    c2 = controller(store, clock, seed=2)
    assert c2.ticket(short.ticket).state == "shed" and "down" in c2.ticket(short.ticket).reason
    back = c2.ticket(long.ticket, tenant="v")
    assert back.state == "queued" and (back.enqueued_at, back.deadline_at) == (
        before.enqueued_at,
        before.deadline_at,
    )
    assert long.ticket in c2.queue and len(c2.queue) == 1

    c2.release(c2.leases()[0].id)
    granted = c2.ticket(long.ticket)
    assert granted.state == "granted" and granted.lease is not None

    c3 = controller(store, clock, seed=3)  # and once more: the granted ticket points at its lease
    again = c3.ticket(long.ticket)
    assert again.state == "granted" and again.lease == granted.lease
    assert len(c3.queue) == 0
    c3.check_invariants()


def test_capacity_freed_while_down_goes_to_the_restored_tickets_first() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(1000.0)
    c = controller(store, clock)
    assert c.acquire(a_request("short-lived", vram_gib=70, priority=P1, ttl_s=5), gpu_id="g0").granted
    assert c.acquire(a_request("long-lived", vram_gib=70, priority=P1, ttl_s=600), gpu_id="g1").granted
    q = c.acquire(a_request("waiting", vram_gib=60, priority=P1, tenant="u"), wait_s=600.0)
    assert q.code is OutcomeCode.QUEUED and q.ticket
    clock.advance(10.0)  # down while the short-lived lease expires
    c2 = controller(store, clock, seed=2)
    st = c2.ticket(q.ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == ("c0",)
    assert c2.acquire(a_request("newcomer", vram_gib=60, priority=P1, tenant="n")).code is OutcomeCode.QUEUED
