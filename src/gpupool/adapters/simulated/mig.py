"""`SimulatedMigHardware`: NVML's MIG calls on a `SimulatedCluster` node, with NVML's semantics.

Role: lets the bare-node MIG actuator (`gpupool.hardware.migactuate.NvmlMigActuator`) run the whole
re-partition path without a GPU. GPU instances are the cluster's MIG slices of that GPU (GPU instance
id = start slot + 1, as the simulated readings report them); creating or destroying one changes the
slices the cluster reads and publishes.

Semantics and error codes (`NvmlMigError`), as NVML documents them:
- any call on a GPU whose MIG mode is off: ``NVML_ERROR_NOT_SUPPORTED``;
- a profile the GPU does not have, or a start slot the profile may not use: ``NVML_ERROR_INVALID_ARGUMENT``;
- an overlap, the profile's instance limit or the SM-slice budget exceeded, a second compute
  instance on a GPU instance: ``NVML_ERROR_INSUFFICIENT_RESOURCES``;
- destroying a compute instance with processes on it, or a GPU instance that still has compute
  instances or processes: ``NVML_ERROR_IN_USE``.
Processes are what the readings show: a placed replica, and live holders of the VRAM registry.

Invariants: legality is the catalogue's (`gpupool.hardware.mig.layout_problems`); MIG mode is changed
only by `SimulatedCluster.set_mig_mode` (an operator action, refused while instances exist).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.hardware.mig import MigInstance, layout_problems, mig_profiles
from gpupool.hardware.migactuate import (
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    GpuInstanceInfo,
    NvmlMigError,
)
from gpupool.hardware.plantypes import PlannedSlice
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU

if TYPE_CHECKING:
    from gpupool.adapters.simulated.cluster import SimulatedCluster, _GpuState


class SimulatedMigHardware:
    def __init__(self, cluster: SimulatedCluster, node: str) -> None:
        self.cluster = cluster
        self.node = node

    def _gpu(self, index: int, call: str) -> _GpuState:
        st = self.cluster._gpu_at(self.node, index)
        if st is None:
            raise NvmlMigError(NVML_ERROR_INVALID_ARGUMENT, call, f"no GPU {index} on node {self.node}")
        if not self.cluster._mig_on(st):
            raise NvmlMigError(NVML_ERROR_NOT_SUPPORTED, call, f"MIG mode is disabled on GPU {index}")
        return st

    def mig_enabled(self, index: int) -> bool:
        st = self.cluster._gpu_at(self.node, index)
        return st is not None and self.cluster._mig_on(st)

    def gpu_instances(self, index: int) -> tuple[GpuInstanceInfo, ...]:
        st = self._gpu(index, "nvmlDeviceGetGpuInstances")
        out = []
        for s in st.slices:
            if s.kind is SliceKind.MIG:
                gi = s.start + 1
                out.append(GpuInstanceInfo(gi, s.profile, s.start, tuple(st.cis.get(gi, ())), self._pids(s)))
        return tuple(sorted(out, key=lambda g: g.start))

    def _pids(self, s: PlannedSlice) -> tuple[int, ...]:
        return self.cluster._slice_pids(s)

    def create_gpu_instance(self, index: int, profile: str, start: int) -> int:
        call = "nvmlDeviceCreateGpuInstanceWithPlacement"
        st = self._gpu(index, call)
        model = st.spec.model
        p = next((q for q in mig_profiles(model) if q.name == profile), None)
        if p is None:
            raise NvmlMigError(NVML_ERROR_INVALID_ARGUMENT, call, f"profile {profile!r} not on {model.name}")
        if start not in p.starts:
            raise NvmlMigError(
                NVML_ERROR_INVALID_ARGUMENT, call, f"start {start} is not a placement of {profile} {p.starts}"
            )
        current = [MigInstance(s.profile, s.start) for s in st.slices if s.kind is SliceKind.MIG]
        problems = layout_problems(model, [*current, MigInstance(profile, start)])
        if problems:
            raise NvmlMigError(NVML_ERROR_INSUFFICIENT_RESOURCES, call, problems[0])
        from gpupool.hardware.mig import family_of

        fam = family_of(model)
        new = PlannedSlice(
            f"{st.spec.gpu_id}/mig-{profile}-{start}",
            SliceKind.MIG,
            p.memory_mib,
            p.sm_slices * COMPUTE_MILLI_PER_GPU // fam.sm_slices,
            profile,
            start,
            pool=True,
        )
        self.cluster._set_slices(st, (*st.slices, new))
        return start + 1

    def create_compute_instance(self, index: int, gi_id: int) -> int:
        call = "nvmlGpuInstanceCreateComputeInstance"
        st = self._gpu(index, call)
        self._slice_of(st, gi_id, call)
        cis = st.cis.setdefault(gi_id, [])
        if cis:
            raise NvmlMigError(
                NVML_ERROR_INSUFFICIENT_RESOURCES,
                call,
                f"GPU instance {gi_id} already has a full-size compute instance",
            )
        cis.append(0)
        return 0

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        call = "nvmlComputeInstanceDestroy"
        st = self._gpu(index, call)
        s = self._slice_of(st, gi_id, call)
        if ci_id not in st.cis.get(gi_id, []):
            raise NvmlMigError(
                NVML_ERROR_INVALID_ARGUMENT, call, f"no compute instance {ci_id} on GI {gi_id}"
            )
        pids = self._pids(s)
        if pids:
            raise NvmlMigError(NVML_ERROR_IN_USE, call, f"processes {', '.join(map(str, pids))} running")
        st.cis[gi_id].remove(ci_id)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        call = "nvmlGpuInstanceDestroy"
        st = self._gpu(index, call)
        s = self._slice_of(st, gi_id, call)
        pids = self._pids(s)
        if st.cis.get(gi_id) or pids:
            what = f"compute instances {st.cis.get(gi_id)}" if st.cis.get(gi_id) else f"processes {pids}"
            raise NvmlMigError(NVML_ERROR_IN_USE, call, f"GPU instance {gi_id} still has {what}")
        st.cis.pop(gi_id, None)
        self.cluster._set_slices(st, tuple(x for x in st.slices if x.id != s.id))

    @staticmethod
    def _slice_of(st: _GpuState, gi_id: int, call: str) -> PlannedSlice:
        for s in st.slices:
            if s.kind is SliceKind.MIG and s.start + 1 == gi_id:
                return s
        raise NvmlMigError(NVML_ERROR_INVALID_ARGUMENT, call, f"no GPU instance {gi_id}")
