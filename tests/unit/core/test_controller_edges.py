"""Edge cases of `LeaseController` (leases, tickets, queue, durability, recovery) through its public
API with real stores (the in-memory one, SQLite through a store that refuses writes on demand):
bad input is refused naming the field and the value and leaves the pool as it was; the boundaries
of the queue deadline, of sheddable work and of preemption; which ticket is granted, shed, cancelled
or failed and which events say so; tickets remembered, evicted and read back from the store; what
recovery does with leases and tickets at their exact deadlines. Written against the survivors of a
mutation run of ``core/controller.py``."""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import replace

import pytest

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P1, P2, LeaseState, ManualClock, OutcomeCode, UnknownId
from gpupool.core.admission import AdmissionConfig
from gpupool.core.controller import Backend, ControllerConfig, LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.model import Request
from gpupool.core.ports import GatewayEvent, LeaseStore
from gpupool.core.watermarks import Reading
from gpupool.hardware.slices import Slice
from tests.adapters.store.faulty import DISK_FULL, FaultyStore
from tests.builders import a_request, a_slice


class Rig:
    """A controller on a manual clock, with its store and the events it delivered."""

    def __init__(
        self,
        *slices: Slice,
        store: LeaseStore | None = None,
        clock: ManualClock | None = None,
        seed: int = 3,
        ticket_memory: int = 10_000,
        **cfg: object,
    ) -> None:
        self.clock = clock or ManualClock(1000.0)
        self.store = store if store is not None else MemoryLeaseStore()
        self.events: list[GatewayEvent] = []
        self.c = LeaseController(
            slices or (a_slice("g0", gpu="g0", vram_gib=40),),
            clock=self.clock,
            store=self.store,
            sink=self.events.append,
            config=ControllerConfig(**cfg),  # type: ignore[arg-type]
            lease_ids=seeded_lease_ids(seed),
            ticket_ids=seeded_lease_ids(seed + 100),
            ticket_memory=ticket_memory,
        )

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


def snapshot(c: LeaseController) -> tuple[object, ...]:
    return (
        [x.id for x in c.leases()],
        len(c.queue),
        dict(c.outcomes),
        c.preemptions,
        [(s.slice.id, s.granted.vram_mib, s.healthy) for s in c.allocator.states()],
    )


# ---------------------------------------------------------------- bad input
def test_acquire_refuses_an_unknown_gpu_and_a_multi_gpu_request_naming_one_and_changes_nothing() -> None:
    r = Rig(a_slice("g0", gpu="g0"), a_slice("g1", gpu="g1"))
    before = snapshot(r.c)
    with pytest.raises(InvalidInput) as err:
        r.c.acquire(a_request("x"), gpu_id="g9")
    assert (err.value.field, err.value.value) == ("gpu_id", "g9")
    with pytest.raises(InvalidInput) as err:
        r.c.acquire(a_request("two", gpu_count=2), gpu_id="g0")
    assert (err.value.field, err.value.value) == ("gpu_id", "g0") and "multi-GPU" in err.value.reason
    assert snapshot(r.c) == before and r.events == [] and r.store.active() == []
    assert r.c.acquire(a_request("one", gpu_count=1), gpu_id="g0").granted  # one GPU named: fine


@pytest.mark.parametrize("wait_s", [0.0, -1.0, 3600.5])
def test_a_queue_timeout_outside_its_range_is_refused_naming_it_and_changes_nothing(wait_s: float) -> None:
    r = Rig()
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1)).granted
    before = snapshot(r.c)
    with pytest.raises(InvalidInput) as err:
        r.c.acquire(a_request("x", priority=P1), wait_s=wait_s)
    assert (err.value.field, err.value.value) == ("queue_timeout_s", wait_s)
    assert snapshot(r.c) == before and len(r.c.queue) == 0


def test_the_longest_queue_timeout_is_accepted_and_sets_the_deadline() -> None:
    r = Rig()
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1)).granted
    q = r.c.acquire(a_request("x", priority=P1), wait_s=3600.0)
    assert q.code is OutcomeCode.QUEUED and q.ticket and q.retry_after_s == 1.0
    st = r.c.ticket(q.ticket)
    assert (st.enqueued_at, st.deadline_at) == (1000.0, 4600.0)


def test_the_default_queue_timeout_is_the_bands() -> None:
    r = Rig(admission=AdmissionConfig(wait_s=(5.0, 30.0, 300.0)), retry_after_s=2.5)
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1)).granted
    for prio, wait in ((P0, 5.0), (P1, 30.0), (P2, 300.0)):
        q = r.c.acquire(a_request(f"w{prio}", priority=prio, preemptible=False))
        assert q.code is OutcomeCode.QUEUED and q.ticket and q.retry_after_s == 2.5
        assert r.c.ticket(q.ticket).deadline_at == 1000.0 + wait


def test_register_backend_refuses_a_duplicate_id_and_an_empty_budget_naming_them() -> None:
    r = Rig()
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=1))
    with pytest.raises(InvalidInput) as err:
        r.c.register_backend(Backend("be", "m", "http://y", node="n0", gpu_id="g0", kv_budget_mib=10))
    assert (err.value.field, err.value.value) == ("backend.id", "be")
    with pytest.raises(InvalidInput) as err:
        r.c.register_backend(Backend("be2", "m", "http://y", node="n0", gpu_id="g0", kv_budget_mib=0))
    assert (err.value.field, err.value.value) == ("backend.kv_budget_mib", 0)
    assert list(r.c.backends) == ["be"] and [b.id for b in r.c.models()["m"]] == ["be"]
    assert r.c.backends["be"].url == "http://x"


