"""`record`: dump the readings of the real GPUs of this machine into a replayable fixture.

Usage: ``python -m gpupool.adapters.nvml.record OUT.json [--description TEXT]`` (needs nvidia-ml-py and a
driver). The output replays through ``FakeNvml.from_fixture(OUT.json)``. Errors of individual calls are
stored as NVML codes under ``errors`` so a recording of a sick GPU replays as sick; NOT_SUPPORTED is
stored as a null value instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpupool.adapters.nvml.replay import FIXTURE_FORMAT
from gpupool.adapters.nvml.source import ERR_NOT_SUPPORTED, MEMORY_V2, load_pynvml, text_of

ATTRS = ("multiprocessorCount", "gpuInstanceSliceCount", "computeInstanceSliceCount", "memorySizeMB")


class _Recorder:
    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.errors: dict[str, int] = {}

    def call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.nv, name)(*args)
        except self.nv.NVMLError as exc:
            code = int(getattr(exc, "value", 999))
            if code != ERR_NOT_SUPPORTED:
                self.errors.setdefault(name, code)
            return None

    def mem(self, h: Any) -> dict[str, int] | None:
        """v1 ``used`` (reserved included) plus ``reserved`` from v2 where the driver has it."""
        m = self.call("nvmlDeviceGetMemoryInfo", h)
        if m is None:
            return None
        out = {"total": int(m.total), "used": int(m.used), "free": int(m.free)}
        try:
            v2 = self.nv.nvmlDeviceGetMemoryInfo(h, version=getattr(self.nv, "nvmlMemory_v2", MEMORY_V2))
            out["reserved"] = int(v2.reserved)
        except (self.nv.NVMLError, TypeError, AttributeError):
            pass
        return out

    def procs(self, h: Any) -> list[dict[str, int]]:
        return [
            {
                "pid": int(p.pid),
                "usedGpuMemory": int(p.usedGpuMemory or 0),
                "gpuInstanceId": int(getattr(p, "gpuInstanceId", 0xFFFFFFFF)),
                "computeInstanceId": int(getattr(p, "computeInstanceId", 0xFFFFFFFF)),
            }
            for p in self.call("nvmlDeviceGetComputeRunningProcesses", h) or []
        ]

    def mig(self, parent: Any, k: int, m: Any) -> dict[str, Any]:
        gi = int(self.nv.nvmlDeviceGetGpuInstanceId(m))
        attrs = self.call("nvmlDeviceGetAttributes", m)
        gi_h = self.call("nvmlDeviceGetGpuInstanceById", parent, gi)
        info = None if gi_h is None else self.call("nvmlGpuInstanceGetInfo", gi_h)
        return {
            "index": k,
            "uuid": str(self.nv.nvmlDeviceGetUUID(m)),
            "gpu_instance_id": gi,
            "compute_instance_id": int(self.nv.nvmlDeviceGetComputeInstanceId(m)),
            "gi_profile_id": None if info is None else int(info.profileId),
            "memory": self.mem(m),
            "attributes": None if attrs is None else {a: int(getattr(attrs, a)) for a in ATTRS},
            "placement": None
            if info is None
            else {"start": int(info.placement.start), "size": int(info.placement.size)},
            "processes": self.procs(m),
        }

    def device(self, i: int) -> dict[str, Any]:
        nv = self.nv
        h = nv.nvmlDeviceGetHandleByIndex(i)
        util = self.call("nvmlDeviceGetUtilizationRates", h)
        mig_mode = self.call("nvmlDeviceGetMigMode", h)
        enabled = bool(mig_mode) and int(mig_mode[0]) == 1
        max_mig = int(self.call("nvmlDeviceGetMaxMigDeviceCount", h) or 0)
        dev: dict[str, Any] = {
            "index": i,
            "uuid": self.call("nvmlDeviceGetUUID", h),
            "name": self.call("nvmlDeviceGetName", h),
            "memory": self.mem(h),
            "utilization": None if util is None else {"gpu": int(util.gpu), "memory": int(util.memory)},
            "temperature": self.call("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
            "power_mw": self.call("nvmlDeviceGetPowerUsage", h),
            "mig_mode": None if mig_mode is None else [int(mig_mode[0]), int(mig_mode[1])],
            "max_mig_devices": max_mig,
            "processes": self.procs(h),
            "mig_devices": [],
            "events": [],
        }
        pci = self.call("nvmlDeviceGetPciInfo", h)
        if pci is not None:
            dev["pci_bus_id"] = text_of(pci.busId)
        for k in range(max_mig if enabled else 0):
            try:
                m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except nv.NVMLError:
                continue
            dev["mig_devices"].append(self.mig(h, k, m))
        names: dict[str, str] = {}
        for d in dev["mig_devices"]:
            pid = d.get("gi_profile_id")
            if pid is not None and str(pid) not in names:
                info = self.call("nvmlDeviceGetGpuInstanceProfileInfoById", h, pid)
                if info is not None:
                    names[str(pid)] = text_of(info.name)
        if names:
            dev["gi_profiles"] = names
        return dev


def record(nvml: Any | None = None, *, description: str = "") -> dict[str, Any]:
    """Readings of every GPU (and MIG device) in the fixture format of ``replay.FakeNvml``."""
    nv = nvml if nvml is not None else load_pynvml()
    nv.nvmlInit()
    try:
        top = _Recorder(nv)
        devices = []
        for i in range(nv.nvmlDeviceGetCount()):
            r = _Recorder(nv)
            dev = r.device(i)
            dev["errors"] = r.errors
            devices.append(dev)
        return {
            "format": FIXTURE_FORMAT,
            "description": description,
            "driver_version": str(top.call("nvmlSystemGetDriverVersion") or ""),
            **(
                {"cuda_driver_version": int(cuda)}
                if (cuda := top.call("nvmlSystemGetCudaDriverVersion"))
                else {}
            ),
            "devices": devices,
        }
    finally:
        nv.nvmlShutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Record NVML readings of this machine as a gpupool fixture.")
    ap.add_argument("out", type=Path)
    ap.add_argument("--description", default="")
    args = ap.parse_args(argv)
    try:
        doc = record(description=args.description)
    except Exception as exc:
        print(f"gpupool: error: cannot record NVML readings: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
