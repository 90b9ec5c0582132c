"""Hypothesis: the admission rule of `gpupool.core.admission`, through the controller, over random
sequences of acquire (kinds, nodes, GPU, 1 or 2 cards, P0/P1/P2, two tenants) / release / cancel /
time passing (lease expiry, queue deadlines) / pause and resume of a GPU.

Checked after every step, for every queued request N (the rule's one-directional promise):
  no request waits while capacity it could take now is free, unless a queued request of its band or
  a higher one could use that very capacity.
Precisely: for one GPU, every healthy slice in N's scope with room for N now (on an unpaused GPU for
sheddable work) can be used by some other queued request W with W.priority >= N.priority; for N
cards, no node has N free cards fit for it that no such W could use. Plus: the books balance.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P1, P2, ManualClock, SliceKind
from gpupool.core.controller import ControllerConfig, LeaseController
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.ledger import SliceState
from gpupool.core.model import Request
from gpupool.core.watermarks import Reading
from tests.builders import GIB, a_request, a_slice

NODES = ("n0", "n1")


def pool() -> list:  # type: ignore[type-arg]
    out = []
    for n in NODES:
        out += [a_slice(f"{n}/c{g}", node=n, gpu=f"{n}/c{g}", vram_gib=80) for g in range(2)]
        out.append(a_slice(f"{n}/mig", node=n, gpu=f"{n}/m", vram_gib=40, compute=428, kind=SliceKind.MIG))
        out.append(a_slice(f"{n}/mps", node=n, gpu=f"{n}/p", vram_gib=24, compute=500, kind=SliceKind.MPS))
    return out


def could_use(st_: SliceState, r: Request, gpu_id: str) -> bool:
    s = st_.slice
    return (
        st_.healthy
        and (not gpu_id or s.gpu_id == gpu_id)
        and (not r.nodes or s.node in r.nodes)
        and r.accepts(s.kind)
        and r.demand.fits_in(s.capacity)
    )


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        self.c = LeaseController(
            pool(),
            clock=self.clock,
            store=MemoryLeaseStore(),
            lease_ids=seeded_lease_ids(1),
            ticket_ids=seeded_lease_ids(2),
            config=ControllerConfig(),
        )
        self.n = 0

    @rule(
        prio=st.sampled_from([P0, P1, P1, P2, P2]),
        gib=st.sampled_from([2, 8, 16, 24, 40, 60, 80]),
        kinds=st.sampled_from([(), (SliceKind.WHOLE,), (SliceKind.MIG,), (SliceKind.MPS, SliceKind.MIG)]),
        node=st.sampled_from(["", "n0", "n1"]),
        gpu=st.sampled_from(["", "", "", "n0/c0", "n1/m"]),
        cards=st.sampled_from([1, 1, 1, 2]),
        tenant=st.sampled_from(["a", "b"]),
        wait_s=st.sampled_from([1.0, 5.0, 60.0]),
    )
    def acquire(
        self,
        prio: int,
        gib: int,
        kinds: tuple[SliceKind, ...],
        node: str,
        gpu: str,
        cards: int,
        tenant: str,
        wait_s: float,
    ) -> None:
        self.n += 1
        if cards > 1:
            kinds, gpu = (SliceKind.WHOLE,), ""
        r = a_request(
            f"r{self.n}",
            vram_gib=gib,
            priority=prio,
            tenant=tenant,
            kinds=kinds,
            gpu_count=cards,
            nodes=(node,) if node else (),
        )
        self.c.acquire(r, wait_s=wait_s, gpu_id=gpu)

    @rule(i=st.integers(0, 50))
    def release(self, i: int) -> None:
        leases = self.c.leases()
        if leases:
            self.c.release(leases[i % len(leases)].id)

    @rule(i=st.integers(0, 50))
    def cancel(self, i: int) -> None:
        queued = list(self.c.queue)
        if queued:
            self.c.cancel(queued[i % len(queued)].ticket)

    @rule(dt=st.sampled_from([0.5, 2.0, 30.0]))
    def time_passes(self, dt: float) -> None:
        self.clock.advance(dt)
        self.c.tick()

    @rule(gpu=st.sampled_from(["n0/c0", "n0/c1", "n1/m"]), hot=st.booleans())
    def reading(self, gpu: str, hot: bool) -> None:
        used = 79 if hot else 10
        self.c.feed_reading(
            Reading(gpu, vram_used_mib=used * GIB, vram_total_mib=80 * GIB, at_s=self.clock.now())
        )

    @invariant()
    def books_balance(self) -> None:
        self.c.check_invariants()
        assert len(list(self.c.queue)) == len(self.c.queue)

    @invariant()
    def nobody_waits_for_free_capacity_nobody_above_could_use(self) -> None:
        c = self.c
        queued = list(c.queue)
        states = {sid: c.allocator.ledger.state(sid) for sid in c.allocator.ledger.slice_ids()}
        paused = c.paused_gpus()
        for n in queued:
            r = n.request
            rivals = [w for w in queued if w.ticket != n.ticket and w.priority >= n.priority]

            def claimed(sid: str, rivals: list = rivals) -> bool:  # type: ignore[type-arg]
                return any(could_use(states[sid], w.request, w.gpu_id) for w in rivals)

            def open_now(s: SliceState, r: Request = r, gpu: str = n.gpu_id) -> bool:
                if not could_use(s, r, gpu) or (r.priority < 0 and s.slice.gpu_id in paused):
                    return False
                if r.gpu_count > 1:
                    return s.num_leases == 0
                return r.demand.fits_in(s.free)

            if r.gpu_count == 1:
                free = [sid for sid, s in states.items() if open_now(s)]
                assert all(claimed(sid) for sid in free), (n.ticket, r, [x for x in free if not claimed(x)])
            else:
                for node in NODES:
                    cards = [sid for sid, s in states.items() if s.slice.node == node and open_now(s)]
                    unclaimed = [sid for sid in cards if not claimed(sid)]
                    assert len(unclaimed) < r.gpu_count, (n.ticket, r, unclaimed)


AdmissionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestAdmissionRule = AdmissionMachine.TestCase
