"""`FakeNvml`: a pynvml-shaped object that replays a fixture (tests/fixtures/nvml/*.json, hand-written
from reference facts, not recorded on hardware; ``record`` dumps real readings in the same format).

Role: the seam that lets ``NvmlDeviceSource`` run without a GPU. The fixture format is what ``record``
writes (format ``gpupool-nvml-fixture/1``): NVML's own units (bytes, mW, degC), one entry per physical GPU
with its MIG devices, processes, pending events, and ``errors``: NVML call name (or ``*``) -> NVML error
code, raised on every call of that name on that device (15 = GPU is lost). A MIG device may carry its
own ``errors``; the parent's ``*`` applies to its MIG devices too. GPM (Hopper+): ``gpm_supported`` on a
GPU and ``gpm_graphics_util`` (values returned by successive metric reads) on its MIG devices.

Optional keys (absent = the call raises NOT_SUPPORTED, as on a driver without it): top-level
``cuda_driver_version`` (int, 12020 = 12.2); per GPU ``pci_bus_id``, ``memory.reserved`` (bytes: memory
v2 then reports ``used`` without it, v1 with it, as NVML does) and ``gi_profiles`` (profile id ->
NVML profile name, ``"20": "MIG 1g.10gb+me"``).

Invariants: replay is deterministic; events are delivered once, in fixture order; a null
``utilization`` / ``temperature`` / ``power_mw`` raises NOT_SUPPORTED like NVML does.
"""

# ruff: noqa: N802, N815  (reason: method names mirror the pynvml functions they stand in for)

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURE_FORMAT = "gpupool-nvml-fixture/1"
NO_ID = 0xFFFFFFFF

ERROR_NAMES = {
    1: "Uninitialized",
    2: "InvalidArgument",
    3: "NotSupported",
    4: "NoPermission",
    6: "NotFound",
    9: "DriverNotLoaded",
    10: "Timeout",
    12: "LibraryNotFound",
    15: "GpuIsLost",
    16: "ResetRequired",
    19: "InUse",
    999: "Unknown",
}


