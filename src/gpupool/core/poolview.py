"""`pool_view`: the JSON-ready picture of a `LeaseController` that ``GET /v1/pool`` serves: nodes ->
GPUs -> slices (capacity, granted, free, leases, health), the last reading and watermark state per GPU,
queue depth per band, the watermark thresholds, and the request-lease (KV budget) pools.

Pure: reads the controller, changes nothing. Order: nodes by name, slices in ledger order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.core.controller import KV_PREFIX
from gpupool.core.watermarks import Reading
from gpupool.hardware.slices import Slice
from gpupool.hardware.units import Resources

if TYPE_CHECKING:
    from gpupool.core.controller import LeaseController


def pool_view(c: LeaseController) -> dict[str, object]:
    """Nodes -> GPUs -> slices with capacity, granted, free, health; readings; watermark state; queue."""
    nodes: dict[str, dict[str, dict[str, object]]] = {}
    for st in c.allocator.states():
        s = st.slice
        gpus = nodes.setdefault(s.node, {})
        g = gpus.get(s.gpu_id)
        if g is None:
            r = c.readings.get(s.gpu_id)
            g = gpus[s.gpu_id] = {
                "gpu_id": s.gpu_id,
                "model": s.gpu_model,
                "paused": c.bank.is_paused(s.gpu_id),
                "health": c.gpu_health.get(s.gpu_id, "ok"),
                "drained": s.gpu_id in c.drained,
                "reading": None if r is None else _reading_view(r),
                "slices": [],
            }
        slices = g["slices"]
        assert isinstance(slices, list)
        slices.append(_slice_view(st.slice, st.granted, st.free, st.num_leases, st.healthy))
    kv = []
    for st in c.kv.states():
        b = c.backends[st.slice.id[len(KV_PREFIX) :]]
        share, used, n = c.lane.usage(st.slice.id)  # the lane's share counts as what it uses
        granted = st.granted - Resources(share - used, 0)
        leases = st.num_leases - (1 if share else 0) + n
        view = _slice_view(st.slice, granted, st.free + Resources(share - used, 0), leases, st.healthy)
        kv.append({**view, "model": b.model, "backend": b.id, "url": b.url})
    cap = granted = Resources(0, 0)
    for st in c.allocator.states():
        cap, granted = cap + st.slice.capacity, granted + st.granted
    return {
        "nodes": [{"node": n, "gpus": list(gs.values())} for n, gs in sorted(nodes.items())],
        "capacity": {"vram_mib": cap.vram_mib, "compute_milli": cap.compute_milli},
        "granted": {"vram_mib": granted.vram_mib, "compute_milli": granted.compute_milli},
        "active_leases": len(c.allocator.leases),
        "request_leases": c.request_lease_count(),
        "queue": c.queue.depth_by_band(),
        "paused_gpus": sorted(c.paused_gpus()),
        "watermarks": {
            "vram_high": c.bank.config.vram_high,
            "vram_low": c.bank.config.vram_low,
            "temp_high_c": c.bank.config.temp_high_c,
            "temp_low_c": c.bank.config.temp_low_c,
            "early_warning": c.bank.config.early_warning,
        },
        "kv_pools": kv,
        **{name: view() for name, view in c.views.items()},
    }


def _reading_view(r: Reading) -> dict[str, object]:
    return {
        "vram_used_mib": r.vram_used_mib,
        "vram_total_mib": r.vram_total_mib,
        "temperature_c": r.temperature_c,
        "at_s": r.at_s,
    }


def _slice_view(
    s: Slice, granted: Resources, free: Resources, num_leases: int, healthy: bool
) -> dict[str, object]:
    return {
        "slice_id": s.id,
        "kind": s.kind.value,
        "profile": s.profile,
        "capacity": {"vram_mib": s.capacity.vram_mib, "compute_milli": s.capacity.compute_milli},
        "granted": {"vram_mib": granted.vram_mib, "compute_milli": granted.compute_milli},
        "free": {"vram_mib": free.vram_mib, "compute_milli": free.compute_milli},
        "leases": num_leases,
        "healthy": healthy,
    }
