"""Device sources for the agent: ``scripted`` (in memory), ``nvml`` and ``simulated`` (the hardware
layer's ``DeviceSource`` returning a ``DeviceSnapshot``), adapted to the agent's `GpuSample` list.

Role: translate ``gpupool.hardware.devices.DeviceSnapshot`` (GpuReading, MigDeviceReading, XidEvent)
into one `GpuSample` per physical GPU; MIG instances ride along in ``GpuSample.instances`` (for the
per-instance DCGM series). Watermarks stay per physical GPU; an XID attributed to any instance marks
the whole GPU unhealthy (conservative; revisit when per-instance slices are revoked separately).

Invariants: ``gpu_id`` is ``<node>/<index>`` (the id leases and slices use); XIDs are matched to
GPUs by UUID (parent or MIG UUID); a GPU with ``healthy=False`` carries its ``error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpupool.agent.source import DeviceSource, GpuSample, ProcessUsage, ScriptedSource
from gpupool.core.errors import InvalidInput

KINDS = ("simulated", "nvml", "scripted")


def _procs(items: Any) -> tuple[ProcessUsage, ...]:
    return tuple(ProcessUsage(int(p.pid), int(p.used_mib)) for p in items or ())


def samples_from_snapshot(snap: Any, *, node: str) -> tuple[GpuSample, ...]:
    """``DeviceSnapshot`` -> agent samples (duck-typed so the hardware types stay the only definition)."""
    xids: dict[str, list[int]] = {}
    for ev in getattr(snap, "events", ()) or ():
        xids.setdefault(str(ev.gpu_uuid), []).append(int(ev.xid))
    out: list[GpuSample] = []
    for g in snap.gpus:
        gpu_id = f"{node}/{g.index}"
        instances: list[GpuSample] = []
        gpu_xids = list(xids.get(g.uuid, ()))
        for d in getattr(g, "mig_devices", ()) or ():
            gpu_xids.extend(xids.get(d.uuid, ()))
            active = getattr(d, "engine_active_pct", None)
            instances.append(
                GpuSample(
                    f"{gpu_id}/mig-{d.profile}-{d.gpu_instance_id}",
                    int(g.index),
                    int(d.memory_used_mib),
                    max(1, int(d.memory_total_mib)),
                    uuid=str(d.uuid),
                    model=str(g.model or g.name),
                    engine_active_ratio=None if active is None else active / 100.0,
                    processes=_procs(getattr(d, "processes", ())),
                    mig_profile=str(d.profile),
                    gi_id=int(d.gpu_instance_id),
                    name=str(g.name),
                    pci_bus_id=str(getattr(g, "pci_bus_id", "")),
                )
            )
        out.append(
            GpuSample(
                gpu_id,
                int(g.index),
                int(g.memory_used_mib),
                max(1, int(g.memory_total_mib)),
                uuid=str(g.uuid),
                model=str(g.model or g.name),
                temperature_c=g.temperature_c,
                util_pct=g.utilization_pct,
                power_mw=g.power_mw,
                processes=_procs(getattr(g, "processes", ())),
                error="" if g.healthy else (g.error or "unhealthy"),
                xids=tuple(gpu_xids),
                instances=tuple(instances),
                name=str(g.name),
                pci_bus_id=str(getattr(g, "pci_bus_id", "")),
            )
        )
    out.sort(key=lambda s: (s.index, s.gpu_id))
    return tuple(out)


class SnapshotSource:
    """Adapts a hardware-layer source (``read() -> DeviceSnapshot``, ``close()``) to `DeviceSource`."""

    def __init__(self, inner: Any, *, node: str) -> None:
        self.inner = inner
        self.node = node
        self.last: Any = None
        """The newest ``DeviceSnapshot`` read (PCI bus ids, MIG mode, profiles: for discovery)."""

    def read(self) -> Sequence[GpuSample]:
        self.last = self.inner.read()
        return samples_from_snapshot(self.last, node=self.node)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


def open_source(kind: str, *, node: str, gpus: int = 2, cluster: Any | None = None) -> DeviceSource:
    """``nvml``: the real GPUs; ``simulated``: that node of the simulated cluster (``cluster``, by
    default the embedded seed platform, whose VRAM registry is ``$GPUPOOL_SIM_VRAM_DIR`` when set:
    real processes may hold simulated memory there) when it has the node, else an in-memory node of ``gpus``
    H100s; ``scripted``: always the in-memory node."""
    if kind not in KINDS:
        raise InvalidInput("devices", kind, f"must be one of {list(KINDS)}")
    if type(gpus) is not int or not 1 <= gpus <= 64:
        raise InvalidInput("gpus", gpus, "must be an integer in [1, 64]")
    if kind == "nvml":
        from gpupool.adapters.nvml import NvmlDeviceSource

        return SnapshotSource(NvmlDeviceSource(node), node=node)
    if kind == "simulated":
        if cluster is None:
            import os
            from pathlib import Path

            from gpupool.adapters.simulated import embedded_default
            from gpupool.adapters.simulated.vram import REGISTRY_ENV

            registry = os.environ.get(REGISTRY_ENV, "")
            cluster = embedded_default(vram_registry=Path(registry) if registry else None)
        if node in cluster.nodes():
            return SnapshotSource(cluster.source(node), node=node)
    return ScriptedSource.uniform(node, gpus)
