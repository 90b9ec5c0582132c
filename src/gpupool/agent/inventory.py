"""Node discovery: what the agent's GPUs are, reconciled with the node's plan, as leasable slices.

Role: turn one ``DeviceSnapshot`` (NVML or the simulated cluster: model, UUID, PCI bus id, memory,
MIG mode current/pending, MIG devices with their NVML profile names, ``+me`` included) and the
agent's own health view into the node's slice list, which `gpupool.agent.publish` sends to the
control plane and writes as the ``<domain>/slices`` node annotation.

Rules:
- A GPU the plan names: the planned slices are adopted, with MIG device UUIDs filled in from the
  device; every mismatch is reported in ``differences`` (planned MIG instance missing -> that slice
  unhealthy; an instance the plan does not name; MIG wanted but MIG mode off; another model).
- A GPU no plan names gets its mode from what was detected, through `choose_mode` (the planner's
  capability rule): MIG already on -> its existing instances are adopted; MIG-capable with MIG off
  -> served whole, with the MIG layout reported as pending (applying it is the partition actuator's
  job, never discovery's); MIG on without any instance -> one unhealthy whole slice (nothing to
  lease, but the control plane keeps knowing the GPU); Volta or newer -> one MPS pool share (pipe
  dir published); older -> one time-slice slice, ``flagged`` (no VRAM isolation); a model the
  catalogue does not know -> whole, also ``flagged``.
- Health: a slice is healthy when NVML reads its GPU and the agent has not marked the GPU
  unhealthy (an XID or NVML error is sticky in the agent until it restarts). A GPU that NVML can no
  longer read keeps the slices it had (``previous``), marked unhealthy: a failure is not a reshape,
  so the same slice ids stay listed and only their health changes.

Invariants: slice ids are the planner's (``<node>/<index>/mig-<profile>-<start>``,
``<node>/<index>/mps-pool``, ``<node>/<index>/whole``, ``<node>/<index>/time-slice``); the output
depends only on the inputs (deterministic, sorted by GPU index then slice id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.hardware.capability import GpuMode, NoCapabilityError, choose_mode
from gpupool.hardware.catalogue import GpuModel, UnknownGpuModelError, gpu_model, model_from_nvml_name
from gpupool.hardware.devices import (
    DeviceSnapshot,
    GpuReading,
    inventory_from_snapshot,
    reconcile_inventory,
)
from gpupool.hardware.inventory import Inventory
from gpupool.hardware.planner import MPS_MIN_QUOTA_MIB
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU, Resources

DEFAULT_MPS_PIPE_DIR = "/tmp/nvidia-mps"  # noqa: S108 - NVIDIA's default MPS pipe directory
MPS_SERVER_RESERVE_MIB = 512
"""Kept back on an MPS card for the MPS server's own context (as the planner does)."""


@dataclass(frozen=True, slots=True)
class GpuView:
    """One physical GPU as discovered, with the mode it is served in and why."""

    gpu_id: str
    index: int
    uuid: str
    name: str
    model: str
    pci_bus_id: str
    memory_total_mib: int
    memory_reserved_mib: int
    mig_enabled: bool
    mig_pending: bool | None
    instances: tuple[tuple[str, str, int, int], ...]
    """(MIG device UUID, profile, GPU instance id, placement start) per MIG device."""
    mode: str
    origin: str
    """``plan`` (the node's plan names it) or ``detected``."""
    reason: str
    healthy: bool
    flagged: bool = False
    """True when the mode gives no VRAM isolation (time-slicing)."""


@dataclass(frozen=True, slots=True)
class NodeInventory:
    node: str
    gpus: tuple[GpuView, ...]
    slices: tuple[Slice, ...]
    differences: tuple[str, ...] = ()
    mps_pipe_dirs: tuple[tuple[str, str], ...] = field(default=())
    """(slice id, MPS pipe directory) for every MPS slice."""

    def pipe_dir(self, slice_id: str) -> str:
        return dict(self.mps_pipe_dirs).get(slice_id, "")

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpus": [
                {
                    "gpu_id": g.gpu_id,
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "model": g.model,
                    "pci_bus_id": g.pci_bus_id,
                    "memory_total_mib": g.memory_total_mib,
                    "memory_reserved_mib": g.memory_reserved_mib,
                    "mig_enabled": g.mig_enabled,
                    "mig_pending": g.mig_pending,
                    "instances": [
                        {"uuid": u, "profile": p, "gi_id": gi, "start": st} for u, p, gi, st in g.instances
                    ],
                    "mode": g.mode,
                    "origin": g.origin,
                    "reason": g.reason,
                    "healthy": g.healthy,
                    "flagged": g.flagged,
                }
                for g in self.gpus
            ],
            "slices": [slice_json(s, self.pipe_dir(s.id)) for s in self.slices],
            "differences": list(self.differences),
        }


