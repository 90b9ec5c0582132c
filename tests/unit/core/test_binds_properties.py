"""Hypothesis: extender binds (compare-and-set keyed by pod UID) interleaved with lease-API acquires,
releases, retried and stale binds, expiry, preemption and restarts, all on ONE `LeaseController`.

Invariants after every step:
- no card is over-committed: the ledger's books equal a recomputation from the active leases and
  stay within capacity (`check_invariants`, which also proves the card index and its memo current);
- a pod UID maps to at most one active lease, and `bound` answers exactly that lease;
- the store holds exactly the active leases the ledger holds, at the same revisions (every bind,
  release and expiry is durable in the same store as the gateway's leases), also after the store
  refused a bind's batch (the controller undid it: the pod keeps the lease it had, or none);
- a retried bind to the same node grants nothing new (same lease id); a re-bind to another node that
  finds no room keeps the lease the pod held; a stale unbind (old lease id) never ends the lease the
  pod holds now;
- the lease API never shows a pod's lease to a tenant, nor lets one release it;
- the card index agrees with the grant: a single-card pod's bind is granted exactly when the index
  said FIT for that node just before.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import OutcomeCode, Request, Resources, SliceKind
from gpupool.core.binds import bind_key
from gpupool.core.cardindex import FIT
from gpupool.core.clock import ManualClock
from gpupool.core.controller import LeaseController
from gpupool.core.errors import UnknownId
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.ports import Write
from tests.builders import a_slice

PODS = [f"uid-{i}" for i in range(6)]


class FullDisk(OSError):
    pass


class FaultyStore(MemoryLeaseStore):
    """The reference store, refusing the next batch when told to (a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next = False

    def apply(self, writes: Sequence[Write]) -> None:
        if self.fail_next:
            self.fail_next = False
            raise FullDisk("no space left on device")
        super().apply(writes)


NODES = ["n0", "n1", "n2"]


def _slices() -> list:
    out = []
    for n in NODES[:2]:
        out.append(a_slice(f"{n}/g0", vram_gib=80, node=n, gpu=f"{n}/g0"))
        out.append(a_slice(f"{n}/g1", vram_gib=24, node=n, gpu=f"{n}/g1"))
        out += [
            a_slice(f"{n}/g2/mig{i}", vram_gib=10, compute=142, kind=SliceKind.MIG, node=n, gpu=f"{n}/g2")
            for i in range(2)
        ]
    out.append(a_slice("n2/g0", vram_gib=48, node="n2", gpu="n2/g0"))
    return out


def _pod(uid: str, vram_gib: int, pct: int, priority: int, cards: int = 1) -> Request:
    return Request(
        id=uid,
        tenant="team",
        priority=priority,
        demand=Resources(vram_gib * 1024, pct * 10),
        ttl_s=60.0,
        gpu_count=cards,
        kinds=frozenset({SliceKind.WHOLE}) if cards > 1 else frozenset(),
        labels=(("pod", f"team/{uid}"),),
    )


class OneLedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        self.store = FaultyStore()
        self.ids = seeded_lease_ids(3)
        self.c = self._open()
        self.n = 0
        self.seen: dict[str, str] = {}
        """pod UID -> the last lease id a bind returned for it (for stale unbinds)."""

    def _open(self) -> LeaseController:
        c = LeaseController(_slices(), clock=self.clock, store=self.store, lease_ids=self.ids)
        c.recover()
        return c

    # ------------------------------------------------------------------ extender side
    @rule(
        uid=st.sampled_from(PODS),
        node=st.sampled_from(NODES),
        vram_gib=st.integers(1, 60),
        pct=st.sampled_from([5, 20, 50, 100]),
        priority=st.sampled_from([-1, 50, 100]),
    )
    def bind(self, uid: str, node: str, vram_gib: int, pct: int, priority: int) -> None:
        request = _pod(uid, vram_gib, pct, priority)
        held = self.c.bound(uid)
        status = self.c.cards.verdicts(request, [node])[0][0]
        out = self.c.bind(uid, request, node)
        if held is not None and held.node == node:
            assert out.granted and out.lease == held, (out, held)  # idempotent: nothing new
        else:
            assert out.granted == (status == FIT), (status, out)
        if out.granted:
            assert out.lease is not None and out.lease.node == node
            assert self.c.bound(uid) == out.lease
            self.seen[uid] = out.lease.id
        else:
            assert self.c.bound(uid) == held  # a re-bind that found no room keeps the first lease

    @rule(uid=st.sampled_from(PODS), node=st.sampled_from(NODES[:2]), priority=st.sampled_from([-1, 100]))
    def bind_two_cards(self, uid: str, node: str, priority: int) -> None:
        request = _pod(uid, 20, 100, priority, cards=2)
        held = self.c.bound(uid)
        status = self.c.cards.verdicts(request, [node])[0][0]
        out = self.c.bind(uid, request, node)
        if held is None or held.node != node:
            assert out.granted == (status == FIT), (status, out)

    @rule(
        uid=st.sampled_from(PODS),
        node=st.sampled_from(NODES),
        vram_gib=st.integers(1, 30),
    )
    def bind_while_the_store_fails(self, uid: str, node: str, vram_gib: int) -> None:
        """The store refuses the bind's batch: the controller undoes it, the pod keeps what it had."""
        held = self.c.bound(uid)
        self.store.fail_next = True
        try:
            out = self.c.bind(uid, _pod(uid, vram_gib, 20, 50), node)
        except FullDisk:
            assert self.c.bound(uid) == held
        else:  # nothing to write (already bound there, or no room): the store was not asked
            self.store.fail_next = False
            assert not out.granted or out.lease == held

    @rule(uid=st.sampled_from(PODS))
    def retry_bind(self, uid: str) -> None:
        held = self.c.bound(uid)
        if held is None:
            return
        out = self.c.bind(uid, held.request, held.node)
        assert out.granted and out.lease is not None and out.lease.id == held.id

    @rule(uid=st.sampled_from(PODS), stale=st.booleans())
    def unbind(self, uid: str, stale: bool) -> None:
        held = self.c.bound(uid)
        old = self.seen.get(uid)
        if stale and old is not None and (held is None or held.id != old):
            assert self.c.unbind(uid, reason="stale", lease_id=old) is None
            assert self.c.bound(uid) == held
            return
        ended = self.c.unbind(uid, reason="pod deleted")
        assert (ended is None) == (held is None)
        assert self.c.bound(uid) is None

    # ------------------------------------------------------------------ lease API side
    @rule(
        vram_gib=st.integers(1, 70),
        pct=st.sampled_from([10, 30, 100]),
        priority=st.sampled_from([-1, 50, 100]),
    )
    def acquire(self, vram_gib: int, pct: int, priority: int) -> None:
        self.n += 1
        req = Request(
            id=f"api-{self.n}",
            tenant="api",
            priority=priority,
            demand=Resources(vram_gib * 1024, pct * 10),
            ttl_s=30.0,
        )
        out = self.c.acquire(req, wait_s=5.0)
        for v in out.victims:
            assert v.request.priority < priority

    @precondition(lambda self: any(x.request.tenant == "api" for x in self.c.leases()))
    @rule(data=st.data())
    def release_api(self, data: st.DataObject) -> None:
        mine = [x for x in self.c.leases() if x.request.tenant == "api"]
        lease = data.draw(st.sampled_from(mine))
        assert self.c.release(lease.id).code is OutcomeCode.RELEASED

    @rule(uid=st.sampled_from(PODS))
    def tenant_cannot_touch_a_pod_lease(self, uid: str) -> None:
        """The pods' namespace is also a lease-API tenant here: it neither sees nor releases them."""
        held = self.c.bound(uid)
        if held is None:
            return
        with pytest.raises(UnknownId):
            self.c.release(held.id, tenant=held.request.tenant)
        assert held.id not in {x.id for x in self.c.leases(tenant=held.request.tenant)}
        assert self.c.bound(uid) == held

    @rule(dt=st.sampled_from([1.0, 20.0, 45.0]))
    def time_passes(self, dt: float) -> None:
        self.clock.advance(dt)
        self.c.tick()

    @rule(uid=st.sampled_from(PODS))
    def renew(self, uid: str) -> None:
        held = self.c.bound(uid)
        assert self.c.renew_bound(uid) == (held is not None)

    @rule()
    def restart(self) -> None:
        before = {k: self.c.bound(k) for k in self.c.bound_keys()}
        self.c = self._open()
        after = {k: self.c.bound(k) for k in self.c.bound_keys()}
        assert {k: v.id for k, v in after.items() if v} == {k: v.id for k, v in before.items() if v}

    # ------------------------------------------------------------------ invariants
    @invariant()
    def books_and_index(self) -> None:
        self.c.check_invariants()
        self.c.cards.check()

    @invariant()
    def one_lease_per_pod(self) -> None:
        per: dict[str, list[str]] = {}
        for lease in self.c.allocator.leases:
            key = bind_key(lease)
            if key is not None:
                per.setdefault(key, []).append(lease.id)
        for key, ids in per.items():
            assert len(ids) == 1, (key, ids)
            bound = self.c.bound(key)
            assert bound is not None and bound.id == ids[0]
        assert set(self.c.bound_keys()) == set(per)

    @invariant()
    def store_equals_ledger(self) -> None:
        stored = {x.id: x.revision for x in self.store.active()}
        held = {x.id: x.revision for x in self.c.allocator.leases}
        assert stored == held


OneLedgerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestOneLedger = OneLedgerMachine.TestCase