class NVMLError(Exception):
    """Same shape as ``pynvml.NVMLError``: the NVML return code is ``value``."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(ERROR_NAMES.get(value, f"NVML error {value}"))


_ERROR_CLASSES: dict[int, type[NVMLError]] = {
    code: type(f"NVMLError_{name}", (NVMLError,), {}) for code, name in ERROR_NAMES.items()
}


def nvml_error(code: int) -> NVMLError:
    return _ERROR_CLASSES.get(code, NVMLError)(code)


@dataclass(eq=False)
class _Handle:
    data: dict[str, Any]
    parent: _Handle | None = None
    errors: dict[str, int] = field(default_factory=dict)


MEMORY_V2 = 0x02000028


def _mem(d: dict[str, Any], version: int | None = None) -> SimpleNamespace:
    """v1: ``used`` includes ``reserved``; v2 (``nvmlMemory_v2``): ``reserved`` is reported apart."""
    m = d["memory"]
    total, used = int(m["total"]), int(m["used"])
    free = int(m.get("free", total - used))
    if version == MEMORY_V2:
        reserved = int(m.get("reserved", 0))
        return SimpleNamespace(
            version=MEMORY_V2, total=total, reserved=reserved, free=free, used=max(0, used - reserved)
        )
    return SimpleNamespace(total=total, used=used, free=free)


class FakeNvml:
    """Replays one fixture. Attribute names mirror the pynvml functions ``NvmlDeviceSource`` calls."""

    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlEventTypeXidCriticalError = 0x8
    NVMLError = NVMLError

    def __init__(self, fixture: dict[str, Any]) -> None:
        if fixture.get("format") != FIXTURE_FORMAT:
            raise ValueError(f"fixture format {fixture.get('format')!r}: expected {FIXTURE_FORMAT!r}")
        self.fixture = fixture
        self.initialised = 0
        self._devices = [_Handle(d, errors=dict(d.get("errors", {}))) for d in fixture.get("devices", [])]
        self._migs: dict[int, list[_Handle]] = {}
        for i, dev in enumerate(self._devices):
            lost = {"*": dev.errors["*"]} if "*" in dev.errors else {}
            self._migs[i] = [
                _Handle(m, dev, {**lost, **m.get("errors", {})}) for m in dev.data.get("mig_devices", [])
            ]
        self._pending: list[tuple[_Handle, dict[str, Any]]] = []
        self._registered: set[int] = set()
        self._gpm_counts: dict[tuple[int, int], int] = {}
        self.gpm_live = 0
        """GPM samples allocated and not yet freed (tests check for leaks)."""

    @classmethod
    def from_fixture(cls, source: str | Path | dict[str, Any]) -> FakeNvml:
        data = source if isinstance(source, dict) else json.loads(Path(source).read_text(encoding="utf-8"))
        return cls(data)

    # --- helpers -------------------------------------------------------------------------------
    def _check(self, name: str, h: _Handle | None = None) -> None:
        if not self.initialised:
            raise nvml_error(1)
        if h is not None:
            code = h.errors.get(name, h.errors.get("*"))
            if code is not None:
                raise nvml_error(int(code))

    def _value(self, name: str, h: _Handle, key: str) -> Any:
        self._check(name, h)
        value = h.data.get(key)
        if value is None:
            raise nvml_error(3)
        return value

    # --- library -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return str(self.fixture.get("driver_version", ""))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        if "cuda_driver_version" not in self.fixture:
            raise nvml_error(3)
        return int(self.fixture["cuda_driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(self._devices):
            raise nvml_error(2)
        h = self._devices[i]
        code = h.errors.get("nvmlDeviceGetHandleByIndex")
        if code is not None:
            raise nvml_error(int(code))
        return h

    # --- per device ----------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return str(self._value("nvmlDeviceGetUUID", h, "uuid"))

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return str(h.data.get("name") or (h.parent.data.get("name") if h.parent else "") or "") or str(
            self._value("nvmlDeviceGetName", h, "name")
        )

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> SimpleNamespace:
        self._check("nvmlDeviceGetMemoryInfo", h)
        return _mem(h.data, version)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        bus = self._value("nvmlDeviceGetPciInfo", handle, "pci_bus_id")
        return SimpleNamespace(busId=str(bus), busIdLegacy=str(bus)[4:])

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, device: _Handle, profile_id: int) -> SimpleNamespace:
        names = self._value("nvmlDeviceGetGpuInstanceProfileInfoById", device, "gi_profiles")
        name = names.get(str(profile_id))
        if name is None:
            raise nvml_error(2)
        return SimpleNamespace(id=int(profile_id), name=str(name).encode())

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        u = self._value("nvmlDeviceGetUtilizationRates", h, "utilization")
        return SimpleNamespace(gpu=int(u["gpu"]), memory=int(u["memory"]))

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return int(self._value("nvmlDeviceGetTemperature", h, "temperature"))

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return int(self._value("nvmlDeviceGetPowerUsage", h, "power_mw"))

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        return list(self._value("nvmlDeviceGetMigMode", h, "mig_mode"))

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", h)
        return int(h.data.get("max_mig_devices", 0))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, i: int) -> _Handle:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", h)
        idx = self._devices.index(h)
        for m in self._migs[idx]:
            if int(m.data["index"]) == i:
                return m
        raise nvml_error(6)

    def nvmlDeviceGetGpuInstanceId(self, m: _Handle) -> int:
        return int(self._value("nvmlDeviceGetGpuInstanceId", m, "gpu_instance_id"))

    def nvmlDeviceGetComputeInstanceId(self, m: _Handle) -> int:
        return int(self._value("nvmlDeviceGetComputeInstanceId", m, "compute_instance_id"))

    def nvmlDeviceGetAttributes(self, m: _Handle) -> SimpleNamespace:
        if m.parent is None:
            raise nvml_error(3)
        return SimpleNamespace(**self._value("nvmlDeviceGetAttributes", m, "attributes"))

    def nvmlDeviceGetGpuInstanceById(self, h: _Handle, gi_id: int) -> _Handle:
        self._check("nvmlDeviceGetGpuInstanceById", h)
        idx = self._devices.index(h)
        for m in self._migs[idx]:
            if int(m.data["gpu_instance_id"]) == gi_id:
                return m
        raise nvml_error(6)

    def nvmlGpuInstanceGetInfo(self, gi: _Handle) -> SimpleNamespace:
        p = self._value("nvmlGpuInstanceGetInfo", gi, "placement")
        return SimpleNamespace(
            id=int(gi.data["gpu_instance_id"]),
            profileId=int(gi.data.get("gi_profile_id", 0)),
            placement=SimpleNamespace(start=int(p["start"]), size=int(p["size"])),
        )

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[SimpleNamespace]:
        self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(**p) for p in h.data.get("processes", [])]

    # --- events ----------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> str:
        self._check("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: _Handle, mask: int, es: str) -> None:
        self._check("nvmlDeviceRegisterEvents", h)
        idx = self._devices.index(h)
        if idx not in self._registered:
            self._registered.add(idx)
            self._pending += [(h, e) for e in h.data.get("events", []) if int(e["eventType"]) & mask]

    def nvmlEventSetWait(self, es: str, timeout_ms: int) -> SimpleNamespace:
        self._check("nvmlEventSetWait")
        if not self._pending:
            raise nvml_error(10)
        h, e = self._pending.pop(0)
        return SimpleNamespace(device=h, **e)

    def nvmlEventSetFree(self, es: str) -> None:
        self._check("nvmlEventSetFree")

    # --- GPM (Hopper+ MIG engine activity) ---------------------------------------------------------
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1

    class c_nvmlGpmMetricsGet_t:  # noqa: N801 (reason: mirrors the pynvml ctypes struct name)
        def __init__(self) -> None:
            self.version = 0
            self.numMetrics = 0
            self.sample1: Any = None
            self.sample2: Any = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]

    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> SimpleNamespace:
        self._check("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=1 if h.data.get("gpm_supported") else 0)

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        self._check("nvmlGpmSampleAlloc")
        self.gpm_live += 1
        return SimpleNamespace(parent=None, gi=-1, n=0)

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self._check("nvmlGpmSampleFree")
        self.gpm_live -= 1

    def nvmlGpmMigSampleGet(self, h: _Handle, gi: int, sample: SimpleNamespace) -> SimpleNamespace:
        self._check("nvmlGpmMigSampleGet", h)
        key = (self._devices.index(h), gi)
        self._gpm_counts[key] = self._gpm_counts.get(key, 0) + 1
        sample.parent, sample.gi, sample.n = h, gi, self._gpm_counts[key]
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._check("nvmlGpmMetricsGet")
        s2 = mg.sample2
        mig = self.nvmlDeviceGetGpuInstanceById(s2.parent, s2.gi)
        values = mig.data.get("gpm_graphics_util") or [0.0]
        mg.metrics[0].value = float(values[min(max(s2.n - 2, 0), len(values) - 1)])
        return mg

    def inject_event(self, index: int, xid: int) -> None:
        """Test hook: queue an XID event on GPU ``index`` as if the driver had reported it."""
        self._pending.append(
            (
                self._devices[index],
                {
                    "eventType": 8,
                    "eventData": xid,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                },
            )
        )
