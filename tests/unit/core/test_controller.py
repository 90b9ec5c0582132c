"""LeaseController on a virtual clock with the in-memory store: admission, queue pumping,
preemption, backpressure from readings, request leases, durability batches and recovery."""

from __future__ import annotations

import pytest

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P1, P2, LeaseState, ManualClock, OutcomeCode, SliceKind, UnknownId
from gpupool.core.admission import AdmissionConfig
from gpupool.core.controller import Backend, ControllerConfig, LeaseController
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.poolview import pool_view
from gpupool.core.ports import GatewayEvent
from gpupool.core.watermarks import Reading
from tests.builders import GIB, a_request, a_slice


def make(*slices, store=None, clock=None, **cfg):  # type: ignore[no-untyped-def]
    clock = clock or ManualClock(1000.0)
    store = store if store is not None else MemoryLeaseStore()
    events: list[GatewayEvent] = []
    c = LeaseController(
        slices or (a_slice("g0", gpu="g0"), a_slice("g1", gpu="g1", vram_gib=40)),
        clock=clock,
        store=store,
        sink=events.append,
        config=ControllerConfig(**cfg),
        lease_ids=seeded_lease_ids(3),
        ticket_ids=seeded_lease_ids(4),
    )
    return c, clock, store, events


def test_grant_is_durable_and_evented() -> None:
    c, _, store, events = make()
    out = c.acquire(a_request("r1", vram_gib=10, priority=P1))
    assert out.code is OutcomeCode.GRANTED and out.lease is not None
    assert store.get(out.lease.id) == out.lease
    assert [e.kind for e in events] == ["granted"]
    assert c.release(out.lease.id).code is OutcomeCode.RELEASED
    assert c.release(out.lease.id).code is OutcomeCode.ALREADY_ENDED
    assert store.get(out.lease.id).state is LeaseState.RELEASED  # type: ignore[union-attr]
    c.check_invariants()


def test_queue_then_grant_on_release_with_ticket_event() -> None:
    c, _, _, events = make(a_slice("g0", gpu="g0", vram_gib=40))
    first = c.acquire(a_request("a", vram_gib=30, priority=P1))
    queued = c.acquire(a_request("b", vram_gib=30, priority=P1, tenant="u"))
    assert queued.code is OutcomeCode.QUEUED and queued.ticket
    assert c.ticket(queued.ticket).state == "queued"
    with pytest.raises(UnknownId):
        c.ticket(queued.ticket, tenant="someone-else")
    assert first.lease is not None
    c.release(first.lease.id)
    st = c.ticket(queued.ticket)
    assert st.state == "granted" and st.lease is not None
    granted = [e for e in events if e.kind == "granted" and e.ticket == queued.ticket]
    assert len(granted) == 1 and granted[0].lease == st.lease


def test_p0_preempts_p2_and_p1_waits() -> None:
    c, _, _, events = make(a_slice("g0", gpu="g0", vram_gib=40))
    p2 = c.acquire(a_request("batch", vram_gib=30, priority=P2))
    assert p2.granted
    assert c.acquire(a_request("p1", vram_gib=20, priority=P1)).code is OutcomeCode.QUEUED
    p0 = c.acquire(a_request("p0", vram_gib=20, priority=P0))
    assert p0.code is OutcomeCode.PREEMPTED_VICTIMS and p0.victims[0].request.id == "batch"
    assert "preempted" in [e.kind for e in events]
    assert c.preemptions == 1


def test_queue_deadline_sheds() -> None:
    c, clock, _, events = make(a_slice("g0", gpu="g0", vram_gib=40))
    c.acquire(a_request("a", vram_gib=30, priority=P1))
    q = c.acquire(a_request("b", vram_gib=30, priority=P1), wait_s=2.0)
    clock.advance(3.0)
    c.tick()
    assert c.ticket(q.ticket or "").state == "shed"
    assert events[-1].kind == "shed"


def test_a_request_shed_because_its_band_is_full_is_counted_apart_from_deadline_sheds() -> None:
    c, clock, _, _ = make(a_slice("g0", gpu="g0", vram_gib=40), admission=AdmissionConfig(max_per_band=1))
    assert c.acquire(a_request("holder", vram_gib=40, priority=P0, preemptible=False)).granted
    assert c.acquire(a_request("a", priority=P1), wait_s=60.0).code is OutcomeCode.QUEUED
    out = c.acquire(a_request("b", priority=P1), wait_s=60.0)
    assert (out.code, out.reason, out.ticket) == (OutcomeCode.SHED, "queue of band P1 is full", None)
    assert c.outcomes[("P1", "shed_queue_full")] == 1 and c.outcomes[("P1", "shed")] == 0
    clock.advance(60.0)
    c.tick()
    assert c.outcomes[("P1", "shed")] == 1 and c.outcomes[("P1", "shed_queue_full")] == 1


def test_unresolvable_and_sheddable_without_queue() -> None:
    c, _, _, _ = make(queue_sheddable=False)
    assert c.acquire(a_request("huge", vram_gib=100)).code is OutcomeCode.UNRESOLVABLE
    assert c.acquire(a_request("mig", vram_gib=1, kinds=(SliceKind.MIG,))).code is OutcomeCode.UNRESOLVABLE
    assert c.acquire(a_request("fill0", vram_gib=80, priority=P1)).granted
    assert c.acquire(a_request("fill1", vram_gib=40, priority=P1)).granted
    assert c.acquire(a_request("p2", vram_gib=1, priority=P2)).code is OutcomeCode.SHED


