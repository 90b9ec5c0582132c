"""Requests and leases: the values the allocator consumes and produces.

Invariants:
- A `Request` that passed `validate_request` has positive VRAM demand, compute within one GPU,
  a finite positive ``ttl_s`` and 1 <= ``gpu_count`` <= `MAX_GPU_COUNT`.
- ``gpu_count == 1``: the demand lands on exactly one slice (never split across GPUs).
  ``gpu_count == N > 1``: the request takes N entire ``WHOLE`` slices on one node (exclusive cards);
  each grant is that slice's full capacity.
- A `Lease` is a value; every change makes a new `Lease` with ``revision`` + 1 (compare-and-set key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.core.errors import InvalidInput
from gpupool.core.priority import PRIORITY_MAX, PRIORITY_MIN, is_preemptible_by_default
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU, Resources

MAX_VRAM_MIB = 16 * 1024 * 1024
"""16 TiB: far above any single GPU; anything larger is a typo, not a request."""
MAX_GPU_COUNT = 64
MAX_TTL_S = 366 * 24 * 3600.0


class LeaseState(StrEnum):
    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"
    PREEMPTED = "preempted"
    REVOKED = "revoked"
    """The slice under the lease went unhealthy or was drained; the holder must stop."""

    @property
    def ended(self) -> bool:
        return self is not LeaseState.ACTIVE


@dataclass(frozen=True, slots=True)
class Request:
    """A demand for GPU capacity. ``demand`` is per GPU; see the module invariants for gpu_count."""

    id: str
    tenant: str
    priority: int
    demand: Resources
    ttl_s: float
    kinds: frozenset[SliceKind] = frozenset()
    """Acceptable slice kinds; empty means any kind except ``TIME_SLICE``."""
    preemptible: bool | None = None
    """None: decided by priority (negative = preemptible)."""
    gpu_count: int = 1
    nodes: frozenset[str] = frozenset()
    """Restrict placement to these nodes (Kubernetes filter, node agents); empty = any node."""
    model: str = ""
    labels: tuple[tuple[str, str], ...] = field(default=())

    @property
    def is_preemptible(self) -> bool:
        if self.preemptible is None:
            return is_preemptible_by_default(self.priority)
        return self.preemptible

    def accepts(self, kind: SliceKind) -> bool:
        if self.gpu_count > 1:
            return kind is SliceKind.WHOLE
        if not self.kinds:
            return kind is not SliceKind.TIME_SLICE
        return kind in self.kinds


def validate_request(req: Request) -> Request:
    """Raise `InvalidInput` naming the first bad field; return the request unchanged otherwise."""
    if not isinstance(req.id, str) or not req.id:
        raise InvalidInput("id", req.id, "must be a non-empty string")
    if not isinstance(req.tenant, str) or not req.tenant:
        raise InvalidInput("tenant", req.tenant, "must be a non-empty string")
    if type(req.priority) is not int or not PRIORITY_MIN <= req.priority <= PRIORITY_MAX:
        raise InvalidInput(
            "priority", req.priority, f"must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}]"
        )
    if type(req.gpu_count) is not int or not 1 <= req.gpu_count <= MAX_GPU_COUNT:
        raise InvalidInput("gpu_count", req.gpu_count, f"must be an integer in [1, {MAX_GPU_COUNT}]")
    vram = req.demand.vram_mib
    if type(vram) is not int:
        raise InvalidInput("demand.vram_mib", vram, "must be an integer number of MiB")
    if type(req.demand.compute_milli) is not int:
        compute_value = req.demand.compute_milli
        raise InvalidInput("demand.compute_milli", compute_value, "must be an integer (1000 = one GPU)")
    if not 1 <= vram <= MAX_VRAM_MIB:
        raise InvalidInput("demand.vram_mib", vram, f"must be in [1, {MAX_VRAM_MIB}] MiB")
    compute = req.demand.compute_milli
    if not 0 <= compute <= COMPUTE_MILLI_PER_GPU:
        raise InvalidInput(
            "demand.compute_milli", compute, f"must be in [0, {COMPUTE_MILLI_PER_GPU}] (one GPU = 1000)"
        )
    ttl = req.ttl_s
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise InvalidInput("ttl_s", ttl, "must be a finite number of seconds")
    if not 0 < ttl <= MAX_TTL_S:
        raise InvalidInput("ttl_s", ttl, f"must be > 0 and <= {MAX_TTL_S:.0f} s")
    for kind in req.kinds:
        if not isinstance(kind, SliceKind):
            raise InvalidInput("kinds", kind, f"must be one of {[k.value for k in SliceKind]}")
    if req.gpu_count > 1 and req.kinds and SliceKind.WHOLE not in req.kinds:
        raise InvalidInput("kinds", sorted(req.kinds), "a multi-GPU request needs whole GPUs (kind 'whole')")
    return req


@dataclass(frozen=True, slots=True)
class Grant:
    """What one lease holds on one slice."""

    slice_id: str
    gpu_id: str
    resources: Resources


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    request: Request
    node: str
    grants: tuple[Grant, ...]
    granted_at: float
    expires_at: float
    state: LeaseState = LeaseState.ACTIVE
    revision: int = 1
    ended_at: float | None = None
    reason: str = ""

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def slice_ids(self) -> tuple[str, ...]:
        return tuple(g.slice_id for g in self.grants)

    @property
    def total(self) -> Resources:
        if len(self.grants) == 1:
            return self.grants[0].resources  # (a lease on one slice: no sum to build)
        total = Resources(0, 0)
        for g in self.grants:
            total = total + g.resources
        return total

    # Built field by field: `dataclasses.replace` costs several times more (the request path).
    def with_state(self, state: LeaseState, *, at: float, reason: str = "") -> Lease:
        return Lease(
            self.id, self.request, self.node, self.grants, self.granted_at, self.expires_at,
            state, self.revision + 1, at, reason,
        )  # fmt: skip

    def renewed(self, expires_at: float) -> Lease:
        return Lease(
            self.id, self.request, self.node, self.grants, self.granted_at, expires_at,
            self.state, self.revision + 1, self.ended_at, self.reason,
        )  # fmt: skip
