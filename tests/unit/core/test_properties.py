"""Hypothesis: random sequences of allocate / release / renew / expire / preempt / mark-unhealthy.

Invariants checked after every step:
- per slice, granted + free == capacity, never negative (ledger.check + recomputation from leases);
- no active lease sits on an unhealthy slice unless it was there before the slice went unhealthy
  (new grants never land on unhealthy slices);
- no request is split across GPUs (multi-slice leases take distinct GPUs of one node);
- a lease is never preempted by an equal or lower priority;
- expiry reclaims exactly what was granted.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpupool.core import P0, P1, P2, LeaseState, OutcomeCode, SliceKind
from tests.builders import a_pool, a_request, a_slice

KINDS = [SliceKind.MIG, SliceKind.MPS, SliceKind.WHOLE]


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        slices = []
        for n in range(2):
            for g in range(3):
                gpu = f"n{n}/g{g}"
                if g == 0:
                    slices += [
                        a_slice(
                            f"{gpu}/mig3", vram_gib=40, compute=428, kind=SliceKind.MIG, node=f"n{n}", gpu=gpu
                        ),
                        a_slice(
                            f"{gpu}/mig1", vram_gib=10, compute=142, kind=SliceKind.MIG, node=f"n{n}", gpu=gpu
                        ),
                    ]
                elif g == 1:
                    slices += [
                        a_slice(
                            f"{gpu}/mps{i}",
                            vram_gib=12,
                            compute=250,
                            kind=SliceKind.MPS,
                            node=f"n{n}",
                            gpu=gpu,
                        )
                        for i in range(2)
                    ]
                else:
                    slices.append(a_slice(gpu, vram_gib=80, node=f"n{n}", gpu=gpu))
        self.alloc, self.clock = a_pool(*slices)
        self.slice_ids = [s.id for s in slices]
        self.unhealthy_since: dict[str, float] = {}
        self.n = 0

    @rule(
        vram_gib=st.integers(1, 45),
        compute=st.integers(0, 500),
        priority=st.sampled_from([P0, P1, P2]),
        kinds=st.lists(st.sampled_from(KINDS), max_size=2, unique=True),
        gpu_count=st.sampled_from([1, 1, 1, 2]),
        ttl=st.integers(1, 30),
        preempt=st.booleans(),
    )
    def allocate(
        self,
        vram_gib: int,
        compute: int,
        priority: int,
        kinds: list[SliceKind],
        gpu_count: int,
        ttl: int,
        preempt: bool,
    ) -> None:
        self.n += 1
        kinds_t = tuple(kinds) if gpu_count == 1 else ()
        req = a_request(
            f"r{self.n}", vram_gib=vram_gib, compute=compute, priority=priority, kinds=kinds_t,
            gpu_count=gpu_count, ttl_s=ttl,
        )  # fmt: skip
        out = self.alloc.allocate(req, preempt=preempt)
        if out.granted:
            lease = out.lease
            assert lease is not None
            assert len({g.gpu_id for g in lease.grants}) == len(lease.grants) == gpu_count
            for g in lease.grants:
                assert self.alloc.ledger.is_healthy(g.slice_id)
                assert req.accepts(self.alloc.ledger.slice(g.slice_id).kind)
            for v in out.victims:
                assert v.state is LeaseState.PREEMPTED
                assert v.priority < priority and v.request.is_preemptible
            if out.victims:
                assert preempt
        else:
            assert out.victims == ()

    @precondition(lambda self: len(self.alloc.leases) > 0)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(sorted(self.alloc.leases, key=lambda x: x.id)))
        assert self.alloc.release(lease.id).code is OutcomeCode.RELEASED
        assert self.alloc.release(lease.id).code is OutcomeCode.ALREADY_ENDED

    @precondition(lambda self: len(self.alloc.leases) > 0)
    @rule(data=st.data(), ttl=st.integers(1, 30))
    def renew(self, data: st.DataObject, ttl: int) -> None:
        lease = data.draw(st.sampled_from(sorted(self.alloc.leases, key=lambda x: x.id)))
        out = self.alloc.renew(lease.id, ttl)
        if out.code is OutcomeCode.RENEWED:
            assert out.lease is not None and out.lease.expires_at == self.clock.now() + ttl

    @rule(seconds=st.integers(0, 20))
    def advance_and_expire(self, seconds: int) -> None:
        self.clock.advance(seconds)
        before = {s.slice.id: s.granted for s in self.alloc.states()}
        expiring = [lease for lease in self.alloc.leases if lease.expires_at <= self.clock.now()]
        expired = self.alloc.expire_due()
        assert sorted(x.id for x in expired) == sorted(x.id for x in expiring)
        freed: dict[str, tuple[int, int]] = {}
        for lease in expired:
            for g in lease.grants:
                v, c = freed.get(g.slice_id, (0, 0))
                freed[g.slice_id] = (v + g.resources.vram_mib, c + g.resources.compute_milli)
        for s in self.alloc.states():
            v, c = freed.get(s.slice.id, (0, 0))
            assert before[s.slice.id].vram_mib - s.granted.vram_mib == v
            assert before[s.slice.id].compute_milli - s.granted.compute_milli == c

    @rule(data=st.data(), revoke=st.booleans())
    def mark_unhealthy(self, data: st.DataObject, revoke: bool) -> None:
        sid = data.draw(st.sampled_from(self.slice_ids))
        on = self.alloc.mark_unhealthy(sid, revoke=revoke)
        assert all(sid in lease.slice_ids for lease in on)
        self.unhealthy_since.setdefault(sid, self.clock.now())

    @precondition(lambda self: bool(self.unhealthy_since))
    @rule(data=st.data())
    def mark_healthy(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.unhealthy_since)))
        self.alloc.mark_healthy(sid)
        del self.unhealthy_since[sid]

    @invariant()
    def books_balance(self) -> None:
        self.alloc.check_invariants()
        for s in self.alloc.states():
            assert (s.granted + s.free) == s.slice.capacity
            assert s.granted.is_nonnegative() and s.free.is_nonnegative()

    @invariant()
    def no_new_lease_on_unhealthy_slices(self) -> None:
        for lease in self.alloc.leases:
            for sid in lease.slice_ids:
                since = self.unhealthy_since.get(sid)
                if since is not None:
                    assert lease.granted_at <= since


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
