"""THE SEED'S REFERENCE SCHEDULER, ported faithfully from the TypeScript `GpuResourcePoolScheduler`
in ``shared/seeds/000_504fe401c5aec671.txt``. A baseline for benchmarks and scenario tests only.

Same algorithm, same flaws, no deliberate slow-downs:
- every allocate scans all slices' leases for expiry, filters all slices and sorts the candidates;
- best fit by VRAM only; compute is only a filter;
- eviction frees P2 leases anywhere in the pool (even where the request still cannot fit), then
  retries recursively;
- lease ids from the clock and ``random``; state in process memory only.

The only liberty: ``Date.now()`` is an injectable ``now_ms`` function so the benchmark can feed both
schedulers the same time line. Names follow Python style; structure follows the original line by line.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

P0_CRITICAL_AGENT = "P0_CRITICAL_AGENT"
P1_ONLINE_EMBEDDING = "P1_ONLINE_EMBEDDING"
P2_OFFLINE_BATCH = "P2_OFFLINE_BATCH"


@dataclass
class GpuLease:
    lease_id: str
    slice_id: str
    request_id: str
    model_name: str
    priority: str
    allocated_vram_mb: int
    allocated_compute_percent: int
    created_at: float
    expires_at: float


@dataclass
class GpuInstanceSlice:
    slice_id: str
    node_name: str
    physical_gpu_index: int
    partition_type: str  # MIG_HARDWARE | MPS_VIRTUAL | EXCLUSIVE_PHYSICAL
    total_vram_mb: int
    compute_capacity_percent: int
    is_healthy: bool = True
    allocated_vram_mb: int = 0
    allocated_compute_percent: int = 0
    active_leases: dict[str, GpuLease] = field(default_factory=dict)


@dataclass
class GpuAllocationRequest:
    request_id: str
    model_name: str
    priority: str
    required_vram_mb: int
    required_compute_percent: int
    timeout_ms: float
    preferred_partition: str | None = None


@dataclass
class SchedulingDecision:
    success: bool
    lease: GpuLease | None = None
    assigned_slice: GpuInstanceSlice | None = None
    backpressure_triggered: bool | None = None
    rejection_reason: str | None = None


def _date_now_ms() -> float:
    return time.time() * 1000.0


class GpuResourcePoolScheduler:
    def __init__(self, now_ms: Callable[[], float] = _date_now_ms) -> None:
        self.slices: dict[str, GpuInstanceSlice] = {}
        self.backpressure_vram_ratio = 0.85
        self._now_ms = now_ms

    def register_slice(
        self,
        *,
        slice_id: str,
        node_name: str,
        physical_gpu_index: int,
        partition_type: str,
        total_vram_mb: int,
        compute_capacity_percent: int,
        is_healthy: bool = True,
    ) -> None:
        # NOTE: like the original, isHealthy is forced to true on registration.
        self.slices[slice_id] = GpuInstanceSlice(
            slice_id=slice_id,
            node_name=node_name,
            physical_gpu_index=physical_gpu_index,
            partition_type=partition_type,
            total_vram_mb=total_vram_mb,
            compute_capacity_percent=compute_capacity_percent,
            is_healthy=True,
        )

    def allocate(self, request: GpuAllocationRequest) -> SchedulingDecision:
        now = self._now_ms()
        self._cleanup_expired_leases(now)

        def ok(s: GpuInstanceSlice) -> bool:
            if not s.is_healthy:
                return False
            if request.preferred_partition and s.partition_type != request.preferred_partition:
                return False
            available_vram = s.total_vram_mb - s.allocated_vram_mb
            available_compute = s.compute_capacity_percent - s.allocated_compute_percent
            return (
                available_vram >= request.required_vram_mb
                and available_compute >= request.required_compute_percent
            )

        candidates = [s for s in self.slices.values() if ok(s)]

        if not candidates:
            if request.priority == P0_CRITICAL_AGENT:
                evicted = self._attempt_evict_p2_tasks(
                    request.required_vram_mb, request.required_compute_percent
                )
                if evicted:
                    return self.allocate(request)
            return SchedulingDecision(
                success=False,
                rejection_reason=(
                    f"GPU pool exhausted: no slice can satisfy {request.required_vram_mb}MB VRAM and "
                    f"{request.required_compute_percent}% compute"
                ),
            )

        # Array.prototype.sort is stable; so is list.sort.
        candidates.sort(key=lambda s: (s.total_vram_mb - s.allocated_vram_mb) - request.required_vram_mb)
        selected = candidates[0]

        projected_usage = (selected.allocated_vram_mb + request.required_vram_mb) / selected.total_vram_mb
        is_backpressure = projected_usage >= self.backpressure_vram_ratio

        rand = _to_base36(random.random())[2:7]
        lease = GpuLease(
            lease_id=f"lease_{int(now)}_{rand}",
            slice_id=selected.slice_id,
            request_id=request.request_id,
            model_name=request.model_name,
            priority=request.priority,
            allocated_vram_mb=request.required_vram_mb,
            allocated_compute_percent=request.required_compute_percent,
            created_at=now,
            expires_at=now + request.timeout_ms,
        )
        selected.allocated_vram_mb += request.required_vram_mb
        selected.allocated_compute_percent += request.required_compute_percent
        selected.active_leases[lease.lease_id] = lease
        return SchedulingDecision(
            success=True, lease=lease, assigned_slice=selected, backpressure_triggered=is_backpressure
        )

    def release_lease(self, lease_id: str) -> bool:
        for s in self.slices.values():
            lease = s.active_leases.get(lease_id)
            if lease:
                s.allocated_vram_mb = max(0, s.allocated_vram_mb - lease.allocated_vram_mb)
                s.allocated_compute_percent = max(
                    0, s.allocated_compute_percent - lease.allocated_compute_percent
                )
                del s.active_leases[lease_id]
                return True
        return False

    def _cleanup_expired_leases(self, current_time: float) -> None:
        for s in self.slices.values():
            for lease_id, lease in list(s.active_leases.items()):
                if current_time > lease.expires_at:
                    s.allocated_vram_mb = max(0, s.allocated_vram_mb - lease.allocated_vram_mb)
                    s.allocated_compute_percent = max(
                        0, s.allocated_compute_percent - lease.allocated_compute_percent
                    )
                    del s.active_leases[lease_id]

    def _attempt_evict_p2_tasks(self, needed_vram: int, needed_compute: int) -> bool:
        freed_vram = 0
        freed_compute = 0
        to_evict: list[str] = []
        for s in self.slices.values():
            for lease_id, lease in s.active_leases.items():
                if lease.priority == P2_OFFLINE_BATCH:
                    to_evict.append(lease_id)
                    freed_vram += lease.allocated_vram_mb
                    freed_compute += lease.allocated_compute_percent
                    if freed_vram >= needed_vram and freed_compute >= needed_compute:
                        break
            if freed_vram >= needed_vram and freed_compute >= needed_compute:
                break
        if freed_vram >= needed_vram and freed_compute >= needed_compute:
            for lid in to_evict:
                self.release_lease(lid)
            return True
        return False


def _to_base36(x: float) -> str:
    """JavaScript's ``Number.prototype.toString(36)`` for 0 <= x < 1 (enough digits for the slice)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = "0."
    frac = x
    for _ in range(11):
        frac *= 36
        d = math.floor(frac)
        out += digits[d]
        frac -= d
    return out