def test_public_options_are_keyword_only_so_a_stray_positional_is_refused() -> None:
    r = Rig()
    lease = r.c.acquire(a_request("x", priority=P1, tenant="a")).lease
    assert lease is not None
    for call in (
        lambda: r.c.acquire(a_request("y"), 5.0),  # type: ignore[misc]
        lambda: r.c.release(lease.id, "a"),  # type: ignore[misc]
        lambda: r.c.renew(lease.id, 99.0),  # type: ignore[misc]
        lambda: r.c.revoke(lease.id, "why"),  # type: ignore[misc]
        lambda: r.c.get(lease.id, "b"),  # type: ignore[misc]
        lambda: r.c.leases("b"),  # type: ignore[misc]
        lambda: r.c.ticket("t", "b"),  # type: ignore[misc]
        lambda: r.c.cancel("t", "b"),  # type: ignore[misc]
        lambda: LeaseController((), ManualClock(0.0), store=MemoryLeaseStore()),  # type: ignore[misc]
    ):
        with pytest.raises(TypeError):
            call()
    assert r.c.get(lease.id).state is LeaseState.ACTIVE and r.c.get(lease.id).expires_at == 1060.0


# ---------------------------------------------------------------- leases
def test_ended_leases_answer_already_ended_naming_the_state_and_reasons_default() -> None:
    r = Rig(a_slice("g0", gpu="g0"), a_slice("g1", gpu="g1"))
    a = r.c.acquire(a_request("a", priority=P1)).lease
    b = r.c.acquire(a_request("b", priority=P1)).lease
    assert a is not None and b is not None
    assert r.c.release(a.id).lease.reason == "released by holder"  # type: ignore[union-attr]
    assert r.c.revoke(b.id, reason="agent could not free the GPU").lease.reason == (  # type: ignore[union-attr]
        "agent could not free the GPU"
    )
    for call, lid, state in (
        (r.c.release, a.id, "released"),
        (r.c.renew, a.id, "released"),
        (lambda lid: r.c.revoke(lid, reason="again"), b.id, "revoked"),
        (r.c.release, b.id, "revoked"),
    ):
        out = call(lid)
        assert out.code is OutcomeCode.ALREADY_ENDED and out.reason == f"lease already {state}"
        assert out.lease is not None and out.lease.id == lid
    assert r.c.get(b.id).reason == "agent could not free the GPU"
    assert r.c.release(b.id, reason="ignored").code is OutcomeCode.ALREADY_ENDED


def test_leases_lists_placement_and_request_leases_of_a_tenant_sorted_by_id() -> None:
    r = Rig(a_slice("g0", gpu="g0"), seed=9)
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=1000))
    ids = []
    for i, tenant in enumerate(["a", "b", "a", "a"]):
        req = a_request(f"r{i}", vram_mib=10, priority=P1, tenant=tenant)
        out = r.c.acquire(replace(req, model="m") if i % 2 else req)
        assert out.lease is not None
        ids.append((tenant, out.lease.id))
    assert [x.id for x in r.c.leases(tenant="a")] == sorted(i for t, i in ids if t == "a")
    assert [x.id for x in r.c.leases()] == sorted(i for _, i in ids)
    kv_lease = r.c.get(ids[3][1], tenant="a")
    assert r.c.backend_of(kv_lease) is r.c.backends["be"]
    assert r.c.backend_of(r.c.get(ids[0][1])) is None


def test_a_lease_active_in_the_store_but_not_restored_is_unknown() -> None:
    store = MemoryLeaseStore()
    r = Rig(store=store)
    lease = r.c.acquire(a_request("x", priority=P1)).lease
    assert lease is not None
    fresh = Rig(store=store)  # no recover(): the stored lease is not this controller's to serve
    for call in (lambda: fresh.c.get(lease.id), lambda: fresh.c.release(lease.id)):
        with pytest.raises(UnknownId):
            call()
    assert store.get(lease.id) == lease
    r.c.release(lease.id)
    ended = fresh.c.get(lease.id)  # an ended one is known from the store
    assert ended.state is LeaseState.RELEASED
    assert fresh.c.release(lease.id).code is OutcomeCode.ALREADY_ENDED


# ---------------------------------------------------------------- admission boundaries
def test_without_queueing_sheddable_only_negative_priorities_are_shed() -> None:
    r = Rig(queue_sheddable=False)
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1)).granted
    shed = r.c.acquire(a_request("p2", priority=P2))
    assert shed.code is OutcomeCode.SHED and shed.retry_after_s == 1.0
    assert shed.reason == "no room now and sheddable work does not queue"
    zero = r.c.acquire(a_request("p-zero", priority=0))  # band P1: queues
    assert zero.code is OutcomeCode.QUEUED
    assert r.c.outcomes[("P2", "shed")] == 1 and r.c.outcomes[("P1", "queued")] == 1


