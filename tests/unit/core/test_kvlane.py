"""The KV lane (`core/kvlane.py`): request leases granted inside share leases of the KV budgets.

What it must keep: the KV ledger sees every MiB in use (the share), never more than a budget is
promised, queued requests see the true free room (shares yielded before queueing and pumping), the
most-free backend wins as on the allocator's path, ended and revoked lane leases answer like any
other lease, tenants cannot touch another's lease nor anyone the lane's shares; and under any
sequence of grants, releases, renewals, expiries and drains the invariants hold (Hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import ManualClock
from gpupool.core.controller import KV_PREFIX, LeaseController
from gpupool.core.errors import UnknownId
from gpupool.core.kvlane import COMPACT_SLACK, SHARE_TENANT
from gpupool.core.model import LeaseState, Request
from gpupool.core.outcome import OutcomeCode
from gpupool.core.ports import Backend
from gpupool.core.watermarks import Reading
from gpupool.hardware.units import Resources

MODEL = "qwen2.5-0.5b"
_ids = itertools.count()


def _controller(*budgets: int) -> tuple[LeaseController, ManualClock]:
    clock = ManualClock(1000.0)
    c = LeaseController(seed_example_pool(), clock=clock, store=MemoryLeaseStore())
    for i, b in enumerate(budgets or (1000,)):
        c.register_backend(Backend(f"be{i}", MODEL, "http://127.0.0.1:9", "gpu-b", "gpu-b/0", b))
    return c, clock


def _req(mib: int, *, tenant: str = "t", priority: int = 1, ttl_s: float = 60.0) -> Request:
    return Request(
        id=f"r{next(_ids)}",
        tenant=tenant,
        priority=priority,
        demand=Resources(mib, 0),
        ttl_s=ttl_s,
        model=MODEL,
    )


def _kv_used(c: LeaseController, backend: str = "be0") -> int:
    st = c.kv.ledger.state(KV_PREFIX + backend)
    return st.slice.capacity.vram_mib - st.free.vram_mib


def test_lane_grants_are_booked_in_the_ledger_and_released() -> None:
    c, _ = _controller(1000)
    a = c.acquire(_req(100)).lease
    b = c.acquire(_req(50)).lease
    assert a is not None and b is not None and c.request_lease_count() == 2
    assert c.lane.usage(KV_PREFIX + "be0")[1] == 150
    assert _kv_used(c) >= 150  # the share covers what the lane promised
    assert {x.id for x in c.leases()} >= {a.id, b.id}
    assert not [x for x in c.leases() if x.request.tenant == SHARE_TENANT]  # shares are not listed
    assert c.release(a.id).code is OutcomeCode.RELEASED
    again = c.release(a.id)
    assert again.code is OutcomeCode.ALREADY_ENDED and again.lease is not None
    assert c.get(a.id).state is LeaseState.RELEASED
    c.release(b.id)
    assert c.request_lease_count() == 0
    c.lane.yield_all()
    assert _kv_used(c) == 0
    c.check_invariants()


def test_a_budget_is_never_overpromised_and_a_full_one_queues_with_true_free_room() -> None:
    c, _ = _controller(1000)
    held = [c.acquire(_req(300)).lease for _ in range(3)]
    assert all(x is not None for x in held)
    out = c.acquire(_req(200), wait_s=30.0)  # 100 MiB left: it must queue, not be granted
    assert out.code is OutcomeCode.QUEUED and out.ticket
    # before queueing, the lane gave back what its requests do not use
    assert _kv_used(c) == 900
    first = held[0]
    assert first is not None
    c.release(first.id)
    st = c.ticket(out.ticket)
    assert st.state == "granted" and st.lease is not None  # the freed MiB went to the queue at once
    c.check_invariants()
    assert _kv_used(c) == 800


def test_the_most_free_backend_wins_ties_by_id() -> None:
    c, _ = _controller(1000, 1000)
    first = c.acquire(_req(100)).lease
    second = c.acquire(_req(100)).lease
    assert first is not None and second is not None
    assert c.backend_of(first).id == "be0"  # type: ignore[union-attr]
    assert c.backend_of(second).id == "be1"  # type: ignore[union-attr]


def test_tenants_cannot_touch_other_leases_nor_the_shares() -> None:
    c, _ = _controller(1000)
    mine = c.acquire(_req(10, tenant="a")).lease
    assert mine is not None
    with pytest.raises(UnknownId):
        c.release(mine.id, tenant="b")
    with pytest.raises(UnknownId):
        c.get(mine.id, tenant="b")
    share = next(x for x in c.kv.leases if x.request.tenant == SHARE_TENANT)
    for call in (
        lambda: c.release(share.id),
        lambda: c.get(share.id),
        lambda: c.revoke(share.id, reason="x"),
    ):
        with pytest.raises(UnknownId):
            call()
    assert c.get(mine.id, tenant="a").state is LeaseState.ACTIVE


def test_renew_and_expiry_follow_the_clock() -> None:
    c, clock = _controller(1000)
    lease = c.acquire(_req(10, ttl_s=5.0)).lease
    assert lease is not None
    clock.advance(4.0)
    assert c.renew(lease.id, ttl_s=5.0).code is OutcomeCode.RENEWED
    clock.advance(4.0)
    c.tick()
    assert c.get(lease.id).state is LeaseState.ACTIVE  # renewed: due at 1009, now 1008
    clock.advance(2.0)
    c.tick()
    assert c.get(lease.id).state is LeaseState.EXPIRED and c.request_lease_count() == 0
    c.check_invariants()


def test_a_revoked_share_revokes_its_requests() -> None:
    c, _ = _controller(1000)
    lease = c.acquire(_req(10)).lease
    assert lease is not None
    share = next(x for x in c.kv.leases if x.request.tenant == SHARE_TENANT)
    c.kv.revoke(share.id, reason="GPU drained")  # what a drain does to every KV lease on the GPU
    assert c.get(lease.id).state is LeaseState.REVOKED
    assert c.release(lease.id).code is OutcomeCode.ALREADY_ENDED
    assert c.request_lease_count() == 0
    c.check_invariants()


def test_scoped_or_preemptible_requests_take_the_allocators_path() -> None:
    c, _ = _controller(1000)
    p2 = c.acquire(_req(10, priority=-1)).lease
    assert p2 is not None and c.lane.get(p2.id) is None and c.kv.leases.get(p2.id) is not None
    c.check_invariants()


class LaneMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.clock = _controller(500, 300)
        self.held: list[str] = []

    @rule(mib=st.integers(1, 400), prio=st.sampled_from([1, 0, -1]), queue=st.booleans())
    def acquire(self, mib: int, prio: int, queue: bool) -> None:
        out = self.c.acquire(_req(mib, priority=prio, ttl_s=30.0), wait_s=5.0 if queue else None)
        if out.lease is not None:
            self.held.append(out.lease.id)

    @rule(i=st.integers(0, 50))
    def release(self, i: int) -> None:
        if self.held:
            self.c.release(self.held.pop(i % len(self.held)))

    @rule(dt=st.floats(0.5, 20.0))
    def tick(self, dt: float) -> None:
        self.clock.advance(dt)
        self.c.tick()

    @rule(i=st.integers(0, 50))
    def renew(self, i: int) -> None:
        if self.held:
            self.c.renew(self.held[i % len(self.held)], ttl_s=30.0)

    @rule()
    def drain_shares(self) -> None:
        for x in list(self.c.kv.leases):
            if x.request.tenant == SHARE_TENANT:
                self.c.kv.revoke(x.id, reason="drained")

    @invariant()
    def consistent(self) -> None:
        self.c.check_invariants()
        for b, cap in (("be0", 500), ("be1", 300)):
            sid = KV_PREFIX + b
            promised = sum(x.total.vram_mib for x in self.c.request_leases() if x.slice_ids[0] == sid)
            assert promised <= cap
            assert promised <= _kv_used(self.c, b)  # the ledger sees at least what is promised


TestLaneMachine = LaneMachine.TestCase
TestLaneMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_request_lease_past_its_ttl_frees_its_room_for_the_next_acquire_without_a_tick() -> None:
    c, clock = _controller(100)
    old = c.acquire(_req(100, ttl_s=5.0)).lease
    assert old is not None
    clock.advance(6.0)
    new = c.acquire(_req(100))  # no tick in between: the due lease expires before this placement
    assert new.code is OutcomeCode.GRANTED
    assert c.get(old.id).state is LeaseState.EXPIRED
    c.check_invariants()


def test_listing_counts_and_reasons_cover_both_kinds_of_request_lease() -> None:
    c, clock = _controller(1000)
    lane = c.acquire(_req(10)).lease
    p2 = c.acquire(_req(10, priority=-1)).lease  # preemptible: the KV allocator's own lease
    assert lane is not None and p2 is not None
    assert {x.id for x in c.leases()} >= {lane.id, p2.id}
    assert {x.id for x in c.request_leases()} == {lane.id, p2.id}
    assert c.request_lease_count() == 2
    assert c.release(lane.id).lease.reason == "released by holder"  # type: ignore[union-attr]
    assert c.revoke(p2.id, reason="drained").code is OutcomeCode.RELEASED
    assert c.request_lease_count() == 0
    again = c.acquire(_req(10, ttl_s=7.0)).lease
    assert again is not None
    clock.advance(3.0)
    renewed = c.renew(again.id).lease  # no ttl given: the request's own
    assert renewed is not None and renewed.expires_at == clock.now() + 7.0
    c.release(again.id, reason="done")
    assert c.renew(again.id).code is OutcomeCode.ALREADY_ENDED
    assert c.get(again.id).reason == "done"


def test_released_leases_do_not_pile_up_in_the_expiry_heap_and_renewed_ones_still_expire() -> None:
    """A released lane lease leaves its expiry entry behind; the heap is compacted once it holds more
    than twice the active leases (+ a slack), keeping the live entry of a lease renewed since."""
    c, clock = _controller(100_000)
    kept = c.acquire(_req(10, ttl_s=60.0)).lease
    assert kept is not None
    c.renew(kept.id, ttl_s=600.0)
    for _ in range(5000):
        lease = c.acquire(_req(10)).lease
        assert lease is not None
        c.release(lease.id)
    assert len(c.lane._expiry) <= 2 * len(c.lane) + COMPACT_SLACK + 1
    clock.advance(120.0)  # past the original ttl, not the renewed one
    assert c.get(kept.id).state is LeaseState.ACTIVE
    clock.advance(600.0)
    c.acquire(_req(10))  # expiries run before the next KV placement
    assert c.get(kept.id).state is LeaseState.EXPIRED


def test_a_backend_taken_out_of_routing_keeps_the_room_of_its_running_requests() -> None:
    c, _ = _controller(1000)
    held = c.acquire(_req(100)).lease
    assert held is not None
    c.set_backend_routable("be0", False)  # its engine goes to sleep while a request runs on it
    assert c.acquire(_req(100)).code is OutcomeCode.UNRESOLVABLE  # (the only backend of the model)
    c.check_invariants()  # the running request's 100 MiB are still booked in the ledger
    assert _kv_used(c) >= 100
    assert c.release(held.id).code is OutcomeCode.RELEASED
    c.set_backend_routable("be0", True)


def test_a_drained_or_failed_gpu_takes_no_request_leases_and_revoking_ends_them() -> None:
    c, clock = _controller(1000)
    held = c.acquire(_req(100)).lease
    assert held is not None
    c.drain_gpu("gpu-b/0")  # kept, but no new request lease on the drained GPU
    assert c.get(held.id).state is LeaseState.ACTIVE
    assert c.acquire(_req(100)).code is OutcomeCode.UNRESOLVABLE
    c.undrain_gpu("gpu-b/0")
    assert c.acquire(_req(100)).granted
    c.drain_gpu("gpu-b/0", revoke=True, reason="maintenance")
    assert (c.get(held.id).state, c.get(held.id).reason) == (LeaseState.REVOKED, "maintenance")
    assert c.request_lease_count() == 0
    c.undrain_gpu("gpu-b/0")
    gib = 1024
    c.feed_reading(Reading("gpu-b/0", gib, 48 * gib, at_s=clock.now()), health="degraded")
    assert c.acquire(_req(100)).code is OutcomeCode.UNRESOLVABLE
    c.feed_reading(Reading("gpu-b/0", gib, 48 * gib, at_s=clock.now()), health="ok")
    again = c.acquire(_req(100)).lease
    assert again is not None
    c.feed_reading(Reading("gpu-b/0", gib, 48 * gib, at_s=clock.now()), health="failed", xids=(79,))
    assert c.get(again.id).state is LeaseState.REVOKED and "failed" in c.get(again.id).reason
    c.set_backend_routable("be0", False)  # a sleeping engine stays out of routing ...
    c.feed_reading(Reading("gpu-b/0", gib, 48 * gib, at_s=clock.now()), health="ok")
    assert c.acquire(_req(100)).code is OutcomeCode.UNRESOLVABLE
    c.set_backend_routable("be0", True)  # ... until it is woken
    assert c.acquire(_req(100)).granted
    c.drain_gpu("gpu-b/0")  # a restart drains again before it registers the backends
    c.register_backend(Backend("late", MODEL, "http://127.0.0.1:9", "gpu-b", "gpu-b/0", 1000))
    assert not c.kv.ledger.is_healthy(KV_PREFIX + "late")
    c.undrain_gpu("gpu-b/0")
    assert c.kv.ledger.is_healthy(KV_PREFIX + "late")
    c.check_invariants()
