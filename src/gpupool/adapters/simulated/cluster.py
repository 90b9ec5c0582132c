"""`SimulatedCluster`: a deterministic, seeded, scriptable GPU cluster built from a cluster spec and a plan.

Role: the device source gpupool embeds when no GPU is present (``make run``, demos, tests, the node agent
in simulation). It returns the same ``DeviceSnapshot`` values as the NVML source.

Model (all integers, all deterministic for a given seed and call sequence):
- Memory used on a slice = max(resident memory of the replica placed there (engines pre-reserve their
  weights + KV budget), sum of VRAM granted by leases on it), capped at the slice size; a GPU's used
  memory is the sum over its slices plus ``IDLE_USED_MIB``.
- Utilisation of a slice = its activity percentage (``set_activity``; default ``DEFAULT_ACTIVITY_PCT`` for
  a placed replica, 0 for pool slices) + compute granted by leases (compute_milli / 10), capped at 100;
  a GPU's utilisation is the compute-weighted sum over its slices plus seeded jitter of +-``JITTER_PCT``.
  MIG-enabled GPUs report ``utilization_pct=None`` like NVML and give each MIG device ``engine_active_pct``.
- Temperature relaxes towards ambient + (``HOT_C`` - ambient) x utilisation / 100 with time constant
  ``THERMAL_TAU_S`` as simulated time advances (``advance`` or the injected clock); power follows
  utilisation between idle and the model's TDP.
- Real processes may hold memory through the VRAM registry (``vram_registry``, see
  `gpupool.adapters.simulated.vram`): a live holder's MiB count on its GPU (or slice) and it appears in
  the process list with its real pid, until it exits or shrinks its record.
- Hooks: ``force`` pins any reading of a GPU until ``clear``; ``lose`` makes the GPU unhealthy with
  "GPU is lost" (what NVML's GPU_IS_LOST maps to); ``xid`` queues an XID event (fatal XIDs mark the GPU
  unhealthy, as the NVML source does).

Invariants: no wall-clock reads (time comes from ``advance`` or the injected clock); randomness only from
``random.Random(seed)``; UUIDs are derived from (seed, GPU id) and stable across runs.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.adapters.simulated.vram import held

if TYPE_CHECKING:
    from gpupool.adapters.simulated.mig import SimulatedMigHardware
from gpupool.hardware.devices import DeviceSnapshot, GpuReading, MigDeviceReading, ProcessReading, XidEvent
from gpupool.hardware.inventory import Inventory
from gpupool.hardware.planner import inventory_from_cluster, inventory_from_plan, plan
from gpupool.hardware.plantypes import GpuPlan, Plan, PlannedSlice
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.spec import ClusterSpec, GpuSpec, WorkloadSet

IDLE_USED_MIB = 0
DEFAULT_ACTIVITY_PCT = 30
JITTER_PCT = 2
AMBIENT_C = 30
HOT_C = 82
THERMAL_TAU_S = 30.0
FATAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
TDP_W = {
    "A100-SXM4-40GB": 400,
    "A100-PCIE-40GB": 250,
    "A100-SXM4-80GB": 400,
    "A100-PCIE-80GB": 300,
    "A30-24GB": 165,
    "H100-SXM5-80GB": 700,
    "H100-PCIE-80GB": 350,
    "H100-NVL-94GB": 400,
    "H200-141GB": 700,
    "H20-96GB": 400,
    "B200-180GB": 1000,
    "L40S-48GB": 350,
    "L4-24GB": 72,
    "RTX4090-24GB": 450,
    "A10-24GB": 150,
    "T4-16GB": 70,
    "V100-16GB": 300,
    "V100-32GB": 300,
}
NVML_NAMES = {
    "A100-SXM4-80GB": "NVIDIA A100-SXM4-80GB",
    "A100-PCIE-80GB": "NVIDIA A100 80GB PCIe",
    "H100-SXM5-80GB": "NVIDIA H100 80GB HBM3",
    "H100-PCIE-80GB": "NVIDIA H100 PCIe",
    "H100-NVL-94GB": "NVIDIA H100 NVL",
    "H200-141GB": "NVIDIA H200",
    "H20-96GB": "NVIDIA H20",
    "B200-180GB": "NVIDIA B200",
    "L40S-48GB": "NVIDIA L40S",
    "L4-24GB": "NVIDIA L4",
    "RTX4090-24GB": "NVIDIA GeForce RTX 4090",
    "A10-24GB": "NVIDIA A10",
    "T4-16GB": "Tesla T4",
    "V100-16GB": "Tesla V100-SXM2-16GB",
    "V100-32GB": "Tesla V100-SXM2-32GB",
    "A30-24GB": "NVIDIA A30",
    "A100-SXM4-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-PCIE-40GB": "NVIDIA A100-PCIE-40GB",
}


def _uuid(prefix: str, seed: int, key: str) -> str:
    h = hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()
    return f"{prefix}-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class _Forced:
    memory_used_mib: int | None = None
    temperature_c: int | None = None
    utilization_pct: int | None = None
    power_mw: int | None = None


@dataclass
class _GpuState:
    spec: GpuSpec
    layout: GpuPlan | None
    uuid: str
    temperature: float
    forced: _Forced = field(default_factory=_Forced)
    lost: bool = False
    error: str = ""
    events: list[XidEvent] = field(default_factory=list)
    cis: dict[int, list[int]] = field(default_factory=dict)
    """GPU instance id -> its compute instance ids (MIG; see `gpupool.adapters.simulated.mig`)."""

    @property
    def slices(self) -> tuple[PlannedSlice, ...]:
        if self.layout is not None:
            return self.layout.slices
        g = self.spec
        return (PlannedSlice(f"{g.gpu_id}/whole", SliceKind.WHOLE, g.model.memory_mib, 1000, pool=True),)


class SimulatedCluster:
    """See the module docstring. ``plan=None`` simulates every card as one whole-GPU slice."""

    def __init__(
        self,
        cluster: ClusterSpec,
        plan: Plan | None = None,
        *,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        ambient_c: int = AMBIENT_C,
        vram_registry: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.vram_registry = vram_registry
        self._held: dict[str, tuple[tuple[int, int], ...]] = {}
        self._repartitioned = False
        self.plan = plan
        self.seed = seed
        self._rng = random.Random(seed)
        self._clock = clock
        self._now = clock() if clock is not None else 0.0
        self._ambient = ambient_c
        layouts = {g.gpu_id: g for g in plan.gpus} if plan is not None else {}
        self._gpus: dict[str, _GpuState] = {}
        for g in cluster.gpus():
            uuid = g.uuid or _uuid("GPU", seed, g.gpu_id)
            st = _GpuState(g, layouts.get(g.gpu_id), uuid, float(ambient_c))
            st.cis = {s.start + 1: [0] for s in st.slices if s.kind is SliceKind.MIG}
            self._gpus[g.gpu_id] = st
        self._slice_gpu: dict[str, str] = {s.id: gid for gid, st in self._gpus.items() for s in st.slices}
        self._resident: dict[str, int] = {}
        if plan is not None:
            for p in plan.placements:
                s = self._slice(p.slice)
                if not s.pool:
                    self._resident[p.slice] = min(p.need_mib, s.vram_mib)
        self._activity: dict[str, int] = dict.fromkeys(self._resident, DEFAULT_ACTIVITY_PCT)
        self._leases: dict[str, tuple[str, int, int]] = {}
        self._leased: dict[str, tuple[int, int]] = {}
        """Per slice: the (VRAM MiB, compute milli) of its mirrored leases, kept with ``_leases`` so a
        reading costs O(slices), not O(slices x leases)."""
        for st in self._gpus.values():
            st.temperature = float(self._target_temp(st, self._util(st)))

    @classmethod
    def from_specs(
        cls, cluster: ClusterSpec, workloads: WorkloadSet | None = None, *, seed: int = 0
    ) -> SimulatedCluster:
        return cls(cluster, plan(cluster, workloads) if workloads is not None else None, seed=seed)

    # --- lookups ---------------------------------------------------------------------------------
    def _state(self, gpu_id: str) -> _GpuState:
        try:
            return self._gpus[gpu_id]
        except KeyError:
            raise KeyError(f"unknown GPU {gpu_id!r} (known: {', '.join(self._gpus)})") from None

    def _slice(self, slice_id: str) -> PlannedSlice:
        st = self._state(self._slice_gpu.get(slice_id, "?")) if slice_id in self._slice_gpu else None
        if st is None:
            raise KeyError(f"unknown slice {slice_id!r}")
        return next(s for s in st.slices if s.id == slice_id)

    def nodes(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.cluster.nodes)

    # --- MIG (NVML calls: gpupool.adapters.simulated.mig) ----------------------------------------
    def mig_hardware(self, node: str) -> SimulatedMigHardware:
        """NVML's MIG calls on ``node``'s GPUs (by node-local index)."""
        from gpupool.adapters.simulated.mig import SimulatedMigHardware

        if node not in self.nodes():
            raise KeyError(f"unknown node {node!r} (known: {', '.join(self.nodes())})")
        return SimulatedMigHardware(self, node)

    def set_mig_mode(self, gpu_id: str, enabled: bool) -> None:
        """The operator's ``nvidia-smi -i N -mig 1|0``: refused while GPU instances exist."""
        st = self._state(gpu_id)
        if self._mig_on(st) == enabled:
            return
        if enabled and not st.spec.model.mig_capable:
            raise ValueError(f"{gpu_id}: {st.spec.model.name} does not support MIG")
        if not enabled and any(s.kind is SliceKind.MIG for s in st.slices):
            raise ValueError(f"{gpu_id}: destroy its GPU instances before disabling MIG mode")
        from gpupool.hardware.capability import GpuMode

        g = st.spec
        if enabled:
            st.layout = GpuPlan(g.node, g.index, g.model, GpuMode.MIG, (), "MIG mode enabled by the operator")
        else:
            st.layout = None
        self._slice_gpu = {s.id: gid for gid, x in self._gpus.items() for s in x.slices}
        self._repartitioned = True

    def _current_plan(self) -> Plan:
        """The layouts as the hardware now holds them (after MIG re-partitions)."""
        from gpupool.hardware.capability import GpuMode

        gpus = []
        for st in self._gpus.values():
            g = st.spec
            if st.layout is not None:
                gpus.append(st.layout)
            else:
                gpus.append(
                    GpuPlan(g.node, g.index, g.model, GpuMode.WHOLE, st.slices, "whole card", uuid=g.uuid)
                )
        return Plan(tuple(gpus), ())

    def _gpu_at(self, node: str, index: int) -> _GpuState | None:
        return next(
            (st for st in self._gpus.values() if st.spec.node == node and st.spec.index == index), None
        )

    @staticmethod
    def _mig_on(st: _GpuState) -> bool:
        return st.layout is not None and st.layout.mode.value == "mig"

    def _slice_pids(self, s: PlannedSlice) -> tuple[int, ...]:
        """The processes the readings show on a slice: a placed replica and live registry holders."""
        st = self._state(self._slice_gpu[s.id])
        n = next(i for i, x in enumerate(st.slices) if x.id == s.id)
        own = (10_000 + st.spec.index * 100 + n,) if self._resident.get(s.id) else ()
        self._held = held(self.vram_registry)
        return own + tuple(pid for pid, _ in self._held.get(s.id, ()))

    def _set_slices(self, st: _GpuState, slices: tuple[PlannedSlice, ...]) -> None:
        assert st.layout is not None
        ordered = tuple(sorted(slices, key=lambda x: (x.start, x.id)))
        st.layout = GpuPlan(
            st.layout.node, st.layout.index, st.layout.model, st.layout.mode, ordered, st.layout.reason
        )
        self._slice_gpu = {s.id: gid for gid, x in self._gpus.items() for s in x.slices}
        self._repartitioned = True
        for sid in [k for k in self._resident if k not in self._slice_gpu]:
            del self._resident[sid]

    # --- standby engines (tidal re-partition) ----------------------------------------------------
    def stop_residents(self, gpu_id: str) -> dict[str, int]:
        """Stop the placed replicas on ``gpu_id`` (their processes leave the slices); returns
        slice id -> MiB for `start_residents`."""
        st = self._state(gpu_id)
        out: dict[str, int] = {}
        for s in st.slices:
            if s.id in self._resident:
                out[s.id] = self._resident.pop(s.id)
                self._activity.pop(s.id, None)
        return out

    def start_residents(self, residents: dict[str, int]) -> None:
        """Start replicas again on the slices that exist (after the day layout is back)."""
        for sid, mib in residents.items():
            if sid in self._slice_gpu:
                self._resident[sid] = mib
                self._activity[sid] = DEFAULT_ACTIVITY_PCT

    # --- hooks -----------------------------------------------------------------------------------
    def grant(self, lease_id: str, slice_id: str, *, vram_mib: int, compute_milli: int = 0) -> None:
        """A lease now uses ``vram_mib`` / ``compute_milli`` of ``slice_id`` (idempotent per lease id)."""
        self._slice(slice_id)
        self.release(lease_id)
        self._leases[lease_id] = (slice_id, int(vram_mib), int(compute_milli))
        v, c = self._leased.get(slice_id, (0, 0))
        self._leased[slice_id] = (v + int(vram_mib), c + int(compute_milli))

    def release(self, lease_id: str) -> None:
        old = self._leases.pop(lease_id, None)
        if old is not None:
            sid, vram, compute = old
            v, c = self._leased[sid]
            if (v, c) == (vram, compute):
                del self._leased[sid]
            else:
                self._leased[sid] = (v - vram, c - compute)

    def set_activity(self, slice_id: str, pct: int) -> None:
        self._slice(slice_id)
        self._activity[slice_id] = max(0, min(100, int(pct)))

    def force(
        self,
        gpu_id: str,
        *,
        memory_used_mib: int | None = None,
        temperature_c: int | None = None,
        utilization_pct: int | None = None,
        power_mw: int | None = None,
    ) -> None:
        f = self._state(gpu_id).forced
        if memory_used_mib is not None:
            f.memory_used_mib = memory_used_mib
        if temperature_c is not None:
            f.temperature_c = temperature_c
        if utilization_pct is not None:
            f.utilization_pct = utilization_pct
        if power_mw is not None:
            f.power_mw = power_mw

    def clear(self, gpu_id: str) -> None:
        """Undo ``force`` and ``lose`` on a GPU."""
        st = self._state(gpu_id)
        st.forced = _Forced()
        st.lost = False
        st.error = ""

    def lose(self, gpu_id: str) -> None:
        st = self._state(gpu_id)
        st.lost, st.error = True, "NVMLError_GpuIsLost: GPU is lost"

    def xid(self, gpu_id: str, xid: int) -> None:
        st = self._state(gpu_id)
        st.events.append(XidEvent(st.uuid, int(xid)))
        if xid in FATAL_XIDS:
            st.lost, st.error = True, f"xid {xid}"

    def advance(self, dt_s: float) -> None:
        """Advance simulated time: temperatures relax towards their utilisation target."""
        if dt_s <= 0:
            return
        self._now += dt_s
        k = 1.0 - math.exp(-dt_s / THERMAL_TAU_S)
        for st in self._gpus.values():
            target = self._target_temp(st, self._util(st))
            st.temperature += (target - st.temperature) * k

    # --- model -----------------------------------------------------------------------------------
    def _slice_used(self, s: PlannedSlice) -> int:
        leased = self._leased.get(s.id, (0, 0))[0]
        by_procs = sum(mib for _pid, mib in self._held.get(s.id, ()))
        return min(s.vram_mib, max(self._resident.get(s.id, 0), leased) + by_procs)

    def _slice_util(self, s: PlannedSlice) -> int:
        leased = self._leased.get(s.id, (0, 0))[1] // 10
        return min(100, self._activity.get(s.id, 0) + leased)

    def _util(self, st: _GpuState) -> int:
        total = sum(self._slice_util(s) * max(s.compute_milli, 0) for s in st.slices) // 1000
        return min(100, total)

    def _target_temp(self, st: _GpuState, util: int) -> int:
        return self._ambient + (HOT_C - self._ambient) * util // 100

    def _power_mw(self, st: _GpuState, util: int) -> int:
        tdp = TDP_W.get(st.spec.model.name, 300)
        idle = tdp * 15 // 100
        return (idle + (tdp - idle) * util // 100) * 1000

    # --- reading ---------------------------------------------------------------------------------
    def _reading(self, st: _GpuState) -> GpuReading:
        g = st.spec
        name = NVML_NAMES.get(g.model.name, f"NVIDIA {g.model.name}")
        if st.lost:
            return GpuReading(
                g.index, st.uuid, name, g.model.name, g.model.memory_mib, 0, healthy=False, error=st.error
            )
        util = self._util(st)
        jitter = self._rng.randint(-JITTER_PCT, JITTER_PCT)
        util_read = (
            st.forced.utilization_pct
            if st.forced.utilization_pct is not None
            else max(0, min(100, util + jitter))
        )
        on_gpu = self._held.get(g.gpu_id, ())
        used = IDLE_USED_MIB + sum(self._slice_used(s) for s in st.slices) + sum(m for _p, m in on_gpu)
        if st.forced.memory_used_mib is not None:
            used = st.forced.memory_used_mib
        temp = st.forced.temperature_c if st.forced.temperature_c is not None else round(st.temperature)
        power = st.forced.power_mw if st.forced.power_mw is not None else self._power_mw(st, util_read)
        mig_enabled = st.layout is not None and st.layout.mode.value == "mig"
        procs: list[ProcessReading] = []
        migs: list[MigDeviceReading] = []
        for n, s in enumerate(st.slices):
            resident = self._resident.get(s.id, 0)
            gi = s.start + 1 if s.kind is SliceKind.MIG else -1
            p = (
                (ProcessReading(10_000 + g.index * 100 + n, resident, gi, 0 if gi >= 0 else -1),)
                if resident
                else ()
            ) + tuple(
                ProcessReading(pid, mib, gi, 0 if gi >= 0 else -1) for pid, mib in self._held.get(s.id, ())
            )
            procs += p
            if s.kind is SliceKind.MIG:
                sm_slices = int(s.profile.split("g", 1)[0])
                migs.append(
                    MigDeviceReading(
                        uuid=_uuid("MIG", self.seed, s.id),
                        index=len(migs),
                        gpu_instance_id=gi,
                        compute_instance_id=0,
                        profile=s.profile,
                        memory_total_mib=s.vram_mib,
                        memory_used_mib=self._slice_used(s),
                        sm_slices=sm_slices,
                        sm_count=g.model.sm_count * s.compute_milli // 1000,
                        start=s.start,
                        engine_active_pct=self._slice_util(s),
                        processes=p,
                    )
                )
        procs += [ProcessReading(pid, mib, -1, -1) for pid, mib in on_gpu]
        return GpuReading(
            index=g.index,
            uuid=st.uuid,
            name=name,
            model=g.model.name,
            memory_total_mib=g.model.memory_mib,
            memory_used_mib=min(used, g.model.memory_mib),
            utilization_pct=None if mig_enabled else util_read,
            temperature_c=int(temp),
            power_mw=int(power),
            mig_enabled=mig_enabled,
            mig_devices=tuple(migs),
            processes=tuple(procs),
            pci_bus_id=f"00000000:{0x18 + g.index:02X}:00.0",
            mig_pending=mig_enabled,
        )

    def read(self, node: str) -> DeviceSnapshot:
        if self._clock is not None:
            self.advance(self._clock() - self._now)
        states = [st for st in self._gpus.values() if st.spec.node == node]
        if not states and node not in self.nodes():
            raise KeyError(f"unknown node {node!r} (known: {', '.join(self.nodes())})")
        self._held = held(self.vram_registry)
        events: list[XidEvent] = []
        for st in states:
            events += st.events
            st.events = []
        gpus = tuple(self._reading(st) for st in states)
        return DeviceSnapshot(node, self._now, gpus, tuple(events), "simulated", "simulated")

    def read_all(self) -> tuple[DeviceSnapshot, ...]:
        return tuple(self.read(n) for n in self.nodes())

    def source(self, node: str) -> SimulatedDeviceSource:
        if node not in self.nodes():
            raise KeyError(f"unknown node {node!r} (known: {', '.join(self.nodes())})")
        return SimulatedDeviceSource(self, node)

    def inventory(self) -> Inventory:
        """The Inventory the core consumes: the plan's slices (or whole cards) with simulated uuids."""
        base = (
            inventory_from_plan(self._current_plan())
            if self._repartitioned
            else inventory_from_plan(self.plan)
            if self.plan is not None
            else inventory_from_cluster(self.cluster)
        )
        out: list[Slice] = []
        for s in base:
            st = self._gpus[s.gpu_id]
            uuid = _uuid("MIG", self.seed, s.id) if s.kind is SliceKind.MIG else st.uuid
            out.append(
                Slice(
                    s.id,
                    s.node,
                    s.gpu_id,
                    s.kind,
                    s.capacity,
                    not st.lost,
                    s.gpu_index,
                    s.gpu_model,
                    s.profile,
                    uuid,
                    s.labels,
                )
            )
        return Inventory(tuple(out))


class SimulatedDeviceSource:
    """One node's view of a ``SimulatedCluster`` (a ``DeviceSource``)."""

    def __init__(self, cluster: SimulatedCluster, node: str) -> None:
        self.cluster = cluster
        self.node = node

    def read(self) -> DeviceSnapshot:
        return self.cluster.read(self.node)

    def close(self) -> None:
        return None