def test_preemption_starts_at_the_configured_priority_and_counts_victims() -> None:
    r = Rig(preempt_min_priority=P1)
    low = r.c.acquire(a_request("low", vram_gib=40, priority=P2))
    assert low.lease is not None
    below = r.c.acquire(a_request("p1-minus", vram_gib=40, priority=P1 - 1))
    assert below.code is OutcomeCode.QUEUED and r.c.preemptions == 0
    at = r.c.acquire(a_request("p1", vram_gib=40, priority=P1))
    assert at.code is OutcomeCode.PREEMPTED_VICTIMS and [v.id for v in at.victims] == [low.lease.id]
    assert r.c.preemptions == 1 and r.c.get(low.lease.id).state is LeaseState.PREEMPTED
    assert r.c.outcomes[("P1", "preempted_victims")] == 1


def test_a_request_aimed_at_a_gpu_never_preempts() -> None:
    r = Rig()
    low = r.c.acquire(a_request("low", vram_gib=40, priority=P2))
    assert low.lease is not None
    out = r.c.acquire(a_request("p0", vram_gib=40, priority=P0), gpu_id="g0")
    assert out.code is OutcomeCode.QUEUED and r.c.get(low.lease.id).state is LeaseState.ACTIVE


# ---------------------------------------------------------------- tickets
def test_cancelling_a_queued_ticket_ends_it_with_a_cancelled_event_and_lets_the_next_in() -> None:
    r = Rig()
    holder = r.c.acquire(a_request("holder", vram_gib=25, priority=P1)).lease
    big = r.c.acquire(a_request("big", vram_gib=30, priority=P1, tenant="a"))
    small = r.c.acquire(a_request("small", vram_gib=15, priority=P1, tenant="b"))
    assert holder and big.ticket and small.ticket and small.code is OutcomeCode.QUEUED
    st = r.c.cancel(big.ticket, tenant="a")
    assert (st.state, st.reason, st.ended_at) == ("cancelled", "cancelled by holder", 1000.0)
    assert r.store.get_ticket(big.ticket).state == "cancelled"  # type: ignore[union-attr]
    ev = [e for e in r.events if e.ticket == big.ticket][-1]
    assert (ev.kind, ev.reason, ev.tenant) == ("cancelled", "cancelled by holder", "a")
    assert r.c.ticket(small.ticket).state == "granted"  # what "big" held is free for "small" now
    again = r.c.cancel(big.ticket)
    assert again.state == "cancelled" and r.kinds().count("cancelled") == 1  # (cancelling again: no event)


def test_cancelling_someone_elses_or_an_unknown_ticket_is_unknown_and_changes_nothing() -> None:
    r = Rig()
    assert r.c.acquire(a_request("holder", vram_gib=40, priority=P1)).granted
    q = r.c.acquire(a_request("w", priority=P1, tenant="a"))
    assert q.ticket
    for t, tenant in ((q.ticket, "b"), ("nope", None)):
        with pytest.raises(UnknownId) as err:
            r.c.cancel(t, tenant=tenant)
        assert (err.value.kind, err.value.value) == ("ticket", t)
    assert r.c.ticket(q.ticket).state == "queued" and q.ticket in r.c.queue


def test_a_shed_ticket_event_names_the_deadline_and_counts_once() -> None:
    r = Rig()
    assert r.c.acquire(a_request("holder", vram_gib=40, priority=P1)).granted
    q = r.c.acquire(a_request("w", priority=P1, tenant="u"), wait_s=2.0)
    assert q.ticket
    r.clock.advance(1.0)
    r.c.tick()
    assert r.c.ticket(q.ticket).state == "queued"
    r.clock.advance(1.0)  # exactly at the deadline
    r.c.tick()
    st = r.c.ticket(q.ticket)
    assert (st.state, st.reason, st.ended_at) == ("shed", "queue deadline passed", 1002.0)
    ev = r.events[-1]
    assert (ev.kind, ev.ticket, ev.tenant, ev.reason, ev.at) == ("shed", q.ticket, "u", st.reason, 1002.0)
    assert r.c.outcomes[("P1", "shed")] == 1
    r.c.tick()
    assert r.c.outcomes[("P1", "shed")] == 1


def test_tick_expires_leases_and_grants_the_queue_the_room() -> None:
    r = Rig()
    short = r.c.acquire(a_request("short", vram_gib=40, priority=P1, ttl_s=5)).lease
    q = r.c.acquire(a_request("w", vram_gib=40, priority=P1), wait_s=60.0)
    assert short is not None and q.ticket
    r.clock.advance(5.0)
    r.c.tick()
    assert r.c.get(short.id).state is LeaseState.EXPIRED
    st = r.c.ticket(q.ticket)
    assert st.state == "granted" and st.lease is not None
    granted = [e for e in r.events if e.kind == "granted" and e.ticket == q.ticket]
    assert len(granted) == 1 and granted[0].wait_s == 5.0
    assert r.c.outcomes[("P1", "granted_from_queue")] == 1


def test_request_leases_expire_on_tick_and_free_their_budget_for_the_queue() -> None:
    r = Rig()
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    first = r.c.acquire(replace(a_request("a", vram_mib=80, priority=P1, ttl_s=5), model="m")).lease
    q = r.c.acquire(replace(a_request("b", vram_mib=80, priority=P1), model="m"), wait_s=60.0)
    assert first is not None and q.code is OutcomeCode.QUEUED and q.ticket
    r.clock.advance(5.0)
    r.c.tick()
    assert r.c.ticket(q.ticket).state == "granted"
    assert r.store.get_ticket(q.ticket) is None  # request-lease tickets are memory-only


