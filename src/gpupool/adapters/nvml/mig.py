"""`NvmlMigHardware`: the `gpupool.hardware.migactuate.MigHardware` calls on real GPUs, via pynvml.

Role: what the bare-node MIG actuator (`NvmlMigActuator`) drives on a node without the GPU Operator:
``nvmlDeviceCreateGpuInstanceWithPlacement`` (profile from the catalogue's shape, start slot from the
plan), ``nvmlGpuInstanceCreateComputeInstance`` (the full-size compute instance, shared engines),
``nvmlComputeInstanceDestroy`` and ``nvmlGpuInstanceDestroy``. NVML errors become `NvmlMigError` with
NVML's own return code, so the actuator reports exactly what the driver said.

Invariants:
- MIG mode is read (``nvmlDeviceGetMigMode``), never changed: toggling it needs a GPU reset and is
  an operator's decision.
- Profiles are mapped by shape (``1g``, ``1g+me``, ``1g2``, ``2g``, ``3g``, ``4g``, ``7g``) to NVML's
  ``NVML_GPU_INSTANCE_PROFILE_*`` constants; the model comes from NVML's name and memory.
- pynvml is imported lazily (`load_pynvml`); ``nvmlInit`` runs once per instance.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from gpupool.adapters.nvml.source import load_pynvml
from gpupool.hardware.catalogue import GpuModel, model_from_nvml_name
from gpupool.hardware.mig import mig_profiles
from gpupool.hardware.migactuate import NVML_ERROR_INVALID_ARGUMENT, GpuInstanceInfo, NvmlMigError

MAX_INSTANCES = 8
"""At most 7 GPU instances per GPU (8 memory slots); one array of 8 holds any NVML list here."""
SHAPE_CONSTANT = {
    "1g": "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    "1g+me": "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1",
    "1g2": "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    "2g": "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    "2g+me": "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1",
    "3g": "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    "4g": "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    "7g": "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
}
CI_CONSTANT = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
}


def nvml_profile_constant(model: GpuModel, profile: str) -> tuple[str, int]:
    """(``NVML_GPU_INSTANCE_PROFILE_*`` name, SM slices) of a catalogue profile name on ``model``."""
    p = next((q for q in mig_profiles(model) if q.name == profile), None)
    if p is None or p.shape not in SHAPE_CONSTANT:
        raise NvmlMigError(
            NVML_ERROR_INVALID_ARGUMENT, "profile", f"{profile!r} is not a profile of {model.name}"
        )
    return SHAPE_CONSTANT[p.shape], p.sm_slices


class NvmlMigHardware:
    def __init__(self, *, lib: Any | None = None) -> None:
        self._nv = lib if lib is not None else load_pynvml()
        self._nv.nvmlInit()

    def close(self) -> None:
        self._nv.nvmlShutdown()

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = getattr(exc, "value", -1)
            raise NvmlMigError(code if isinstance(code, int) else -1, name, str(exc)) from None

    def _h(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", self._nv.nvmlDeviceGetHandleByIndex, index)

    def _model(self, h: Any) -> GpuModel:
        nv = self._nv
        name = self._call("nvmlDeviceGetName", nv.nvmlDeviceGetName, h)
        name = name.decode() if isinstance(name, bytes) else str(name)
        mem = self._call("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, h)
        model = model_from_nvml_name(name, total_mib=int(mem.total) // (1024 * 1024))
        if model is None:
            raise NvmlMigError(
                NVML_ERROR_INVALID_ARGUMENT, "nvmlDeviceGetName", f"{name!r} is not in the catalogue"
            )
        return model

    def mig_enabled(self, index: int) -> bool:
        current, _pending = self._call("nvmlDeviceGetMigMode", self._nv.nvmlDeviceGetMigMode, self._h(index))
        return bool(current == self._nv.NVML_DEVICE_MIG_ENABLE)

    def _gis(self, h: Any) -> list[tuple[Any, Any, str]]:
        """(GI handle, GI info, catalogue profile name) of every GPU instance."""
        nv, model = self._nv, self._model(h)
        out = []
        for p in mig_profiles(model):
            const = getattr(nv, SHAPE_CONSTANT.get(p.shape, ""), None)
            if const is None:
                continue
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, const)
            except nv.NVMLError:
                continue  # this driver/GPU does not offer the profile
            arr = (nv.c_nvmlGpuInstance_t * MAX_INSTANCES)()
            n = ctypes.c_uint(0)
            self._call(
                "nvmlDeviceGetGpuInstances", nv.nvmlDeviceGetGpuInstances, h, info.id, arr, ctypes.byref(n)
            )
            for gi in arr[: n.value]:
                out.append((gi, self._call("nvmlGpuInstanceGetInfo", nv.nvmlGpuInstanceGetInfo, gi), p.name))
        return out

    def _processes(self, h: Any) -> dict[int, tuple[int, ...]]:
        nv = self._nv
        out: dict[int, list[int]] = {}
        count = self._call("nvmlDeviceGetMaxMigDeviceCount", nv.nvmlDeviceGetMaxMigDeviceCount, h)
        for k in range(int(count)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except nv.NVMLError:
                continue
            gi = int(self._call("nvmlDeviceGetGpuInstanceId", nv.nvmlDeviceGetGpuInstanceId, mig))
            procs = self._call(
                "nvmlDeviceGetComputeRunningProcesses", nv.nvmlDeviceGetComputeRunningProcesses, mig
            )
            out.setdefault(gi, []).extend(int(p.pid) for p in procs)
        return {k: tuple(sorted(v)) for k, v in out.items()}

    def _cis(self, gi: Any) -> list[Any]:
        nv = self._nv
        out: list[Any] = []
        for name in CI_CONSTANT.values():
            const = getattr(nv, name, None)
            if const is None:
                continue
            try:
                info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, const, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
                arr = (nv.c_nvmlComputeInstance_t * MAX_INSTANCES)()
                n = ctypes.c_uint(0)
                nv.nvmlGpuInstanceGetComputeInstances(gi, info.id, arr, ctypes.byref(n))
                out.extend(arr[: n.value])
            except nv.NVMLError:
                continue
        return out

    def gpu_instances(self, index: int) -> tuple[GpuInstanceInfo, ...]:
        h = self._h(index)
        procs = self._processes(h)
        out = []
        for gi, info, profile in self._gis(h):
            cis = tuple(int(self._nv.nvmlComputeInstanceGetInfo(ci).id) for ci in self._cis(gi))
            out.append(
                GpuInstanceInfo(
                    int(info.id), profile, int(info.placement.start), cis, procs.get(int(info.id), ())
                )
            )
        return tuple(sorted(out, key=lambda g: g.start))

    def create_gpu_instance(self, index: int, profile: str, start: int) -> int:
        nv, h = self._nv, self._h(index)
        const_name, _sm = nvml_profile_constant(self._model(h), profile)
        call = "nvmlDeviceCreateGpuInstanceWithPlacement"
        info = self._call(
            "nvmlDeviceGetGpuInstanceProfileInfo",
            nv.nvmlDeviceGetGpuInstanceProfileInfo,
            h,
            getattr(nv, const_name),
        )
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = _placement_size(nv, h, info.id, start)
        gi = self._call(call, nv.nvmlDeviceCreateGpuInstanceWithPlacement, h, info.id, placement)
        return int(self._call("nvmlGpuInstanceGetInfo", nv.nvmlGpuInstanceGetInfo, gi).id)

    def _gi(self, index: int, gi_id: int) -> Any:
        nv = self._nv
        return self._call(
            "nvmlDeviceGetGpuInstanceById", nv.nvmlDeviceGetGpuInstanceById, self._h(index), gi_id
        )

    def create_compute_instance(self, index: int, gi_id: int) -> int:
        nv = self._nv
        gi = self._gi(index, gi_id)
        info = self._call("nvmlGpuInstanceGetInfo", nv.nvmlGpuInstanceGetInfo, gi)
        slices = next(
            (
                p.sm_slices
                for p in mig_profiles(self._model(self._h(index)))
                if getattr(nv, SHAPE_CONSTANT.get(p.shape, ""), None) is not None
                and _profile_id(nv, self._h(index), SHAPE_CONSTANT[p.shape]) == info.profileId
            ),
            0,
        )
        const = getattr(nv, CI_CONSTANT.get(slices, ""), None)
        if const is None:
            raise NvmlMigError(
                NVML_ERROR_INVALID_ARGUMENT, "nvmlGpuInstanceCreateComputeInstance", f"GI {gi_id}"
            )
        ci_info = self._call(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            const,
            nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        ci = self._call(
            "nvmlGpuInstanceCreateComputeInstance", nv.nvmlGpuInstanceCreateComputeInstance, gi, ci_info.id
        )
        return int(nv.nvmlComputeInstanceGetInfo(ci).id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        nv = self._nv
        gi = self._gi(index, gi_id)
        ci = self._call(
            "nvmlGpuInstanceGetComputeInstanceById", nv.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id
        )
        self._call("nvmlComputeInstanceDestroy", nv.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._call("nvmlGpuInstanceDestroy", self._nv.nvmlGpuInstanceDestroy, self._gi(index, gi_id))


def _profile_id(nv: Any, h: Any, const_name: str) -> int | None:
    try:
        return int(nv.nvmlDeviceGetGpuInstanceProfileInfo(h, getattr(nv, const_name)).id)
    except nv.NVMLError:
        return None


def _placement_size(nv: Any, h: Any, profile_id: int, start: int) -> int:
    """The size NVML lists for ``start`` among the profile's possible placements."""
    arr = (nv.c_nvmlGpuInstancePlacement_t * MAX_INSTANCES)()
    n = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(n))
    for p in arr[: n.value]:
        if int(p.start) == start:
            return int(p.size)
    raise NvmlMigError(
        NVML_ERROR_INVALID_ARGUMENT,
        "nvmlDeviceGetGpuInstancePossiblePlacements",
        f"start {start} not offered",
    )
