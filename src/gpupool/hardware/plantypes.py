"""Plan value types: what the partition planner produces and every renderer / inventory builder reads.

Role: frozen values for a per-GPU layout (MIG instances, MPS shares, whole cards), the placement of
every replica and what stayed unplaced; plus ``plan_to_dict`` (the ``gpupool plan --format json`` shape).

Public API: ``PlannedSlice``, ``GpuPlan``, ``Placement``, ``Unplaced``, ``Plan``, ``PlanError``,
``plan_to_dict(plan)``.

Invariants:
- Slice ids are stable and readable: ``<node>/<index>/mig-<profile>-<start>``,
  ``<node>/<index>/mps-<workload>-<replica>``, ``<node>/<index>/mps-pool``, ``<node>/<index>/whole``.
- A pool slice (``pool=True``) carries no placement; every placement names exactly one slice on one GPU.
- ``compute_milli`` of a MIG slice is its SM-slice fraction x 1000 (rounded down); of an MPS or
  time-sliced share it is ``thread_pct`` x 10.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpupool.hardware.capability import GpuMode
from gpupool.hardware.catalogue import GpuModel
from gpupool.hardware.mig import MigInstance
from gpupool.hardware.slices import SliceKind


class PlanError(ValueError):
    """The spec cannot be planned; the message names the workload and the shortfall in MiB."""

    def __init__(self, message: str, *, workload: str = "", shortfall_mib: int = 0) -> None:
        self.workload = workload
        self.shortfall_mib = shortfall_mib
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class PlannedSlice:
    id: str
    kind: SliceKind
    vram_mib: int
    compute_milli: int
    profile: str = ""
    """MIG profile name (``3g.40gb``); ``mps`` for MPS shares; empty for whole cards."""
    start: int = -1
    """MIG start memory slot; -1 when not MIG."""
    thread_pct: int = 0
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for MPS shares; 0 otherwise."""
    workload: str = ""
    replica: int = -1
    pool: bool = False
    """True for leftover capacity offered to the P2 batch pool."""


@dataclass(frozen=True, slots=True)
class GpuPlan:
    node: str
    index: int
    model: GpuModel
    mode: GpuMode
    slices: tuple[PlannedSlice, ...]
    reason: str
    flagged: bool = False
    uuid: str = ""

    @property
    def gpu_id(self) -> str:
        return f"{self.node}/{self.index}"

    @property
    def mig(self) -> tuple[MigInstance, ...]:
        """All MIG instances (workload and pool), by start slot."""
        return tuple(MigInstance(s.profile, s.start) for s in self.slices if s.kind is SliceKind.MIG)

    @property
    def used(self) -> bool:
        return any(not s.pool for s in self.slices)


@dataclass(frozen=True, slots=True)
class Placement:
    workload: str
    replica: int
    node: str
    gpu: int
    gpu_id: str
    slice: str
    vram_mib: int
    need_mib: int
    kind: SliceKind


@dataclass(frozen=True, slots=True)
class Unplaced:
    workload: str
    replica: int
    need_mib: int
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    gpus: tuple[GpuPlan, ...]
    placements: tuple[Placement, ...]
    unplaced: tuple[Unplaced, ...] = ()
    cluster_source: str = ""
    workloads_source: str = ""

    @property
    def gpus_used(self) -> int:
        return sum(1 for g in self.gpus if g.used)

    def pool_slices(self) -> tuple[tuple[GpuPlan, PlannedSlice], ...]:
        return tuple((g, s) for g in self.gpus for s in g.slices if s.pool)

    @property
    def pool_vram_mib(self) -> int:
        return sum(s.vram_mib for _, s in self.pool_slices())

    def gpu(self, gpu_id: str) -> GpuPlan:
        for g in self.gpus:
            if g.gpu_id == gpu_id:
                return g
        raise KeyError(gpu_id)


def _slice_dict(s: PlannedSlice) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": s.id,
        "kind": s.kind.value,
        "vram_mib": s.vram_mib,
        "compute_milli": s.compute_milli,
        "pool": s.pool,
    }
    if s.kind is SliceKind.MIG:
        d["profile"] = s.profile
        d["start"] = s.start
    if s.kind in (SliceKind.MPS, SliceKind.TIME_SLICE):
        d["thread_pct"] = s.thread_pct
        d["env"] = {
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={s.vram_mib}M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(s.thread_pct),
        }
    if s.workload:
        d["workload"] = s.workload
        d["replica"] = s.replica
    return d


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The JSON shape of ``gpupool plan --format json`` (keys sorted deterministically by builders)."""
    return {
        "gpus": [
            {
                "node": g.node,
                "index": g.index,
                "gpu_id": g.gpu_id,
                "model": g.model.name,
                "mode": g.mode.value,
                "mig": [{"profile": i.profile, "start": i.start} for i in g.mig],
                "slices": [_slice_dict(s) for s in g.slices],
                "reason": g.reason,
                "flagged": g.flagged,
                **({"uuid": g.uuid} if g.uuid else {}),
            }
            for g in plan.gpus
        ],
        "placements": [
            {
                "workload": p.workload,
                "replica": p.replica,
                "node": p.node,
                "gpu": p.gpu,
                "gpu_id": p.gpu_id,
                "slice": p.slice,
                "kind": p.kind.value,
                "vram_mib": p.vram_mib,
                "need_mib": p.need_mib,
            }
            for p in plan.placements
        ],
        "unplaced": [
            {"workload": u.workload, "replica": u.replica, "need_mib": u.need_mib, "reason": u.reason}
            for u in plan.unplaced
        ],
        "summary": {
            "gpus_total": len(plan.gpus),
            "gpus_used": plan.gpus_used,
            "pool_vram_mib": plan.pool_vram_mib,
            "pool_slices": len(plan.pool_slices()),
        },
    }