def test_a_new_backend_budget_goes_to_a_request_waiting_for_its_model_from_the_next_call() -> None:
    r = Rig()
    r.c.register_backend(Backend("be1", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    assert r.c.acquire(replace(a_request("a", vram_mib=100, priority=P1), model="m")).granted
    q = r.c.acquire(replace(a_request("b", vram_mib=100, priority=P1), model="m"))
    assert q.code is OutcomeCode.QUEUED and q.ticket
    r.c.register_backend(Backend("be0", "m", "http://y", node="n0", gpu_id="g0", kv_budget_mib=100))
    assert r.c.acquire(a_request("unrelated", priority=P1)).granted  # the next call pumps the queue
    st = r.c.ticket(q.ticket)
    assert st.state == "granted" and st.lease is not None
    assert r.c.backend_of(st.lease) is r.c.backends["be0"]
    assert [b.id for b in r.c.models()["m"]] == ["be0", "be1"]  # sorted by id


def test_the_ticket_memory_forgets_the_oldest_ended_memory_only_tickets_never_queued_ones() -> None:
    r = Rig(ticket_memory=2)
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    assert r.c.acquire(replace(a_request("holder", vram_mib=100, priority=P1), model="m")).granted
    tickets = []
    for i in range(3):
        q = r.c.acquire(replace(a_request(f"w{i}", vram_mib=100, priority=P1), model="m"), wait_s=1.0 + i)
        assert q.code is OutcomeCode.QUEUED and q.ticket
        tickets.append(q.ticket)
    assert [r.c.ticket(t).state for t in tickets] == ["queued"] * 3  # over the memory, but queued
    r.clock.advance(10.0)
    r.c.tick()  # all three are shed now; request-lease tickets live in memory only
    with pytest.raises(UnknownId):
        r.c.ticket(tickets[0])
    assert [r.c.ticket(t).state for t in tickets[1:]] == ["shed", "shed"]


def test_a_forgotten_placement_ticket_is_read_back_from_the_store() -> None:
    r = Rig(ticket_memory=1)
    assert r.c.acquire(a_request("holder", vram_gib=40, priority=P1)).granted
    first = r.c.acquire(a_request("w0", priority=P1, tenant="u"), wait_s=1.0)
    assert first.ticket
    r.clock.advance(2.0)
    r.c.tick()
    second = r.c.acquire(a_request("w1", priority=P1), wait_s=1.0)
    assert second.ticket
    r.clock.advance(2.0)
    r.c.tick()
    st = r.c.ticket(first.ticket, tenant="u")  # out of memory: from the store
    assert (st.state, st.reason, st.request.id) == ("shed", "queue deadline passed", "w0")
    with pytest.raises(UnknownId):
        r.c.ticket(first.ticket, tenant="v")


def test_a_pump_pass_that_ends_leases_offers_the_room_to_items_it_already_passed() -> None:
    # "a" (model m) waits behind "x", whose TTL has run out but which no tick has expired yet; "b"
    # (model m2) waits behind "z". Releasing "z" pumps: "a" is still blocked, then placing "b"
    # expires "x", and a second pass gives "a" the room at once (not at the next tick).
    r = Rig()
    r.c.register_backend(Backend("be-m", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    r.c.register_backend(Backend("be-m2", "m2", "http://y", node="n0", gpu_id="g0", kv_budget_mib=100))

    def kv(rid: str, model: str, ttl_s: float = 600) -> Request:
        return replace(a_request(rid, vram_mib=100, priority=P1, ttl_s=ttl_s), model=model)

    x = r.c.acquire(kv("x", "m", ttl_s=5)).lease
    z = r.c.acquire(kv("z", "m2")).lease
    a = r.c.acquire(kv("a", "m"), wait_s=60.0)
    b = r.c.acquire(kv("b", "m2"), wait_s=60.0)
    assert x and z and a.ticket and b.ticket
    r.clock.advance(5.0)
    r.c.release(z.id)
    assert r.c.ticket(b.ticket).state == "granted"
    assert r.c.get(x.id).state is LeaseState.EXPIRED
    st = r.c.ticket(a.ticket)
    assert st.state == "granted" and st.lease is not None and r.c.backend_of(st.lease) is r.c.backends["be-m"]


def test_a_direct_grant_event_carries_no_ticket_and_no_wait() -> None:
    r = Rig()
    out = r.c.acquire(a_request("x", priority=P1, tenant="u"))
    assert out.lease is not None
    (ev,) = r.events
    assert (ev.kind, ev.ticket, ev.wait_s, ev.tenant, ev.lease) == ("granted", "", 0.0, "u", out.lease)


def test_a_refused_batch_fails_the_tickets_it_granted_but_not_a_request_lease_ticket() -> None:
    inner = MemoryLeaseStore()
    store = FaultyStore(inner)
    r = Rig(store=store)
    r.c.autoflush = False
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    holder = r.c.acquire(replace(a_request("h", vram_mib=100, priority=P1), model="m")).lease
    kv_q = r.c.acquire(replace(a_request("k", vram_mib=100, priority=P1), model="m"))
    big = r.c.acquire(a_request("big", vram_gib=40, priority=P1)).lease
    q = r.c.acquire(a_request("q", vram_gib=40, priority=P1))
    assert holder and big and kv_q.ticket and q.ticket
    r.c.flush()
    r.c.release(holder.id)  # grants the request-lease ticket (memory only)
    r.c.release(big.id)  # grants the placement ticket: both in the pending batch
    assert r.c.ticket(kv_q.ticket).state == "granted" and r.c.ticket(q.ticket).state == "granted"
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError):
        r.c.flush()
    kv_st = r.c.ticket(kv_q.ticket)
    assert kv_st.state == "granted" and kv_st.lease is not None  # its lease needs no store
    assert r.c.get(kv_st.lease.id).state is LeaseState.ACTIVE
    failed = r.c.ticket(q.ticket)
    assert failed.state == "failed" and failed.reason == f"lease store unavailable: {DISK_FULL}"
    assert r.c.get(big.id).state is LeaseState.ACTIVE  # the release was undone with the grant


def test_a_refused_batch_leaves_tickets_ended_in_it_as_they_are() -> None:
    store = FaultyStore(MemoryLeaseStore())
    r = Rig(store=store)
    r.c.autoflush = False
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1)).granted
    shed = r.c.acquire(a_request("s", priority=P1), wait_s=1.0)
    kept = r.c.acquire(a_request("k", priority=P1), wait_s=60.0)
    assert shed.ticket and kept.ticket
    r.c.flush()
    r.clock.advance(2.0)
    r.c.tick()
    new = r.c.acquire(a_request("new", priority=P0, preemptible=False))
    assert new.code is OutcomeCode.QUEUED and new.ticket
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError):
        r.c.flush()
    assert r.c.ticket(new.ticket).state == "failed" and new.ticket not in r.c.queue
    assert r.c.ticket(shed.ticket).state == "shed"
    assert r.c.ticket(kept.ticket).state == "queued" and kept.ticket in r.c.queue


