"""`NvmlDeviceSource`: GPUs and MIG devices of one node read through NVML, as ``DeviceSnapshot`` values.

Role: the real device source of layer 1 (fact sheet section 3). Works with any pynvml-shaped module so
tests replay fixtures (hand-written from reference facts) through ``FakeNvml``; the real ``pynvml`` is
imported only on first use.

Invariants:
- MIG memory and SM counts are read from the device (``nvmlDeviceGetMemoryInfo`` on the MIG handle,
  ``nvmlDeviceGetAttributes``), never taken from the catalogue. MIG profile names are NVML's own
  (``nvmlDeviceGetGpuInstanceProfileInfoById(...).name``, so ``1g.10gb+me`` keeps its ``+me``); only
  when the driver cannot say are they derived from slices and memory (go-nvlib rounding).
- Memory is read with ``nvmlDeviceGetMemoryInfo`` v2 where the driver has it: ``used`` excludes the
  driver/firmware ``reserved`` memory, which is reported apart (v1's ``used`` includes it).
- PCI bus id, pending MIG mode and the CUDA driver version are read where NVML supports them.
- ``NOT_SUPPORTED`` / ``NO_PERMISSION`` on one call leaves that field None and the GPU healthy;
  ``GPU_IS_LOST`` (or any other error on the identity/memory calls) makes the GPU ``healthy=False``
  with the error text; a fatal XID event (``FATAL_XIDS``) does too, until the process restarts.
- Utilisation on MIG-enabled GPUs is None (NVML does not support it); each MIG device carries
  ``engine_active_pct`` from GPM on Hopper and newer (None on Ampere and on the first read).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

from gpupool.adapters.nvml.gpm import GpmSampler
from gpupool.hardware.catalogue import model_from_nvml_name
from gpupool.hardware.devices import DeviceSnapshot, GpuReading, MigDeviceReading, ProcessReading, XidEvent

MIB = 1024 * 1024
GIB = 1024 * MIB
NO_ID = 0xFFFFFFFF

ERR_NOT_SUPPORTED = 3
ERR_NO_PERMISSION = 4
ERR_NOT_FOUND = 6
ERR_TIMEOUT = 10
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_ARGUMENT_VERSION_MISMATCH = 25
SOFT_ERRORS = frozenset({ERR_NOT_SUPPORTED, ERR_NO_PERMISSION, ERR_NOT_FOUND})
MEMORY_V2 = 0x02000028
"""``nvmlMemory_v2``: the version argument of ``nvmlDeviceGetMemoryInfo`` that reports ``reserved``."""

FATAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""XIDs after which the GPU is treated as unhealthy (DBE, fallen off the bus, row-remap failure, ...)."""
XID_EVENT = 0x8


class NvmlUnavailableError(RuntimeError):
    """pynvml or libnvidia-ml.so.1 is not available on this machine."""


def load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailableError("nvidia-ml-py is not installed (pip install 'gpupool[nvml]')") from exc
    return pynvml


def mig_profile_name(sm_slices: int, memory_mib: int, parent_total_mib: int) -> str:
    """``<G>g.<N>gb`` from NVML data, with NVIDIA's go-nvlib rounding (fact sheet 1.5)."""
    total_bytes = parent_total_mib * MIB
    if total_bytes <= 0:
        return f"{sm_slices}g.{round(memory_mib / 1024)}gb"
    eighths = math.ceil(8 * memory_mib * MIB / total_bytes)
    gb = math.floor(eighths / 8 * math.ceil(total_bytes / GIB) + 0.5)
    return f"{sm_slices}g.{gb}gb"