def slice_json(s: Slice, mps_pipe_dir: str = "") -> dict[str, Any]:
    """A slice in the gateway's ``PUT /v1/nodes/{node}/slices`` shape."""
    return {
        "id": s.id,
        "gpu_id": s.gpu_id,
        "kind": s.kind.value,
        "vram_mib": s.capacity.vram_mib,
        "compute_milli": s.capacity.compute_milli,
        "index": s.gpu_index,
        "model": s.gpu_model,
        "profile": s.profile,
        "uuid": s.uuid,
        "healthy": s.healthy,
        "mps_pipe_dir": mps_pipe_dir,
    }


def _model_of(g: GpuReading) -> GpuModel | None:
    if g.model:
        try:
            return gpu_model(g.model)
        except UnknownGpuModelError:
            return None
    return model_from_nvml_name(g.name, total_mib=g.memory_total_mib) if g.name else None


def _instances(g: GpuReading) -> tuple[tuple[str, str, int, int], ...]:
    return tuple((d.uuid, d.profile, d.gpu_instance_id, d.start) for d in g.mig_devices)


def _one(snapshot: DeviceSnapshot, g: GpuReading) -> DeviceSnapshot:
    return DeviceSnapshot(snapshot.node, snapshot.at_s, (g,), (), snapshot.driver_version, snapshot.source)


def _planned(
    snapshot: DeviceSnapshot, g: GpuReading, planned: list[Slice], diffs: list[str]
) -> tuple[list[Slice], str, str]:
    gpu_id = planned[0].gpu_id
    model = _model_of(g)
    want_model = planned[0].gpu_model
    if want_model and model is not None and model.name != want_model:
        diffs.append(f"{gpu_id}: the plan has a {want_model}, the device is a {model.name} ({g.name})")
    adopted = list(reconcile_inventory(Inventory(tuple(planned)), [_one(snapshot, g)]))
    kinds = {s.kind for s in planned}
    if SliceKind.MIG in kinds and not g.mig_enabled:
        diffs.append(f"{gpu_id}: the plan wants MIG but MIG mode is off (pending: {g.mig_pending})")
    matched: set[str] = set()
    for s, a in zip(planned, adopted, strict=True):
        if s.kind is SliceKind.MIG:
            if a.healthy or not s.healthy:
                matched.add(a.uuid)
            if not a.healthy and s.healthy and g.mig_enabled:
                diffs.append(f"{gpu_id}: planned MIG instance {s.id} is not on the device")
    for d in g.mig_devices:
        if d.uuid not in matched:
            diffs.append(f"{gpu_id}: MIG instance {d.profile}@{d.start} ({d.uuid}) is not in the plan")
    mode = next((k.value for k in SliceKind if k in kinds), "whole")
    return adopted, mode, f"planned: {len(planned)} slice(s)"


def _detected(
    snapshot: DeviceSnapshot, g: GpuReading, diffs: list[str]
) -> tuple[list[Slice], str, str, bool]:
    node, gpu_id = snapshot.node, f"{snapshot.node}/{g.index}"
    model = _model_of(g)
    model_name = model.name if model is not None else g.model
    total = max(1, g.memory_total_mib)

    def one(kind: SliceKind, suffix: str, vram_mib: int, profile: str = "") -> Slice:
        return Slice(
            id=f"{gpu_id}/{suffix}",
            node=node,
            gpu_id=gpu_id,
            kind=kind,
            capacity=Resources(max(1, vram_mib), COMPUTE_MILLI_PER_GPU),
            gpu_index=g.index,
            gpu_model=model_name,
            profile=profile,
            uuid=g.uuid,
        )

    if g.mig_enabled:
        found = [replace(s, gpu_model=model_name) for s in inventory_from_snapshot(_one(snapshot, g))]
        if not found:  # listed, but unhealthy: the control plane still knows the GPU (its readings)
            diffs.append(f"{gpu_id}: MIG mode is on but no MIG instance exists; nothing to lease on it")
            empty = replace(one(SliceKind.WHOLE, "whole", total), healthy=False)
            return (
                [empty],
                "mig",
                "MIG on without instances: listed unhealthy until a layout is applied",
                False,
            )
        return found, "mig", f"MIG on: adopted {len(found)} existing instance(s)", False
    if model is None:
        return (
            [one(SliceKind.WHOLE, "whole", total)],
            "whole",
            f"unknown model {g.name!r}: no known MIG/MPS support, served whole without VRAM isolation",
            True,
        )
    try:
        choice = choose_mode(model, wants_hard_isolation=model.mig_capable, allow_time_slicing=True)
    except NoCapabilityError as exc:  # not reachable with time-slicing allowed; kept for safety
        return [one(SliceKind.WHOLE, "whole", total)], "whole", str(exc), False
    if choice.mode is GpuMode.MIG:
        pending = " (MIG enable pending a GPU reset)" if g.mig_pending else ""
        diffs.append(
            f"{gpu_id}: {model.name} is MIG-capable but MIG mode is off{pending}; served whole until a "
            "MIG layout is applied (gpupool plan --apply)"
        )
        return [one(SliceKind.WHOLE, "whole", total)], "whole", choice.reason + "; layout not applied", False
    if choice.mode is GpuMode.MPS and total - MPS_SERVER_RESERVE_MIB >= MPS_MIN_QUOTA_MIB:
        usable = total - MPS_SERVER_RESERVE_MIB
        return [one(SliceKind.MPS, "mps-pool", usable, "pool")], "mps", choice.reason, False
    if choice.mode is GpuMode.TIME_SLICE:
        return [one(SliceKind.TIME_SLICE, "time-slice", total)], "time-slice", choice.reason, True
    return [one(SliceKind.WHOLE, "whole", total)], "whole", choice.reason, False


