"""A reproducible load mix for the admission queue: N clients of two tenants on a virtual clock, each
acquiring a random P0/P1/P2 request, holding the lease a while, releasing it, and acquiring again;
a queued client waits for its ticket. Records, for every acquire, the outcome and the fraction of
the pool's VRAM granted at that moment.

Used by the head-of-line regression test (as a property) and runnable as a measurement:
``python -m tests.unit.core.load_mix [seed ...]`` prints the fraction answered 202 while the pool's
VRAM was far from full.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P1, P2, ManualClock, OutcomeCode, SliceKind
from gpupool.core.controller import LeaseController
from gpupool.core.ids import seeded_lease_ids
from gpupool.hardware.slices import Slice
from tests.builders import a_request, a_slice


def mix_pool() -> list[Slice]:
    """Two nodes of four whole 80 GiB cards, four 40 GiB MIG slices and two 44 GiB MPS shares."""
    out = [a_slice(f"n{n}/g{g}", node=f"n{n}", gpu=f"n{n}/g{g}") for n in range(2) for g in range(4)]
    out += [
        a_slice(f"m/g{g}/mig", node="m", gpu=f"m/g{g}", kind=SliceKind.MIG, vram_gib=40, compute=428)
        for g in range(4)
    ]
    out += [
        a_slice(f"p/g{g}/mps", node="p", gpu=f"p/g{g}", kind=SliceKind.MPS, vram_gib=44, compute=800)
        for g in range(2)
    ]
    return out


@dataclass
class MixResult:
    acquires: int = 0
    codes: dict[str, int] = field(default_factory=dict)
    roomy: int = 0
    """Acquires made while less than ``roomy_below`` of the pool's VRAM was granted."""
    roomy_queued: int = 0
    """Of those, the ones answered QUEUED (HTTP 202)."""
    granted_from_queue: int = 0
    used_samples: list[float] = field(default_factory=list)

    @property
    def roomy_queued_fraction(self) -> float:
        return self.roomy_queued / self.roomy if self.roomy else 0.0

    @property
    def mean_used(self) -> float:
        return sum(self.used_samples) / len(self.used_samples) if self.used_samples else 0.0


def _random_request(rng: random.Random, rid: str, tenant: str):  # type: ignore[no-untyped-def]
    prio = rng.choice((P0, P1, P1, P2, P2))
    shape = rng.random()
    if shape < 0.1:
        return a_request(rid, vram_gib=rng.choice((40, 80)), priority=prio, tenant=tenant, gpu_count=2)
    if shape < 0.25:
        kinds = (rng.choice((SliceKind.MIG, SliceKind.MPS)),)
        return a_request(rid, vram_gib=rng.choice((4, 8, 16, 24)), priority=prio, tenant=tenant, kinds=kinds)
    return a_request(rid, vram_gib=rng.choice((2, 4, 8, 16, 24, 40, 60, 80)), priority=prio, tenant=tenant)


def run_mix(
    seed: int = 0, *, clients: int = 48, duration_s: float = 300.0, roomy_below: float = 0.7
) -> MixResult:
    rng = random.Random(seed)
    clock = ManualClock(1000.0)
    pool = mix_pool()
    total = sum(s.capacity.vram_mib for s in pool)
    c = LeaseController(
        pool,
        clock=clock,
        store=MemoryLeaseStore(),
        lease_ids=seeded_lease_ids(seed),
        ticket_ids=seeded_lease_ids(seed + 1),
    )
    res = MixResult()
    # per client: ("idle", at) | ("wait", ticket) | ("hold", lease_id, until)
    state: list[tuple[object, ...]] = [("idle", 1000.0 + rng.random()) for _ in range(clients)]
    n = 0
    end = clock.now() + duration_s
    while clock.now() < end:
        order = list(range(clients))
        rng.shuffle(order)
        for i in order:
            st = state[i]
            now = clock.now()
            if st[0] == "idle" and now >= st[1]:  # type: ignore[operator]
                n += 1
                used = sum(x.total.vram_mib for x in c.leases()) / total
                res.used_samples.append(used)
                out = c.acquire(_random_request(rng, f"r{n}", f"tenant-{i % 2}"), wait_s=30.0)
                res.acquires += 1
                res.codes[out.code.value] = res.codes.get(out.code.value, 0) + 1
                if used < roomy_below:
                    res.roomy += 1
                    res.roomy_queued += out.code is OutcomeCode.QUEUED
                if out.lease is not None:
                    state[i] = ("hold", out.lease.id, now + rng.uniform(1.0, 20.0))
                elif out.code is OutcomeCode.QUEUED and out.ticket:
                    state[i] = ("wait", out.ticket)
                else:
                    state[i] = ("idle", now + 1.0)
            elif st[0] == "wait":
                t = c.ticket(str(st[1]))
                if t.state == "granted" and t.lease is not None:
                    res.granted_from_queue += 1
                    state[i] = ("hold", t.lease.id, now + rng.uniform(1.0, 20.0))
                elif t.state != "queued":
                    state[i] = ("idle", now + 1.0)
            elif st[0] == "hold" and now >= st[2]:  # type: ignore[operator]
                c.release(str(st[1]))
                state[i] = ("idle", now + rng.uniform(0.0, 2.0))
        clock.advance(0.25)
        c.tick()
    c.check_invariants()
    return res


if __name__ == "__main__":
    for s in [int(a) for a in sys.argv[1:]] or [0, 1, 2]:
        r = run_mix(s)
        print(
            f"seed {s}: {r.acquires} acquires, {r.roomy} while < 70 % of VRAM granted, "
            f"{r.roomy_queued_fraction:.1%} of those answered 202; mean granted VRAM {r.mean_used:.1%}; "
            f"codes {dict(sorted(r.codes.items()))}"
        )