def test_a_restart_with_nothing_to_change_writes_nothing() -> None:
    store = MemoryLeaseStore()
    r = Rig(store=store)
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1, ttl_s=600)).granted
    shed = r.c.acquire(a_request("s", priority=P1), wait_s=1.0)
    r.clock.advance(0.5)  # stored tickets are read back in the order they were queued
    waiting = r.c.acquire(a_request("w", priority=P1), wait_s=600.0)
    assert shed.ticket and waiting.ticket
    r.clock.advance(2.0)
    r.c.tick()
    commits = store.commits
    again = Rig(store=store, clock=r.clock, seed=5)
    rep = again.c.recover()
    assert (rep.restored, rep.expired, rep.revoked) == (1, 0, 0)
    assert store.commits == commits  # every lease and ticket read back as stored: no write
    assert again.c.ticket(shed.ticket).state == "shed" and again.c.ticket(waiting.ticket).state == "queued"
    assert waiting.ticket in again.c.queue  # an ended ticket read first does not stop the others


def test_the_config_is_frozen() -> None:
    cfg = ControllerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.retry_after_s = 5.0  # type: ignore[misc]
    assert cfg.retry_after_s == 1.0 and not hasattr(cfg, "__dict__")  # frozen and slotted


def test_a_ticket_that_became_unresolvable_fails_when_pumped_and_is_counted_once() -> None:
    r = Rig(a_slice("big", gpu="g0", vram_gib=40), a_slice("small", gpu="g1", vram_gib=10))
    held = r.c.acquire(a_request("held", vram_gib=40, priority=P1), gpu_id="g0").lease
    q = r.c.acquire(a_request("w", vram_gib=30, priority=P1, tenant="u"), wait_s=60.0)
    assert held is not None and q.code is OutcomeCode.QUEUED and q.ticket
    r.c.mark_slice("big", healthy=False, revoke=True, reason="ECC")  # frees the room, but unhealthy
    st = r.c.ticket(q.ticket)
    assert st.state == "failed" and st.reason.startswith("no healthy slice of the pool")
    assert r.store.get_ticket(q.ticket).state == "failed"  # type: ignore[union-attr]
    ev = r.events[-1]
    assert (ev.kind, ev.ticket, ev.tenant, ev.reason) == ("failed", q.ticket, "u", st.reason)
    assert r.c.outcomes[("P1", "failed")] == 1 and q.ticket not in r.c.queue


def test_recovery_sheds_a_ticket_past_its_deadline_and_still_restores_the_later_ones() -> None:
    store = MemoryLeaseStore()
    r = Rig(store=store)
    full = r.c.acquire(a_request("full", vram_gib=40, priority=P1, ttl_s=600)).lease
    early = r.c.acquire(a_request("early", priority=P1), wait_s=5.0)
    at = r.c.acquire(a_request("at", priority=P1), wait_s=10.0)
    late = r.c.acquire(a_request("late", priority=P1), wait_s=600.0)
    assert full and early.ticket and at.ticket and late.ticket
    r.clock.advance(10.0)  # down for 10 s: "early" passed its deadline, "at" is exactly at it
    again = Rig(store=store, clock=r.clock, seed=5)
    again.c.recover()
    for t in (early.ticket, at.ticket):
        st = again.c.ticket(t)
        assert (st.state, st.reason) == ("shed", "queue deadline passed while the gateway was down")
        assert store.get_ticket(t).state == "shed"  # type: ignore[union-attr]
    assert again.c.ticket(late.ticket).state == "queued" and late.ticket in again.c.queue
    assert len(again.c.queue) == 1


