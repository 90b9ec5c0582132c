"""Proxy replicas at scale, simulated on a virtual clock with the real core code: the leader's KV
allocator + `ShareDelegator`, and per replica a `ProxyReplica` (its `ReplicaShares` books), so
every grant, refusal, share call and rebalance is the product's own decision.

Model (documented choices; no I/O, a pure function of the inputs and the seed):
- each replica is one CPU (one process on its own core): requests are served one at a time, each
  costing ``proxy_cpu_us`` of that CPU (the real replica's CPU per proxied request, measured by
  ``gpupool bench replicas``); a granted request then holds its request lease for ``service_s``
  (the backend's time) and releases it; ``clients`` closed-loop clients per replica, no think time;
- a request whose model has no room in the replica's shares waits (as `ProxyReplica.acquire` does:
  QUEUED, then granted by a later share answer or a release, or shed after ``max_wait_s``);
- the leader is one CPU serving share calls in arrival order, each costing ``leader_call_us``
  (measured on the real `ShareDelegator` by `measure_leader_call_us`); a call and its answer each
  take ``rtt_s / 2`` on the network; a replica makes one call every ``ttl_s / 3``, and one at once
  (at most every 50 ms) when a request found no room.

Result per replica count: requests/s, latency p50/p99 (queueing on the replica's CPU + service),
shed, share calls/s at the leader and the leader's busy share, and ``max_shares_over_budget_mib``
(the most the sum of shares ever exceeded a budget: must be 0; the books' invariants are checked
after every share call).
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from gpupool.core.allocator import Allocator
from gpupool.core.clock import ManualClock
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.kvbackends import KV_PREFIX
from gpupool.core.kvshares import ShareDelegator, ShareReport
from gpupool.core.model import Request
from gpupool.core.outcome import OutcomeCode
from gpupool.core.ports import Backend
from gpupool.core.replica import ProxyReplica, ReplicaConfig
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

MODEL = "m"
URGENT_GAP_S = 0.05


@dataclass(frozen=True, slots=True)
class SimConfig:
    replicas: int = 1
    clients: int = 64
    """Closed-loop clients per replica (enough to keep its CPU busy: the replica is the limit)."""
    backends: int = 4
    budget_mib: int = 8192
    request_mib: int = 16
    proxy_cpu_us: float = 350.0
    leader_call_us: float = 60.0
    service_s: float = 0.005
    rtt_s: float = 0.0005
    ttl_s: float = 3.0
    max_wait_s: float = 2.0
    duration_s: float = 10.0
    warmup_s: float = 1.0
    seed: int = 0


def _leader(cfg: SimConfig, clock: ManualClock) -> tuple[Allocator, ShareDelegator, dict[str, Backend]]:
    kv = Allocator((), clock=clock, lease_ids=seeded_lease_ids(cfg.seed))
    backends = {
        f"b{i}": Backend(f"b{i}", MODEL, f"http://b{i}", f"n{i}", f"n{i}/0", cfg.budget_mib)
        for i in range(cfg.backends)
    }
    for b in backends.values():
        kv.add_slice(
            Slice(
                KV_PREFIX + b.id,
                b.node,
                b.gpu_id,
                SliceKind.MPS,
                Resources(b.kv_budget_mib, 1000),
                profile="kv:m",
            )
        )
    return kv, ShareDelegator(kv, backends=lambda: backends), backends


def measure_leader_call_us(replicas: int = 4, backends: int = 4, calls: int = 2000) -> float:
    """Wall time of one real share call (`ShareDelegator.renew`) with this many replicas and
    backends, in microseconds (median of ``calls``; the process's own CPU speed)."""
    clock = ManualClock(0.0)
    cfg = SimConfig(replicas=replicas, backends=backends)
    _, d, bs = _leader(cfg, clock)
    seqs = [0] * replicas
    samples = []
    for i in range(calls):
        r = i % replicas
        seqs[r] += 1
        reports = {bid: ShareReport(64, 32 + i % 16, 96 + i % 32) for bid in bs}
        t0 = time.perf_counter()
        d.renew(f"r{r}", "i", seqs[r], reports, ttl_s=3.0)
        samples.append(time.perf_counter() - t0)
        clock.advance(0.001)
    samples.sort()
    return samples[len(samples) // 2] * 1e6


def run(cfg: SimConfig) -> dict[str, Any]:
    clock = ManualClock(0.0)
    kv, d, backends = _leader(cfg, clock)
    rng = random.Random(cfg.seed)
    tid = itertools.count()
    reps = [
        ProxyReplica(
            clock=clock,
            lease_ids=lambda: f"l{next(tid)}",
            ticket_ids=lambda: f"t{next(tid)}",
            config=ReplicaConfig(max_wait_s=cfg.max_wait_s),
        )
        for _ in range(cfg.replicas)
    ]
    seq = itertools.count()
    events: list[tuple[float, int, str, int, Any]] = []

    def at(t: float, kind: str, r: int, data: Any = None) -> None:
        heapq.heappush(events, (t, next(seq), kind, r, data))

    cpu_free = [0.0] * cfg.replicas
    waiting: list[deque[tuple[float, str]]] = [deque() for _ in range(cfg.replicas)]
    """Per replica: requests that wait for room (arrival time, ticket)."""
    inflight = [False] * cfg.replicas
    last_urgent = [-1.0] * cfg.replicas
    leader_free = 0.0
    latencies: list[float] = []
    done = shed = calls = 0
    over = 0
    t_end = cfg.warmup_s + cfg.duration_s

    def send_call(r: int, now: float) -> None:
        nonlocal leader_free
        inflight[r] = True
        s, reports = reps[r].share_report()
        arrive = now + cfg.rtt_s / 2
        start = max(arrive, leader_free)
        leader_free = start + cfg.leader_call_us / 1e6
        at(leader_free, "leader", r, (s, reports))

    def arrive(r: int, now: float) -> None:
        """A client sends a request to replica r: it queues for the replica's CPU."""
        start = max(now, cpu_free[r])
        cpu_free[r] = start + cfg.proxy_cpu_us / 1e6
        at(cpu_free[r], "served", r, now)

    for r in range(cfg.replicas):
        at(rng.random() * cfg.ttl_s / 3, "timer", r)
        at(0.0, "call", r)
        for _ in range(cfg.clients):
            at(0.01 + rng.random() * 0.01, "arrive", r)

    while events:
        t, _, kind, r, data = heapq.heappop(events)
        if t > t_end:
            break
        clock.set(t)
        rep = reps[r]
        if kind == "arrive":
            arrive(r, t)
        elif kind == "served":
            req = Request(
                id=f"q{next(tid)}",
                tenant="t",
                priority=50,
                demand=Resources(cfg.request_mib, 0),
                ttl_s=60.0,
                model=MODEL,
            )
            out = rep.acquire(req)
            if out.code is OutcomeCode.GRANTED and out.lease is not None:
                at(t + cfg.service_s, "finish", r, (data, out.lease.id))
            elif out.code is OutcomeCode.QUEUED and out.ticket:
                waiting[r].append((data, out.ticket))
                if not inflight[r] and t - last_urgent[r] >= URGENT_GAP_S:
                    last_urgent[r] = t
                    send_call(r, t)
            else:
                shed += 1
                at(t, "arrive", r)
        elif kind == "finish":
            t0, lid = data
            rep.release(lid)
            if t0 >= cfg.warmup_s:
                latencies.append(t - t0)
                done += 1
            at(t, "arrive", r)
        elif kind in ("timer", "call"):
            if not inflight[r]:
                send_call(r, t)
            if kind == "timer":
                at(t + cfg.ttl_s / 3, "timer", r)
        elif kind == "leader":
            s, reports = data
            grants = d.renew(f"r{r}", "i", s, reports, ttl_s=cfg.ttl_s)
            if t >= cfg.warmup_s:
                calls += 1
            d.check()
            for bid, b in backends.items():
                over = max(over, sum(d.shares(bid).values()) - b.kv_budget_mib)
            at(t + cfg.rtt_s / 2, "answer", r, (s, grants))
        elif kind == "answer":
            s, grants = data
            inflight[r] = False
            rep.share_answer(s, cfg.ttl_s, backends, grants)
            rep.check_invariants()
        # requests granted from the wait list (by an answer or a release) go to their backend now
        if waiting[r] and kind in ("answer", "finish"):
            for _ in range(len(waiting[r])):
                t0, ticket = waiting[r].popleft()
                st = rep.ticket(ticket)
                if st.state == "granted" and st.lease is not None:
                    at(t + cfg.service_s, "finish", r, (t0, st.lease.id))
                elif st.state == "queued":
                    waiting[r].append((t0, ticket))
                else:
                    shed += 1
                    at(t, "arrive", r)
        if (
            kind in ("finish", "answer")
            and waiting[r]
            and not inflight[r]
            and t - last_urgent[r] >= URGENT_GAP_S
        ):
            last_urgent[r] = t
            send_call(r, t)
        if kind == "timer":
            rep.tick()
    kv.check_invariants()
    latencies.sort()

    def pct(q: float) -> float | None:
        return (
            round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 3)
            if latencies
            else None
        )

    return {
        "replicas": cfg.replicas,
        "requests_per_s": round(done / cfg.duration_s, 1),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "shed": shed,
        "share_calls_per_s": round(calls / cfg.duration_s, 1),
        "leader_busy_pct": round(100 * calls * cfg.leader_call_us / 1e6 / cfg.duration_s, 3),
        "max_shares_over_budget_mib": max(0, over),
    }
