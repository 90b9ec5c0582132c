"""A stand-in for libnvidia-ml's MIG calls, pynvml-shaped, backed by a simulated node.

Role: lets `gpupool.adapters.nvml.mig.NvmlMigHardware` run its real pynvml call sequence (profile
infos, possible placements, ctypes arrays filled through ``byref`` counts, create/destroy) without a
GPU. Every call is answered from `SimulatedCluster.mig_hardware` (NVML's semantics and error codes),
so NVML errors surface as the real ``pynvml.NVMLError`` subclasses. Handles are integers
(``c_nvmlGpuInstance_t`` / ``c_nvmlComputeInstance_t`` are ``c_size_t`` here).
"""

# ruff: noqa: N815  (reason: attribute names mirror the pynvml types they stand in for)

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pynvml

from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.cluster import NVML_NAMES
from gpupool.hardware.mig import mig_profiles
from gpupool.hardware.migactuate import NvmlMigError

MIB = 1024 * 1024
SHAPES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: "1g",
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1g+me",
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1g2",
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: "2g",
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: "3g",
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: "4g",
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: "7g",
}
CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}


class NvmlMigStandin:
    NVMLError = pynvml.NVMLError
    c_nvmlGpuInstance_t = ctypes.c_size_t
    c_nvmlComputeInstance_t = ctypes.c_size_t
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t

    def __init__(self, sim: SimulatedCluster, node: str) -> None:
        self.sim, self.node = sim, node
        self.hw = sim.mig_hardware(node)
        self.calls: list[str] = []
        for name in dir(pynvml):
            if name.startswith(("NVML_GPU_INSTANCE_PROFILE_", "NVML_COMPUTE_INSTANCE_", "NVML_DEVICE_MIG")):
                setattr(self, name, getattr(pynvml, name))

    # -- helpers
    def _model(self, index: int) -> Any:
        return next(g for g in self.sim.cluster.gpus() if g.node == self.node and g.index == index).model

    def _profile(self, index: int, const: int) -> Any:
        shape = SHAPES.get(const)
        p = next((q for q in mig_profiles(self._model(index)) if q.shape == shape), None)
        if p is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return p

    def _by_id(self, index: int, profile_id: int) -> Any:
        return next(q for q in mig_profiles(self._model(index)) if q.profile_id == profile_id)

    @staticmethod
    def _fill(arr: Any, ref: Any, items: list[int]) -> None:
        for k, v in enumerate(items):
            arr[k] = v
        ref._obj.value = len(items)

    def _hw(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except NvmlMigError as exc:
            raise pynvml.NVMLError(exc.code) from None

    def _gi(self, handle: int) -> tuple[int, Any]:
        index, gi_id = divmod(int(handle), 100)
        for g in self.hw.gpu_instances(index):
            if g.gi_id == gi_id:
                return index, g
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # -- library
    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return NVML_NAMES[self._model(h).name]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=self._model(h).memory_mib * MIB)

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        on = int(self.hw.mig_enabled(h))
        return [on, on]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: int, const: int) -> Any:
        p = self._profile(h, const)
        return SimpleNamespace(id=p.profile_id, sliceCount=p.sm_slices, memorySizeMB=p.memory_mib)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: int, profile_id: int, arr: Any, ref: Any) -> int:
        p = self._by_id(h, profile_id)
        for k, start in enumerate(p.starts):
            arr[k].start, arr[k].size = start, p.memory_slices
        ref._obj.value = len(p.starts)
        return 0

    def nvmlDeviceGetGpuInstances(self, h: int, profile_id: int, arr: Any, ref: Any) -> int:
        name = self._by_id(h, profile_id).name
        gis = self._hw(self.hw.gpu_instances, h)
        self._fill(arr, ref, [h * 100 + g.gi_id for g in gis if g.profile == name])
        return 0

    def nvmlGpuInstanceGetInfo(self, gi: int) -> Any:
        index, g = self._gi(gi)
        p = next(q for q in mig_profiles(self._model(index)) if q.name == g.profile)
        placement = SimpleNamespace(start=g.start, size=p.memory_slices)
        return SimpleNamespace(id=g.gi_id, profileId=p.profile_id, placement=placement)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: int, profile_id: int, placement: Any) -> int:
        self.calls.append(f"create_gi {h} {profile_id} @{placement.start}+{placement.size}")
        p = self._by_id(h, profile_id)
        if placement.size != p.memory_slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return h * 100 + int(self._hw(self.hw.create_gpu_instance, h, p.name, int(placement.start)))

    def nvmlDeviceGetGpuInstanceById(self, h: int, gi_id: int) -> int:
        self._gi(h * 100 + gi_id)
        return h * 100 + gi_id

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, const: int, engines: int) -> Any:
        index, g = self._gi(gi)
        p = next(q for q in mig_profiles(self._model(index)) if q.name == g.profile)
        if CI_SLICES.get(const, 0) > p.sm_slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=const, sliceCount=CI_SLICES[const])

    def nvmlGpuInstanceGetComputeInstances(self, gi: int, ci_profile_id: int, arr: Any, ref: Any) -> int:
        index, g = self._gi(gi)
        p = next(q for q in mig_profiles(self._model(index)) if q.name == g.profile)
        full = CI_SLICES.get(ci_profile_id) == p.sm_slices
        self._fill(arr, ref, [gi * 100 + ci for ci in g.compute_instances] if full else [])
        return 0

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, ci_profile_id: int) -> int:
        index, g = self._gi(gi)
        self.calls.append(f"create_ci {index} gi{g.gi_id} profile{ci_profile_id}")
        return gi * 100 + int(self._hw(self.hw.create_compute_instance, index, g.gi_id))

    def nvmlComputeInstanceGetInfo(self, ci: int) -> Any:
        return SimpleNamespace(id=int(ci) % 100)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: int, ci_id: int) -> int:
        return gi * 100 + ci_id

    def nvmlComputeInstanceDestroy(self, ci: int) -> None:
        gi, ci_id = divmod(int(ci), 100)
        index, g = self._gi(gi)
        self.calls.append(f"destroy_ci {index} gi{g.gi_id} ci{ci_id}")
        self._hw(self.hw.destroy_compute_instance, index, g.gi_id, ci_id)

    def nvmlGpuInstanceDestroy(self, gi: int) -> None:
        index, g = self._gi(gi)
        self.calls.append(f"destroy_gi {index} gi{g.gi_id}")
        self._hw(self.hw.destroy_gpu_instance, index, g.gi_id)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, k: int) -> int:
        gis = self.hw.gpu_instances(h)
        if k >= len(gis):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return h * 100 + gis[k].gi_id

    def nvmlDeviceGetGpuInstanceId(self, mig: int) -> int:
        return int(mig) % 100

    def nvmlDeviceGetComputeRunningProcesses(self, mig: int) -> list[Any]:
        _index, g = self._gi(mig)
        return [SimpleNamespace(pid=p) for p in g.processes]