def test_recovery_expires_a_lease_at_its_exact_expiry_and_revokes_one_that_no_longer_fits() -> None:
    store = MemoryLeaseStore()
    r = Rig(a_slice("g0", gpu="g0", vram_gib=40), a_slice("g1", gpu="g1", vram_gib=40), store=store)
    due = r.c.acquire(a_request("due", priority=P1, ttl_s=10), gpu_id="g0").lease
    kept = r.c.acquire(a_request("kept", priority=P1, ttl_s=11), gpu_id="g0").lease
    gone = r.c.acquire(a_request("gone", priority=P1, ttl_s=600), gpu_id="g1").lease
    assert due and kept and gone
    r.clock.advance(10.0)
    again = Rig(a_slice("g0", gpu="g0", vram_gib=40), store=store, clock=r.clock, seed=5)
    rep = again.c.recover()
    assert (rep.restored, rep.expired, rep.revoked) == (1, 1, 1)
    d, g = store.get(due.id), store.get(gone.id)
    assert (
        d is not None and d.state is LeaseState.EXPIRED and d.reason == "expired while the gateway was down"
    )
    assert d.ended_at == 1010.0 and d.revision == due.revision + 1
    assert g is not None and g.state is LeaseState.REVOKED and g.reason.startswith("not restorable: ")
    assert [x.id for x in again.c.leases()] == [kept.id] and again.events == []


def test_recovery_forgets_tickets_ended_more_than_the_retention_ago_and_keeps_the_rest() -> None:
    store = MemoryLeaseStore()
    r = Rig(store=store)
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1, ttl_s=10_000)).granted
    old = r.c.acquire(a_request("old", priority=P1), wait_s=2.0)
    young = r.c.acquire(a_request("young", priority=P1), wait_s=3.0)
    assert old.ticket and young.ticket
    r.clock.advance(2.0)
    r.c.tick()  # "old" ends at 1002
    r.clock.advance(1.0)
    r.c.tick()  # "young" ends at 1003
    r.clock.advance(3599.5)  # now 4602.5: "old" ended 3600.5 s ago, "young" 3599.5 s ago
    again = Rig(store=store, clock=r.clock, seed=5)  # ended_retention_s: 3600 by default
    again.c.recover()
    assert store.get_ticket(old.ticket) is None
    with pytest.raises(UnknownId):
        again.c.ticket(old.ticket)
    assert again.c.ticket(young.ticket).state == "shed"


def test_a_request_naming_a_model_nobody_serves_is_a_placement_lease() -> None:
    r = Rig()
    out = r.c.acquire(replace(a_request("job", vram_gib=10, priority=P1), model="unserved"))
    assert out.granted and out.lease is not None and out.lease.slice_ids == ("g0",)
    assert r.c.backend_of(out.lease) is None and r.store.get(out.lease.id) == out.lease


def test_a_placed_grant_counts_toward_the_minimum_share_of_sheddable_work() -> None:
    # One-grant window, 50 % minimum share: after a P2 grant, sheddable work must respect the holds
    # of queued online work; after a P1 grant (here by `place`) it may take them again.
    r = Rig(
        a_slice("g0", gpu="g0", vram_gib=40),
        a_slice("g1", gpu="g1", vram_gib=40),
        admission=AdmissionConfig(share_window=1, p2_min_share=0.5),
    )
    assert r.c.acquire(a_request("big", vram_gib=40, priority=P1), gpu_id="g0").granted
    assert r.c.acquire(a_request("p2a", vram_gib=10, priority=P2), gpu_id="g1").granted
    assert r.c.acquire(a_request("waiting", vram_gib=40, priority=P1)).code is OutcomeCode.QUEUED
    assert r.c.place(a_request("placed", vram_gib=5, priority=P1), ("g1",)).granted
    assert r.c.outcomes[("P1", "granted")] == 2
    p2b = r.c.acquire(a_request("p2b", vram_gib=5, priority=P2))
    assert p2b.granted and p2b.lease is not None and p2b.lease.slice_ids == ("g1",)


def test_a_refused_placement_is_counted_and_not_taken_for_a_grant() -> None:
    r = Rig(
        a_slice("g0", gpu="g0", vram_gib=40),
        a_slice("g1", gpu="g1", vram_gib=40),
        admission=AdmissionConfig(share_window=1, p2_min_share=0.5),
    )
    assert r.c.acquire(a_request("big", vram_gib=40, priority=P1), gpu_id="g0").granted
    assert r.c.acquire(a_request("p2a", vram_gib=10, priority=P2), gpu_id="g1").granted
    assert r.c.acquire(a_request("waiting", vram_gib=40, priority=P1)).code is OutcomeCode.QUEUED
    refused = r.c.place(a_request("placed", vram_gib=40, priority=P1), ("g1",))
    assert refused.code is OutcomeCode.NO_CAPACITY and r.c.outcomes[("P1", "no_capacity")] == 1
    # the window still holds the P2 grant: sheddable work respects the online hold on g1
    assert r.c.acquire(a_request("p2b", vram_gib=5, priority=P2)).code is OutcomeCode.QUEUED


