"""The night batch backlog and the capacity each strategy lends to it, on the real core Allocator.

Role: minute by minute, feed the P2 backlog (knowledge-base re-embedding and regression evaluation,
sized in tokens) into the P2 servers a strategy has: static pool slices, batch engines on slices
whose online engine sleeps (tidal, engine level), the 7g instance of a re-partitioned GPU (tidal,
partition level) and the idle time of awake online engines at night (tidal, request level).
Only the seconds actually spent on backlog count as busy; a P2 server with nothing left to do is
idle reserved capacity and counts nowhere (``capacity_gpu_s`` keeps it apart, for the bound).

Every engine placement is replayed as a lease on `gpupool.core.Allocator` (ManualClock): online
engines hold P0/P1 placement leases, batch engines P2 leases; waking an online engine allocates its
P0 lease with ``preempt=True`` and the P2 lease it displaces comes back as a victim (counted in
``preemptions``); the partition path removes the day slices, adds the 7g slice and reverses it.
The allocator's invariants are checked at the end of the replay.

Backlog order: evaluation goes to servers with room for the 14B engine (>= 19 GiB), embedding to
the rest and to big servers once evaluation is done; unfinished work carries over (never dropped).
Work in flight when a batch engine is put to sleep is preserved at request granularity (vLLM
sleep level 1 keeps the engine; only the current iteration's KV is recomputed), so it is not lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core import P0, P1, P2, Allocator, ManualClock, Request, Resources
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.tidal.partition import RepartitionPlan, plan_merge
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.sim.tidal import perf
from gpupool.sim.tidal.platform import (
    A100,
    DAY_LAYOUT_A100_MIG,
    NIGHT_LAYOUT_A100_MIG,
    Instance,
    Platform,
    _mig,
)
from gpupool.sim.tidal.serve import Availability

F = npt.NDArray[np.float64]
REEMBED_TOKENS_PER_DAY = 6.0e9
"""Nightly re-embedding: ~12 M chunks x 512 tokens (a full re-index of a mid-size knowledge base)."""
EVAL_TOKENS_PER_DAY = 3.0e8
"""Nightly regression evaluation: ~130 k cases x (2,048 prompt + 256 answer tokens)."""
EVAL_PROMPT, EVAL_OUTPUT, EMBED_CHUNK = 2048.0, 256.0, 512.0
EVAL_MIN_VRAM_MIB = 19 * 1024
INJECT_HOUR = 19
TTL_S = 30 * 86400.0


@dataclass(slots=True)
class BatchResult:
    busy_gpu_s: F
    capacity_gpu_s: F
    vram_bytes_s: F
    tokens: float
    tokens_by_kind: dict[str, float]
    tokens_by_hour: F
    backlog_left: float
    preemptions: int
    online_awake: dict[str, F]
    allocator: dict[str, Any] = field(default_factory=dict)
    p2_used_s: dict[str, F] = field(default_factory=dict)
    """Request-lent online instance -> seconds per minute it actually ran P2 work."""


@dataclass(slots=True)
class _Server:
    name: str
    spec: perf.SliceSpec
    seconds: F
    """Seconds per minute this server may run P2 work."""
    kinds: tuple[str, ...]


def _windows_to_minutes(windows: list[tuple[float, float]], edges: F) -> F:
    out = np.zeros(len(edges) - 1)
    for a, b in windows:
        if b <= a:
            continue
        lo = np.clip(edges[:-1], a, b)
        hi = np.clip(edges[1:], a, b)
        out += hi - lo
    return out


def drain(
    plat: Platform,
    nights: list[tuple[float, float]],
    avail: Availability | None,
    busy: dict[str, F],
    *,
    edges: F,
    main: perf.ModelSpec,
    backlog_scale: float,
) -> BatchResult:
    minutes = len(edges) - 1
    full = np.full(minutes, 60.0)
    night_s = _windows_to_minutes(nights, edges)
    servers: list[_Server] = []
    awake: dict[str, F] = {}
    sleeps = avail.sleeps if avail else {}
    in_cost = perf.sleep_l1_s(main) * 2  # online engine sleeps, batch engine wakes
    seven_g = _mig("7g.80gb")
    part_windows: list[tuple[float, float]] = []
    for inst in plat.instances:
        windows = [(a, r) for a, r, _ in sleeps.get(inst.name, [])]
        asleep = _windows_to_minutes(windows, edges)
        awake[inst.name] = 1.0 - asleep / 60.0
        kinds = ("eval", "embed") if inst.spec.vram_mib >= EVAL_MIN_VRAM_MIB else ("embed",)
        if inst.role == "batch":
            seconds = full.copy()
            if inst.lend == "partition" and "main-a7" in sleeps:
                seconds -= _windows_to_minutes([(a, r) for a, r, _ in sleeps["main-a7"]], edges)
            servers.append(_Server(inst.name, inst.spec, np.maximum(seconds, 0.0), kinds))
        if inst.lend == "engine":
            wake = avail.wake_cost_s[inst.name] if avail else 0.0
            run = [(a + in_cost, r - wake) for a, r in windows]
            servers.append(
                _Server(f"batch-on-{inst.name}", inst.spec, _windows_to_minutes(run, edges), kinds)
            )
        if avail is not None and inst.name in avail.day_lending:
            idle = np.maximum(60.0 * awake[inst.name] - busy.get(inst.name, 0.0), 0.0)
            if avail.day_level is not None:  # the guard's level by day; nights lend as `tidal` does
                level = avail.day_level[:minutes]
                night_idle = np.maximum(night_s * awake[inst.name] - busy.get(inst.name, 0.0), 0.0)
                idle = np.where(night_s > 0, night_idle, idle * level)
            req_kinds = ("embed",) if inst.role == "embed" else kinds
            servers.append(_Server(f"p2-in-{inst.name}", inst.spec, idle, req_kinds))
        elif inst.lend == "request":
            idle = np.maximum(night_s * awake[inst.name] - busy.get(inst.name, 0.0), 0.0)
            req_kinds = ("embed",) if inst.role == "embed" else kinds
            servers.append(_Server(f"p2-in-{inst.name}", inst.spec, idle, req_kinds))
        if inst.name == "main-a7" and inst.lend == "partition":
            wake = avail.wake_cost_s[inst.name] if avail else 0.0
            part_windows = [
                (a + perf.RECONFIG_S + perf.cold_load_s(main), r - wake - perf.RECONFIG_S) for a, r in windows
            ]
            servers.append(_Server("batch-7g-a100-7", seven_g, _windows_to_minutes(part_windows, edges),
                                   ("eval", "embed")))  # fmt: skip
    rate = {
        (s.name, "eval"): perf.batch_tokens_per_s(main, s.spec, prompt=EVAL_PROMPT, output=EVAL_OUTPUT)
        for s in servers
    }
    rate |= {
        (s.name, "embed"): perf.batch_tokens_per_s(perf.BGE_M3, s.spec, prompt=EMBED_CHUNK, output=0.0)
        for s in servers
    }
    left = {"eval": 0.0, "embed": 0.0}
    done = {"eval": 0.0, "embed": 0.0}
    busy_gpu = np.zeros(minutes)
    cap_gpu = np.zeros(minutes)
    vram = np.zeros(minutes)
    tokens_by_min = np.zeros(minutes)
    p2_used: dict[str, F] = {}
    # the week starts with the previous evening's backlog (minute 0), then one injection per day at 19:00
    inject = {0} | {
        int((86400.0 * d + INJECT_HOUR * 3600.0 - edges[0]) // 60) for d in range(1, minutes // 1440 + 2)
    }
    for m in range(minutes):
        if m in inject:
            left["eval"] += EVAL_TOKENS_PER_DAY * backlog_scale
            left["embed"] += REEMBED_TOKENS_PER_DAY * backlog_scale
        for s in servers:
            cap = float(s.seconds[m])
            if cap <= 0:
                continue
            cap_gpu[m] += cap * s.spec.sm_fraction
            used = 0.0
            for kind in s.kinds:
                r = rate[(s.name, kind)]
                if r <= 0 or left[kind] <= 0 or cap - used <= 0:
                    continue
                use = min(cap - used, left[kind] / r)
                left[kind] -= use * r
                done[kind] += use * r
                tokens_by_min[m] += use * r
                used += use
                model = main if kind == "eval" else perf.BGE_M3
                vram[m] += use * min(s.spec.vram_mib * 1024 * 1024 * 0.9, model.weight_bytes * 10)
            busy_gpu[m] += used * s.spec.sm_fraction
            if s.name.startswith("p2-in-"):
                p2_used.setdefault(s.name[len("p2-in-") :], np.zeros(minutes))[m] = used
    hours = minutes // 60
    preemptions, summary = _replay(plat, sleeps, avail, edges=edges)
    return BatchResult(
        busy_gpu_s=busy_gpu,
        capacity_gpu_s=cap_gpu,
        vram_bytes_s=vram,
        tokens=done["eval"] + done["embed"],
        tokens_by_kind=done,
        tokens_by_hour=tokens_by_min[: hours * 60].reshape(hours, 60).sum(1),
        backlog_left=left["eval"] + left["embed"],
        preemptions=preemptions,
        online_awake=awake,
        allocator=summary,
        p2_used_s=p2_used,
    )


def _priority(inst: Instance) -> int:
    return {"main": P0, "guard": P0, "embed": P1, "rerank": P1}.get(inst.role, P2)


def _request(inst: Instance, rid: str, *, priority: int | None = None) -> Request:
    s = inst.core_slice()
    return Request(
        id=rid,
        tenant=inst.role,
        priority=_priority(inst) if priority is None else priority,
        demand=s.capacity,
        ttl_s=TTL_S,
        kinds=frozenset({s.kind}),
        nodes=frozenset({s.node}),
        model=inst.name,
    )


def _replay(
    plat: Platform, sleeps: dict[str, list[list[float]]], avail: Availability | None, *, edges: F
) -> tuple[int, dict[str, Any]]:
    """Engine placements as leases on the real Allocator; returns (P2 leases preempted, summary)."""
    clock = ManualClock(float(edges[0]))
    alloc = Allocator([i.core_slice() for i in plat.instances], clock=clock, lease_ids=seeded_lease_ids(8))
    held: dict[str, str] = {}
    counter = [0]

    def rid(tag: str) -> str:
        counter[0] += 1
        return f"{tag}-{counter[0]}"

    for inst in plat.instances:
        out = alloc.place(_request(inst, rid(inst.name)), (inst.slice_id,))
        assert out.granted and out.lease is not None, out.reason
        held[inst.name] = out.lease.id
    events: list[tuple[float, int, str, str]] = []  # (time, order, action, instance)
    for name, windows in sleeps.items():
        for a, r, _ in windows:
            wake = avail.wake_cost_s[name] if avail else 0.0
            events.append((a, 0, "lend", name))
            events.append((max(a, r - wake), 1, "reclaim", name))
    events.sort()
    by_name = {i.name: i for i in plat.instances}
    preempted = 0
    grants = 0
    plan = plan_merge("a100-7", A100, DAY_LAYOUT_A100_MIG, idle=dict.fromkeys(DAY_LAYOUT_A100_MIG, True))
    assert isinstance(plan, RepartitionPlan), plan
    assert plan.target == NIGHT_LAYOUT_A100_MIG and plan.reverse().target == DAY_LAYOUT_A100_MIG
    seven = Slice(
        id="a100-7/7g.80gb/batch",
        node="a100-7",
        gpu_id="a100-7",
        kind=SliceKind.MIG,
        capacity=Resources(_mig("7g.80gb").vram_mib, round(98 / 108 * 1000)),
        profile="7g.80gb",
    )
    partitioned = False
    a7 = [i for i in plat.instances if i.gpu == "a100-7"]
    for t, _, action, name in events:
        clock.set(max(clock.now(), t))
        inst = by_name[name]
        if inst.lend == "partition":
            if action == "lend" and not partitioned:
                for i in a7:
                    alloc.release(held.pop(i.name), reason="drain for re-partition 3g+2g+1g+1g -> 7g")
                    alloc.remove_slice(i.slice_id)
                alloc.add_slice(seven)
                p2 = Request(
                    id=rid("batch-7g"),
                    tenant="batch",
                    priority=P2,
                    demand=seven.capacity,
                    ttl_s=TTL_S,
                    kinds=frozenset({SliceKind.MIG}),
                    nodes=frozenset({"a100-7"}),
                )
                out = alloc.place(p2, (seven.id,))
                assert out.granted and out.lease is not None, out.reason
                held["batch-7g"] = out.lease.id
                partitioned, grants = True, grants + 1
            elif action == "reclaim" and partitioned:
                alloc.revoke(held.pop("batch-7g"), reason="re-partition 7g -> 3g+2g+1g+1g before DAY")
                preempted += 1
                alloc.remove_slice(seven.id)
                for i in a7:
                    alloc.add_slice(i.core_slice())
                    out = alloc.place(_request(i, rid(i.name)), (i.slice_id,))
                    assert out.granted and out.lease is not None, out.reason
                    held[i.name] = out.lease.id
                partitioned = False
            continue
        if action == "lend":
            alloc.release(held.pop(name), reason="sleep level 1: lent to batch")
            out = alloc.place(_request(inst, rid(f"batch-on-{name}"), priority=P2), (inst.slice_id,))
            assert out.granted and out.lease is not None, out.reason
            held[f"batch-on-{name}"] = out.lease.id
            grants += 1
        else:
            out = alloc.allocate(replace(_request(inst, rid(name))), preempt=True)
            assert out.granted and out.lease is not None, out.reason
            preempted += len(out.victims)
            held.pop(f"batch-on-{name}", None)
            held[name] = out.lease.id
    alloc.check_invariants()
    return preempted, {
        "p2_engine_leases": grants,
        "p2_leases_preempted": preempted,
        "active_leases_at_end": len(held),
        "repartition_plan": [str(st) for st in plan.steps],
        "repartition_reverse": [str(st) for st in plan.reverse().steps],
    }