def text_of(value: Any) -> str:
    """A ctypes char-array field as str (pynvml returns bytes on some versions)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value or "")


def _code(exc: BaseException) -> int:
    value = getattr(exc, "value", -1)
    return value if isinstance(value, int) else -1


class NvmlDeviceSource:
    """Reads every GPU of one node. ``read()`` is safe to call every 200 ms; ``close()`` shuts NVML down."""

    def __init__(
        self,
        node: str,
        *,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
        events: bool = True,
    ) -> None:
        self.node = node
        self._nv: Any = nvml
        self._clock = clock
        self._want_events = events
        self._event_set: Any = None
        self._started = False
        self._xid_lost: dict[str, str] = {}
        self._gpm_sampler: GpmSampler | None = None
        self._profile_names: dict[tuple[str, int], str] = {}

    def _lib(self) -> Any:
        if self._nv is None:
            self._nv = load_pynvml()
        if not self._started:
            try:
                self._nv.nvmlInit()
            except self._nv.NVMLError as exc:
                raise NvmlUnavailableError(f"nvmlInit failed: {exc}") from exc
            self._started = True
        return self._nv

    def _gpm(self) -> GpmSampler:
        if self._gpm_sampler is None:
            self._gpm_sampler = GpmSampler(self._nv)
        return self._gpm_sampler

    def _soft(self, fn: Callable[..., Any], *args: Any) -> Any:
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if _code(exc) in SOFT_ERRORS:
                return None
            raise

    def read(self) -> DeviceSnapshot:
        nv = self._lib()
        driver = str(self._soft(nv.nvmlSystemGetDriverVersion) or "")
        cuda = int(self._soft(nv.nvmlSystemGetCudaDriverVersion) or 0)
        count = nv.nvmlDeviceGetCount()
        handles: list[tuple[int, Any]] = []
        gpus: list[GpuReading] = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as exc:
                gpus.append(
                    GpuReading(i, "", "", "", 0, 0, healthy=False, error=f"{type(exc).__name__}: {exc}")
                )
                continue
            handles.append((i, h))
            gpus.append(self._read_gpu(i, h))
        events = self._poll_events(handles)
        for ev in events:
            if ev.xid in FATAL_XIDS:
                self._xid_lost[ev.gpu_uuid] = f"xid {ev.xid}"
        gpus = [
            GpuReading(**{**_fields(g), "healthy": False, "error": g.error or self._xid_lost[g.uuid]})
            if g.uuid in self._xid_lost
            else g
            for g in gpus
        ]
        return DeviceSnapshot(self.node, self._clock(), tuple(gpus), tuple(events), driver, "nvml", cuda)

    def _read_gpu(self, index: int, h: Any) -> GpuReading:
        nv = self._nv
        uuid = name = ""
        try:
            uuid = str(nv.nvmlDeviceGetUUID(h))
            name = str(nv.nvmlDeviceGetName(h))
            # with MIG on, the parent's aggregate memory needs privileges: NO_PERMISSION -> from MIG devices
            mem = self._memory(h)
        except nv.NVMLError as exc:
            lost = "GPU is lost" if _code(exc) == ERR_GPU_IS_LOST else str(exc)
            return GpuReading(
                index, uuid, name, "", 0, 0, healthy=False, error=f"{type(exc).__name__}: {lost}"
            )
        model = model_from_nvml_name(name, total_mib=int(mem.total) // MIB if mem is not None else 0)
        total_mib = int(mem.total) // MIB if mem is not None else (model.memory_mib if model else 0)
        used_mib = int(mem.used) // MIB if mem is not None else 0
        reserved_mib = int(getattr(mem, "reserved", 0) or 0) // MIB if mem is not None else 0
        try:
            pci = self._soft(nv.nvmlDeviceGetPciInfo, h)
            bus_id = text_of(getattr(pci, "busId", "")) if pci is not None else ""
            mig_mode = self._soft(nv.nvmlDeviceGetMigMode, h)
            mig_enabled = bool(mig_mode and int(mig_mode[0]) == 1)
            mig_pending = bool(int(mig_mode[1]) == 1) if mig_mode and len(mig_mode) > 1 else None
            util = None if mig_enabled else self._soft(nv.nvmlDeviceGetUtilizationRates, h)
            temp = self._soft(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            power = self._soft(nv.nvmlDeviceGetPowerUsage, h)
            procs = self._processes(h)
            migs = self._mig_devices(h, total_mib, uuid) if mig_enabled else ()
        except nv.NVMLError as exc:
            lost = "GPU is lost" if _code(exc) == ERR_GPU_IS_LOST else str(exc)
            return GpuReading(
                index,
                uuid,
                name,
                model.name if model else "",
                total_mib,
                used_mib,
                healthy=False,
                error=f"{type(exc).__name__}: {lost}",
            )
        if mem is None:
            used_mib = sum(d.memory_used_mib for d in migs)
            if not total_mib:
                total_mib = sum(d.memory_total_mib for d in migs)
        if mem is None and not mig_enabled:
            return GpuReading(
                index,
                uuid,
                name,
                model.name if model else "",
                total_mib,
                0,
                healthy=False,
                error="nvmlDeviceGetMemoryInfo not permitted or not supported",
                pci_bus_id=bus_id,
            )
        return GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            model=model.name if model else "",
            memory_total_mib=total_mib,
            memory_used_mib=used_mib,
            utilization_pct=None if util is None else int(util.gpu),
            temperature_c=None if temp is None else int(temp),
            power_mw=None if power is None else int(power),
            mig_enabled=mig_enabled,
            mig_devices=migs,
            processes=procs,
            pci_bus_id=bus_id,
            memory_reserved_mib=reserved_mib,
            mig_pending=mig_pending,
        )

    def _memory(self, h: Any) -> Any:
        """``nvmlDeviceGetMemoryInfo`` v2 (``reserved`` apart from ``used``), else v1; None if not allowed."""
        nv = self._nv
        try:
            return nv.nvmlDeviceGetMemoryInfo(h, version=getattr(nv, "nvmlMemory_v2", MEMORY_V2))
        except nv.NVMLError as exc:
            if _code(exc) not in (ERR_ARGUMENT_VERSION_MISMATCH, ERR_FUNCTION_NOT_FOUND, *SOFT_ERRORS):
                raise
        except TypeError:  # NOTE: a pynvml too old to take ``version``
            pass
        return self._soft(nv.nvmlDeviceGetMemoryInfo, h)

    def _profile_name(self, parent: Any, parent_uuid: str, profile_id: int) -> str:
        """NVML's name of a GPU-instance profile (``1g.10gb+me``), cached per GPU; '' when unknown."""
        key = (parent_uuid, profile_id)
        if key not in self._profile_names:
            info = self._soft(self._nv.nvmlDeviceGetGpuInstanceProfileInfoById, parent, profile_id)
            name = text_of(getattr(info, "name", "")) if info is not None else ""
            self._profile_names[key] = name.removeprefix("MIG ").strip()
        return self._profile_names[key]

    def _processes(self, h: Any) -> tuple[ProcessReading, ...]:
        nv = self._nv
        procs = self._soft(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            gi = getattr(p, "gpuInstanceId", NO_ID)
            ci = getattr(p, "computeInstanceId", NO_ID)
            out.append(
                ProcessReading(
                    int(p.pid),
                    0 if used is None else int(used) // MIB,
                    -1 if gi in (None, NO_ID) else int(gi),
                    -1 if ci in (None, NO_ID) else int(ci),
                )
            )
        return tuple(sorted(out, key=lambda p: p.pid))

    def _mig_devices(
        self, parent: Any, parent_total_mib: int, parent_uuid: str
    ) -> tuple[MigDeviceReading, ...]:
        nv = self._nv
        n = int(self._soft(nv.nvmlDeviceGetMaxMigDeviceCount, parent) or 0)
        out: list[MigDeviceReading] = []
        for i in range(n):
            try:
                m = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
            except nv.NVMLError as exc:
                if _code(exc) == ERR_NOT_FOUND:
                    continue
                raise
            gi = int(nv.nvmlDeviceGetGpuInstanceId(m))
            ci = int(nv.nvmlDeviceGetComputeInstanceId(m))
            mem = nv.nvmlDeviceGetMemoryInfo(m)
            attrs = self._soft(nv.nvmlDeviceGetAttributes, m)
            sm_slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else 0
            sm_count = int(attrs.multiprocessorCount) if attrs is not None else 0
            total_mib = int(mem.total) // MIB
            start = profile_id = -1
            gi_handle = self._soft(nv.nvmlDeviceGetGpuInstanceById, parent, gi)
            if gi_handle is not None:
                info = self._soft(nv.nvmlGpuInstanceGetInfo, gi_handle)
                if info is not None:
                    start = int(info.placement.start)
                    profile_id = int(getattr(info, "profileId", -1))
            named = self._profile_name(parent, parent_uuid, profile_id) if profile_id >= 0 else ""
            out.append(
                MigDeviceReading(
                    uuid=str(nv.nvmlDeviceGetUUID(m)),
                    index=i,
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                    profile=named or mig_profile_name(sm_slices, total_mib, parent_total_mib),
                    memory_total_mib=total_mib,
                    memory_used_mib=int(mem.used) // MIB,
                    sm_count=sm_count,
                    sm_slices=sm_slices,
                    start=start,
                    engine_active_pct=self._gpm().engine_active_pct(parent_uuid, parent, gi),
                    processes=self._processes(m),
                    gi_profile_id=profile_id,
                )
            )
        return tuple(out)

    def _poll_events(self, handles: list[tuple[int, Any]]) -> list[XidEvent]:
        nv = self._nv
        if not self._want_events:
            return []
        if self._event_set is None:
            try:
                self._event_set = nv.nvmlEventSetCreate()
            except nv.NVMLError:
                self._want_events = False
                return []
            for _, h in handles:
                with contextlib.suppress(nv.NVMLError):  # unprivileged, unsupported or lost: skip that GPU
                    nv.nvmlDeviceRegisterEvents(h, XID_EVENT, self._event_set)
        out: list[XidEvent] = []
        for _ in range(1024):  # drain what is pending; never block the 200 ms loop
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError as exc:
                if _code(exc) in (ERR_TIMEOUT, *SOFT_ERRORS):
                    break
                raise
            if int(data.eventType) & XID_EVENT:
                try:
                    uuid = str(nv.nvmlDeviceGetUUID(data.device))
                except nv.NVMLError:
                    uuid = ""
                gi = getattr(data, "gpuInstanceId", NO_ID)
                ci = getattr(data, "computeInstanceId", NO_ID)
                out.append(
                    XidEvent(
                        uuid,
                        int(data.eventData),
                        -1 if gi == NO_ID else int(gi),
                        -1 if ci == NO_ID else int(ci),
                    )
                )
        return out

    def close(self) -> None:
        nv = self._nv
        if nv is None or not self._started:
            return
        if self._gpm_sampler is not None:
            self._gpm_sampler.close()
            self._gpm_sampler = None
        if self._event_set is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._event_set)
            self._event_set = None
        try:
            nv.nvmlShutdown()
        finally:
            self._started = False


def _fields(g: GpuReading) -> dict[str, Any]:
    return {f: getattr(g, f) for f in GpuReading.__dataclass_fields__}