def test_priority_zero_is_online_work_and_ignores_a_pause() -> None:
    r = Rig()
    assert r.c.feed_reading(Reading("g0", 39 * 1024, 40 * 1024, at_s=r.clock.now())) is not None
    assert r.c.acquire(a_request("zero", priority=0), gpu_id="g0").granted
    assert r.c.acquire(a_request("minus", priority=-1), gpu_id="g0").code is OutcomeCode.BACKPRESSURE


def test_a_pump_pass_that_expires_placement_leases_offers_the_room_to_items_it_passed() -> None:
    # "a" waits for g0, held by "x" whose TTL has run out unexpired (no tick). A pump (a slice
    # marked healthy) tries "a" (blocked), then "b" (P2, node n1 only), whose placement expires "x":
    # a second pass gives "a" the room now.
    r = Rig(a_slice("g0", gpu="g0", vram_gib=40), a_slice("g1", gpu="g1", node="n1", vram_gib=40))
    x = r.c.acquire(a_request("x", vram_gib=40, priority=P1, ttl_s=5), gpu_id="g0").lease
    assert x is not None
    assert r.c.acquire(a_request("y", vram_gib=40, priority=P1, ttl_s=600), gpu_id="g1").granted
    a = r.c.acquire(a_request("a", vram_gib=40, priority=P1), gpu_id="g0", wait_s=60.0)
    b = r.c.acquire(a_request("b", vram_gib=10, priority=P2, nodes=("n1",)), wait_s=60.0)
    assert a.code is b.code is OutcomeCode.QUEUED and a.ticket and b.ticket
    r.clock.advance(5.0)
    r.c.mark_slice("g1", healthy=True)
    assert r.c.get(x.id).state is LeaseState.EXPIRED
    st = r.c.ticket(a.ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == ("g0",)
    assert r.c.ticket(b.ticket).state == "queued"


def test_the_last_4096_ended_request_leases_stay_known_and_older_ones_are_forgotten() -> None:
    r = Rig()
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    ids = []
    for i in range(4097):
        lease = r.c.acquire(replace(a_request(f"q{i}", vram_mib=10, priority=P1), model="m")).lease
        assert lease is not None
        r.c.release(lease.id)
        ids.append(lease.id)
    with pytest.raises(UnknownId):
        r.c.get(ids[0])  # request leases live in memory only: the oldest ended one is gone
    assert r.c.release(ids[1]).code is OutcomeCode.ALREADY_ENDED
    assert r.c.get(ids[1]).state is LeaseState.RELEASED


def test_an_undo_also_undoes_the_changes_made_after_the_batch_was_taken() -> None:
    # The gateway's group commit: take_batch, more calls while the store works, then the store fails.
    r = Rig(a_slice("g0", gpu="g0", vram_gib=40), a_slice("g1", gpu="g1", vram_gib=40))
    r.c.autoflush = False
    first = r.c.acquire(a_request("first", vram_gib=40, priority=P1), gpu_id="g0").lease
    assert first is not None
    batch = r.c.take_batch()
    later = r.c.acquire(a_request("later", vram_gib=40, priority=P1), gpu_id="g1").lease
    waiting = r.c.acquire(a_request("waiting", vram_gib=40, priority=P1))
    assert later is not None and waiting.ticket
    r.c.undo(batch, "disk full")
    assert r.c.leases() == []
    with pytest.raises(UnknownId):
        r.c.get(later.id)
    st = r.c.ticket(waiting.ticket)
    assert (st.state, st.reason) == ("failed", "lease store unavailable: disk full")
    assert [s.granted.vram_mib for s in r.c.allocator.states()] == [0, 0]
    r.c.check_invariants()


def test_events_without_writes_are_delivered_too() -> None:
    r = Rig()
    ev = r.c.feed_reading(Reading("g0", 39 * 1024, 40 * 1024, at_s=r.clock.now()))  # pause: no write
    assert ev is not None and r.events == [ev] and r.c.dirty is False
    r.c.autoflush = False
    ev2 = r.c.feed_reading(Reading("g0", 1, 40 * 1024, at_s=r.clock.now()))
    assert ev2 is not None and r.c.dirty is True and r.events == [ev]
    assert r.c.flush() == 0 and r.events == [ev, ev2] and r.c.dirty is False


def test_a_request_lease_does_not_jump_a_queued_one_that_holds_its_budget() -> None:
    r = Rig()
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    assert r.c.acquire(replace(a_request("h", vram_mib=60, priority=P1), model="m")).granted
    a = r.c.acquire(replace(a_request("a", vram_mib=50, priority=P1, tenant="a"), model="m"))
    assert a.code is OutcomeCode.QUEUED
    b = r.c.acquire(replace(a_request("b", vram_mib=30, priority=P1, tenant="b"), model="m"))
    assert b.code is OutcomeCode.QUEUED  # 40 MiB free, but "a" waits for that budget
    assert r.c.acquire(replace(a_request("p0", vram_mib=30, priority=P0), model="m")).granted


def test_request_leases_may_ask_up_to_one_whole_compute_unit() -> None:
    r = Rig()
    r.c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=100))
    out = r.c.acquire(replace(a_request("all", vram_mib=10, compute=1000, priority=P1), model="m"))
    assert out.granted and out.lease is not None and r.c.backend_of(out.lease) is r.c.backends["be"]


