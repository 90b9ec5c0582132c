"""`gpupool bench allocator`: steady-state allocate + release cost, gpupool vs the seed's reference.

Method (same for both schedulers):
1. Build a heterogeneous pool of S slices: A100-80GB cards cut 3g.40gb + 2g.20gb + 2 x 1g.10gb
   (4 slices per card), L40S-48GB cards shared as 4 MPS shares of 12 GiB / 25 % (4 per card), and
   whole H100-80GB cards, in a 4:4:2 rotation until S slices exist.
2. Pre-fill to ~70 % of pool VRAM with gpupool, then copy the exact same leases into the seed's
   structures, so both start from the same state.
3. Time N pairs of (release a uniformly random active lease, allocate the next request of one
   seeded stream): priorities P0/P1/P2 30/30/40 %, sizes from 1 GiB guardrails to 36 GiB LLMs, some
   pinned to MIG or MPS. Both schedulers see the same request stream and the same random choices.
4. ``occupancy_start_pct`` is the pool's granted VRAM share after step 2, before any timed pair;
   ``occupancy_end_pct`` after gpupool's timed pairs (the steady state they kept).
5. The seed's reference is O(S) per call, so at large S it is timed over fewer pairs
   (``seed_pairs = max(30, min(seed_ops, 2_000_000 // S))``); per-op figures are comparable.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpupool.bench import seed_scheduler as seed
from gpupool.core import P0, P1, P2, Allocator, ManualClock, Request, Resources, Slice, SliceKind
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.policies import DEFAULT_POLICY

GIB = 1024

_SEED_PRIORITY = {P0: seed.P0_CRITICAL_AGENT, P1: seed.P1_ONLINE_EMBEDDING, P2: seed.P2_OFFLINE_BATCH}
_SEED_KIND = {
    SliceKind.MIG: "MIG_HARDWARE",
    SliceKind.MPS: "MPS_VIRTUAL",
    SliceKind.WHOLE: "EXCLUSIVE_PHYSICAL",
}


def build_pool(num_slices: int) -> list[Slice]:
    out: list[Slice] = []
    card = 0
    while len(out) < num_slices:
        rot = card % 10
        node = f"node-{card // 8}"
        gpu = f"{node}/gpu{card % 8}"
        if rot < 4:
            shapes = [("3g.40gb", 40, 428), ("2g.20gb", 20, 285), ("1g.10gb", 10, 142), ("1g.10gb", 10, 142)]
            for i, (prof, gib, milli) in enumerate(shapes):
                out.append(
                    Slice(
                        f"{gpu}/mig{i}", node, gpu, SliceKind.MIG, Resources(gib * GIB, milli), profile=prof
                    )
                )
        elif rot < 8:
            for i in range(4):
                out.append(Slice(f"{gpu}/mps{i}", node, gpu, SliceKind.MPS, Resources(12 * GIB, 250)))
        else:
            out.append(Slice(gpu, node, gpu, SliceKind.WHOLE, Resources(80 * GIB, 1000)))
        card += 1
    return out[:num_slices]


_SHAPES = [  # (weight, vram GiB, compute milli, kinds)
    (25, 1.5, 50, ()),
    (15, 3, 100, (SliceKind.MPS,)),
    (15, 4, 100, ()),
    (10, 8, 140, (SliceKind.MIG,)),
    (10, 10, 200, ()),
    (10, 16, 250, ()),
    (8, 20, 280, ()),
    (7, 36, 400, (SliceKind.MIG,)),
]


def request_stream(seed_value: int) -> Iterator[Request]:
    rng = random.Random(seed_value)
    weights = [w for w, *_ in _SHAPES]
    i = 0
    while True:
        _, gib, milli, kinds = rng.choices(_SHAPES, weights=weights)[0]
        prio = rng.choices([P0, P1, P2], weights=[30, 30, 40])[0]
        i += 1
        yield Request(
            id=f"r{i}",
            tenant=f"t{i % 7}",
            priority=prio,
            demand=Resources(int(gib * GIB), milli),
            ttl_s=1e7,
            kinds=frozenset(kinds),
        )


def _to_seed_request(r: Request) -> seed.GpuAllocationRequest:
    kind = next(iter(r.kinds)) if r.kinds else None
    return seed.GpuAllocationRequest(
        request_id=r.id,
        model_name="bench",
        priority=_SEED_PRIORITY[r.priority],
        required_vram_mb=r.demand.vram_mib,
        required_compute_percent=r.demand.compute_milli // 10,
        timeout_ms=r.ttl_s * 1000,
        preferred_partition=_SEED_KIND[kind] if kind else None,
    )


@dataclass
class _State:
    alloc: Allocator
    clock: ManualClock
    seed: seed.GpuResourcePoolScheduler
    gp_active: list[str]
    seed_active: list[str]
    stream: Iterator[Request]


def _prepare(num_slices: int, seed_value: int, policy: str = DEFAULT_POLICY) -> _State:
    pool = build_pool(num_slices)
    clock = ManualClock(1000.0)
    alloc = Allocator(pool, clock=clock, policy=policy, lease_ids=seeded_lease_ids(seed_value))
    sched = seed.GpuResourcePoolScheduler(now_ms=lambda: clock.now() * 1000.0)
    for s in pool:
        sched.register_slice(
            slice_id=s.id,
            node_name=s.node,
            physical_gpu_index=0,
            partition_type=_SEED_KIND[s.kind],
            total_vram_mb=s.capacity.vram_mib,
            compute_capacity_percent=s.capacity.compute_milli // 10,
        )
    total = sum(s.capacity.vram_mib for s in pool)
    granted = 0
    stream = request_stream(seed_value)
    gp_active: list[str] = []
    seed_active: list[str] = []
    misses = 0
    while granted < 0.7 * total and misses < max(1000, num_slices):
        r = next(stream)
        out = alloc.allocate(r, preempt=False)
        if not out.granted or out.lease is None:
            misses += 1
            continue
        lease = out.lease
        granted += lease.total.vram_mib
        gp_active.append(lease.id)
        # Copy the same lease into the seed's books (same starting state for both).
        sl = sched.slices[lease.slice_ids[0]]
        sr = _to_seed_request(r)
        sl.allocated_vram_mb += sr.required_vram_mb
        sl.allocated_compute_percent += sr.required_compute_percent
        sl.active_leases[lease.id] = seed.GpuLease(
            lease.id, sl.slice_id, r.id, "bench", sr.priority, sr.required_vram_mb,
            sr.required_compute_percent, clock.now() * 1000, clock.now() * 1000 + sr.timeout_ms,
        )  # fmt: skip
        seed_active.append(lease.id)
    return _State(alloc, clock, sched, gp_active, seed_active, stream)


def _time_gpupool(st: _State, pairs: int, rng: random.Random, requests: list[Request]) -> float:
    alloc, active = st.alloc, st.gp_active
    t0 = time.perf_counter()
    for i in range(pairs):
        j = rng.randrange(len(active))
        active[j], active[-1] = active[-1], active[j]
        alloc.release(active.pop())
        out = alloc.allocate(requests[i])
        if out.lease is not None:
            active.append(out.lease.id)
            for v in out.victims:
                active.remove(v.id)
        st.clock.advance(0.001)
    return (time.perf_counter() - t0) / pairs * 1e6


def _time_seed(st: _State, pairs: int, rng: random.Random, requests: list[Request]) -> float:
    sched, active = st.seed, st.seed_active
    t0 = time.perf_counter()
    for i in range(pairs):
        j = rng.randrange(len(active))
        active[j], active[-1] = active[-1], active[j]
        sched.release_lease(active.pop())
        out = sched.allocate(_to_seed_request(requests[i]))
        if out.success and out.lease is not None:
            active.append(out.lease.lease_id)
        st.clock.advance(0.001)
    # Leases the seed evicted during P0 retries are gone from its books; drop them from our list.
    live = {lid for s in sched.slices.values() for lid in s.active_leases}
    st.seed_active[:] = [lid for lid in active if lid in live]
    return (time.perf_counter() - t0) / pairs * 1e6


def _occupancy_pct(alloc: Allocator) -> float:
    """Granted / capacity VRAM of the whole pool, in % (one decimal)."""
    states = list(alloc.states())
    return round(
        100 * sum(s.granted.vram_mib for s in states) / sum(s.slice.capacity.vram_mib for s in states), 1
    )


def run(
    *, sizes: list[int], ops: int, seed_ops: int, seed: int, policy: str = DEFAULT_POLICY
) -> dict[str, Any]:
    results = []
    for n in sizes:
        st = _prepare(n, seed, policy)
        start_pct = _occupancy_pct(st.alloc)  # before the timed phase, which changes it
        requests = [next(st.stream) for _ in range(max(ops, seed_ops))]
        gp_us = _time_gpupool(st, ops, random.Random(seed + 1), requests)
        seed_pairs = max(30, min(seed_ops, 2_000_000 // n))
        seed_us = _time_seed(st, seed_pairs, random.Random(seed + 1), requests)
        results.append(
            {
                "slices": n,
                "gpupool_us_per_op": round(gp_us, 3),
                "seed_us_per_op": round(seed_us, 1),
                "speedup": round(seed_us / gp_us, 1),
                "gpupool_pairs": ops,
                "seed_pairs": seed_pairs,
                "occupancy_start_pct": start_pct,
                "occupancy_end_pct": _occupancy_pct(st.alloc),
            }
        )
    return {
        "benchmark": "allocator",
        "op": "release a random active lease + allocate the next request (one pair)",
        "results": results,
    }