def discover(
    snapshot: DeviceSnapshot,
    *,
    planned: Sequence[Slice] = (),
    unhealthy: Mapping[str, str] | None = None,
    mps_pipe_dir: str = DEFAULT_MPS_PIPE_DIR,
    mps_pipe_dirs: Mapping[str, str] | None = None,
    previous: Sequence[Slice] = (),
) -> NodeInventory:
    """The node's inventory from one snapshot, the node's planned slices and the agent's health view
    (``unhealthy``: gpu id -> why). MPS slices get ``mps_pipe_dirs[gpu_id]`` (the pipe directory of
    that GPU's control daemon), else ``mps_pipe_dir``."""
    bad = dict(unhealthy or {})
    node = snapshot.node
    before: dict[str, list[Slice]] = {}
    for s in previous:
        before.setdefault(s.gpu_id, []).append(s)
    by_gpu: dict[str, list[Slice]] = {}
    for s in planned:
        if s.node == node:
            by_gpu.setdefault(s.gpu_id, []).append(s)
    diffs: list[str] = []
    views: list[GpuView] = []
    slices: list[Slice] = []
    seen: set[str] = set()
    for g in sorted(snapshot.gpus, key=lambda g: g.index):
        gpu_id = f"{node}/{g.index}"
        seen.add(gpu_id)
        healthy = g.healthy and gpu_id not in bad
        flagged = False
        if not g.healthy and gpu_id in before:  # unreadable now: keep what it was, unhealthy
            found = before[gpu_id]
            mode = next((k.value for k in SliceKind if any(s.kind is k for s in found)), "whole")
            reason, origin = "last known slices", "plan" if gpu_id in by_gpu else "detected"
        elif gpu_id in by_gpu:
            found, mode, reason = _planned(snapshot, g, by_gpu[gpu_id], diffs)
            origin = "plan"
        else:
            found, mode, reason, flagged = _detected(snapshot, g, diffs)
            origin = "detected"
        if not healthy:
            reason += f"; unhealthy: {bad.get(gpu_id) or g.error or 'unreadable'}"
        slices += [s if healthy or not s.healthy else replace(s, healthy=False) for s in found]
        model = _model_of(g)
        views.append(
            GpuView(
                gpu_id=gpu_id,
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                model=model.name if model is not None else g.model,
                pci_bus_id=g.pci_bus_id,
                memory_total_mib=g.memory_total_mib,
                memory_reserved_mib=g.memory_reserved_mib,
                mig_enabled=g.mig_enabled,
                mig_pending=g.mig_pending,
                instances=_instances(g),
                mode=mode,
                origin=origin,
                reason=reason,
                healthy=healthy,
                flagged=flagged,
            )
        )
    for gpu_id in sorted(set(by_gpu) - seen):
        diffs.append(f"{gpu_id}: planned but not on this node")
    slices.sort(key=lambda s: (s.gpu_index, s.id))
    per_gpu = dict(mps_pipe_dirs or {})
    pipes = tuple((s.id, per_gpu.get(s.gpu_id, mps_pipe_dir)) for s in slices if s.kind is SliceKind.MPS)
    return NodeInventory(node, tuple(views), tuple(slices), tuple(diffs), pipes)