def test_a_queued_p0_preempts_when_pumped_once_nothing_ahead_holds_capacity() -> None:
    # "v" (aimed at g1) and "u" (anywhere) wait; "u" may not preempt while "v" holds g1. g1 fails:
    # "v" becomes unresolvable and fails, and "u", first now, preempts the batch lease on g0.
    r = Rig(a_slice("g0", gpu="g0", vram_gib=40), a_slice("g1", gpu="g1", vram_gib=40))
    batch = r.c.acquire(a_request("batch", vram_gib=40, priority=P2), gpu_id="g0").lease
    assert batch is not None
    assert r.c.acquire(a_request("firm", vram_gib=40, priority=P1), gpu_id="g1").granted
    v = r.c.acquire(a_request("v", vram_gib=40, priority=P0), gpu_id="g1")
    u = r.c.acquire(a_request("u", vram_gib=40, priority=P0))
    assert v.code is u.code is OutcomeCode.QUEUED and v.ticket and u.ticket and r.c.preemptions == 0
    r.c.mark_slice("g1", healthy=False, revoke=True)
    assert r.c.ticket(v.ticket).state == "failed"
    st = r.c.ticket(u.ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == ("g0",)
    assert r.c.get(batch.id).state is LeaseState.PREEMPTED
    assert r.c.preemptions == 1 and r.c.outcomes[("P0", "granted_from_queue")] == 1


def test_after_a_restart_a_granted_ticket_points_at_its_ended_lease() -> None:
    store = MemoryLeaseStore()
    r = Rig(store=store)
    holder = r.c.acquire(a_request("holder", vram_gib=40, priority=P1)).lease
    q = r.c.acquire(a_request("w", vram_gib=40, priority=P1))
    assert holder is not None and q.ticket
    r.c.release(holder.id)
    lease = r.c.ticket(q.ticket).lease
    assert lease is not None
    r.c.release(lease.id)
    again = Rig(store=store, clock=r.clock, seed=5)
    again.c.recover()
    st = again.c.ticket(q.ticket)
    assert st.state == "granted" and st.lease is not None
    assert st.lease.id == lease.id and st.lease.state is LeaseState.RELEASED


def test_recovery_sheds_a_ticket_whose_band_is_full_and_still_restores_the_later_ones() -> None:
    store = MemoryLeaseStore()
    r = Rig(store=store)
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P0, ttl_s=600)).granted
    a = r.c.acquire(a_request("a", priority=P1), wait_s=600.0)
    r.clock.advance(1.0)  # recovery takes stored tickets in the order they were queued
    b = r.c.acquire(a_request("b", priority=P1), wait_s=600.0)
    r.clock.advance(1.0)
    c = r.c.acquire(a_request("c", priority=P0, preemptible=False), wait_s=600.0)
    assert a.ticket and b.ticket and c.ticket
    again = Rig(store=store, clock=r.clock, seed=5, admission=AdmissionConfig(max_per_band=1))
    again.c.recover()
    assert a.ticket in again.c.queue and c.ticket in again.c.queue and len(again.c.queue) == 2
    st = again.c.ticket(b.ticket)
    assert (st.state, st.reason) == ("shed", "queue of band P1 is full")
    assert store.get_ticket(b.ticket).state == "shed"  # type: ignore[union-attr]


def test_a_refused_batch_fails_its_queued_tickets_even_after_one_it_touched_left_memory() -> None:
    store = FaultyStore(MemoryLeaseStore())
    r = Rig(store=store, ticket_memory=1)
    r.c.autoflush = False
    assert r.c.acquire(a_request("full", vram_gib=40, priority=P1)).granted
    early = r.c.acquire(a_request("early", priority=P1), wait_s=1.0)
    assert early.ticket
    r.c.flush()
    r.clock.advance(2.0)
    r.c.tick()  # "early" is shed (not yet durable)...
    later = r.c.acquire(a_request("later", priority=P1), wait_s=60.0)
    assert later.ticket  # ...and leaves memory for "later" (memory of one ticket)
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError):
        r.c.flush()
    st = r.c.ticket(later.ticket)
    assert (st.state, st.reason) == ("failed", f"lease store unavailable: {DISK_FULL}")
    assert later.ticket not in r.c.queue


# ---------------------------------------------------------------- the pending batch's ids
def test_pending_ids_name_the_leases_and_tickets_the_next_batch_writes_and_empty_after_take() -> None:
    r = Rig(a_slice("g0", gpu="g0", vram_gib=40))
    r.c.autoflush = False
    one = r.c.acquire(a_request("one", vram_gib=30, priority=P1)).lease
    queued = r.c.acquire(a_request("two", vram_gib=30, priority=P1), wait_s=60)
    assert one is not None and queued.ticket
    assert set(r.c.pending_ids()) == {one.id, "ticket:" + queued.ticket}
    r.c.flush()
    assert list(r.c.pending_ids()) == []
    r.c.renew(one.id, ttl_s=600)
    assert list(r.c.pending_ids()) == [one.id]