def test_backpressure_pause_resume_events_and_429_for_p2() -> None:
    c, clock, _, events = make()
    held = c.acquire(a_request("batch", vram_gib=10, priority=P2, tenant="bt"), gpu_id="g0")
    assert held.granted
    ev = c.feed_reading(Reading("g0", vram_used_mib=73 * GIB, vram_total_mib=80 * GIB, at_s=clock.now()))
    assert ev is not None and ev.kind == "pause" and ev.lease_ids == (held.lease.id,)  # type: ignore[union-attr]
    assert ev.tenants == ("bt",)
    # P2 aimed at the paused GPU: backpressure; P2 anywhere: goes to the other GPU; P1 unaffected.
    assert c.acquire(a_request("p2-on-g0", priority=P2), gpu_id="g0").code is OutcomeCode.BACKPRESSURE
    anywhere = c.acquire(a_request("p2-any", priority=P2))
    assert anywhere.lease is not None and anywhere.lease.grants[0].gpu_id == "g1"
    assert c.acquire(a_request("p1-on-g0", priority=P1), gpu_id="g0").granted
    # between the thresholds: no change; at 70 %: resume
    assert c.feed_reading(Reading("g0", 60 * GIB, 80 * GIB, at_s=clock.now())) is None
    ev2 = c.feed_reading(Reading("g0", 56 * GIB, 80 * GIB, at_s=clock.now()))
    assert ev2 is not None and ev2.kind == "resume"
    assert [e.kind for e in events].count("pause") == 1
    assert c.acquire(a_request("p2-on-g0-again", priority=P2), gpu_id="g0").granted


def test_failed_gpu_revokes_and_recovers_health() -> None:
    c, clock, _, _ = make()
    lease = c.acquire(a_request("x", priority=P1), gpu_id="g0").lease
    assert lease is not None
    c.feed_reading(Reading("g0", 1, 80 * GIB, at_s=clock.now()), health="failed", xids=(79,))
    assert c.get(lease.id).state is LeaseState.REVOKED
    assert c.acquire(a_request("y", priority=P1), gpu_id="g0").code is OutcomeCode.UNRESOLVABLE
    c.feed_reading(Reading("g0", 1, 80 * GIB, at_s=clock.now()), health="ok")
    assert c.acquire(a_request("z", priority=P1), gpu_id="g0").granted


def test_tenant_isolation() -> None:
    c, _, _, _ = make()
    lease = c.acquire(a_request("x", tenant="A")).lease
    assert lease is not None
    for call in (
        lambda: c.get(lease.id, tenant="B"),
        lambda: c.release(lease.id, tenant="B"),
        lambda: c.renew(lease.id, tenant="B"),
    ):
        with pytest.raises(UnknownId):
            call()
    assert c.leases(tenant="B") == [] and c.leases(tenant="A") == [c.get(lease.id)]
    assert c.get(lease.id).state is LeaseState.ACTIVE


def test_group_commit_batch_coalesces_writes_per_lease() -> None:
    c, _, store, events = make()
    c.autoflush = False
    a = c.acquire(a_request("a"))
    assert a.lease is not None
    c.renew(a.lease.id, ttl_s=99)
    c.release(a.lease.id)
    assert store.get(a.lease.id) is None and events == []  # nothing durable, nothing told yet
    batch = c.take_batch()
    assert len(batch.writes) == 1 and batch.writes[0].expected_revision is None
    store.apply(batch.writes)
    c.deliver(batch)
    assert [e.kind for e in events] == ["granted", "renewed", "released"]
    assert store.get(a.lease.id).state is LeaseState.RELEASED  # type: ignore[union-attr]


def test_recovery_restores_expires_and_revokes_then_books_match() -> None:
    store = MemoryLeaseStore()
    c, clock, _, _ = make(store=store)
    short = c.acquire(a_request("short", vram_gib=10, ttl_s=5), gpu_id="g0").lease
    long_ = c.acquire(a_request("long", vram_gib=20, ttl_s=500), gpu_id="g0").lease
    gone = c.acquire(a_request("on-g1", vram_gib=30, ttl_s=500), gpu_id="g1").lease
    assert short and long_ and gone
    clock.advance(10)
    # restart with g1 removed from the inventory
    c2, _, _, _ = make(a_slice("g0", gpu="g0"), store=store, clock=clock)
    rep = c2.recover()
    assert (rep.restored, rep.expired, rep.revoked) == (1, 1, 1)
    assert [x.id for x in c2.leases()] == [long_.id]
    assert store.get(short.id).state is LeaseState.EXPIRED  # type: ignore[union-attr]
    assert store.get(gone.id).state is LeaseState.REVOKED  # type: ignore[union-attr]
    assert c2.allocator.slice_state("g0").granted.vram_mib == 20 * GIB
    c2.check_invariants()


def test_request_leases_draw_from_backend_kv_budgets() -> None:
    c, _, store, _ = make()
    c.register_backend(Backend("be1", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=1000))
    c.register_backend(Backend("be2", "m", "http://y", node="n0", gpu_id="g1", kv_budget_mib=1000))
    r = a_request("q1", vram_mib=600, priority=P0)
    from dataclasses import replace

    one = c.acquire(replace(r, model="m"))
    two = c.acquire(replace(r, id="q2", model="m"))
    assert one.lease and two.lease
    assert {c.backend_of(one.lease).id, c.backend_of(two.lease).id} == {"be1", "be2"}  # type: ignore[union-attr]
    third = c.acquire(replace(r, id="q3", model="m"))
    assert third.code is OutcomeCode.QUEUED
    c.release(one.lease.id)
    assert c.ticket(third.ticket or "").state == "granted"
    assert store.get(one.lease.id) is None  # request leases are memory-only
    assert c.acquire(replace(r, id="q4", model="m", demand=replace(r.demand, vram_mib=2000))).code is (
        OutcomeCode.UNRESOLVABLE
    )
    assert pool_view(c)["request_leases"] == 2
