"""Plan -> core ``Inventory`` (the hand-over to the allocator), and the whole-card inventory of a cluster.

Public API (re-exported by :mod:`gpupool.hardware.planner`):
- ``inventory_from_plan(plan)``: one ``Slice`` per planned slice, ids exactly as planned
  (``gpu-a/0/mig-3g.40gb-4``, ``gpu-b/0/mps-guardrail-0``, ``gpu-b/0/mps-pool``, ``gpu-c/0/whole``),
  ``compute_milli`` from the SM-slice fraction (MIG) or thread percentage (MPS), labels
  ``workload``/``replica`` on placed slices and ``pool=p2`` on leftover capacity.
- ``inventory_from_cluster(cluster)``: one ``WHOLE`` slice per card, full memory, 1000 milli-GPU.

Invariants: slice ids are unique (``Inventory`` checks); uuids only where known (a MIG device UUID exists
only once the instance is created: device sources fill it in via ``devices.reconcile_inventory``).
"""

from __future__ import annotations

from gpupool.hardware.inventory import Inventory
from gpupool.hardware.plantypes import GpuPlan, Plan, PlannedSlice
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.spec import ClusterSpec
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU, Resources


def _slice_of(g: GpuPlan, s: PlannedSlice) -> Slice:
    labels: tuple[tuple[str, str], ...]
    if s.pool:
        labels = (("pool", "p2"),)
    else:
        labels = (("replica", str(s.replica)), ("workload", s.workload))
    return Slice(
        id=s.id,
        node=g.node,
        gpu_id=g.gpu_id,
        kind=s.kind,
        capacity=Resources(s.vram_mib, s.compute_milli),
        gpu_index=g.index,
        gpu_model=g.model.name,
        profile=s.profile,
        uuid=g.uuid if s.kind is not SliceKind.MIG else "",
        labels=labels,
    )


def inventory_from_plan(plan: Plan) -> Inventory:
    """The core ``Inventory`` of a plan: one ``Slice`` per planned slice, ids exactly as planned.

    MIG slices carry no uuid (the MIG device UUID exists only once the instance is created; device
    sources fill it in); MPS/whole slices carry the card's uuid when the cluster spec gave one.
    """
    return Inventory(tuple(_slice_of(g, s) for g in plan.gpus for s in g.slices))


def inventory_from_cluster(cluster: ClusterSpec) -> Inventory:
    """One ``WHOLE`` slice per card (``<node>/<index>/whole``), full memory and 1000 milli-GPU."""
    return Inventory(
        tuple(
            Slice(
                id=f"{g.gpu_id}/whole",
                node=g.node,
                gpu_id=g.gpu_id,
                kind=SliceKind.WHOLE,
                capacity=Resources(g.model.memory_mib, COMPUTE_MILLI_PER_GPU),
                gpu_index=g.index,
                gpu_model=g.model.name,
                uuid=g.uuid,
            )
            for g in cluster.gpus()
        )
    )
