"""mig-parted v1 config documents: render a plan, parse one back, and validate it.

Role: the hand-over to NVIDIA's ``nvidia-mig-parted apply -f <file> -c <config>`` (fact sheet section 2.1).
Dicts in and out; YAML text is the CLI's business.

Public API:
- ``to_mig_parted(plan, *, config_prefix="gpupool")`` -> ``{"version": "v1", "mig-configs": {...}}`` with
  one config per node named ``<prefix>-<node>`` (device indices are node-local). GPUs with equal layouts
  share one entry (``devices: [0, 1]``); non-MIG GPUs get ``mig-enabled: false``.
- ``parse_mig_parted(doc, *, source="mig-parted")`` -> ``{config: (MigPartedEntry, ...)}``; raises
  ``MigPartedError`` naming the source, key and value (unknown version, unknown top-level key, ...).
- ``node_layouts(doc, node, *, config_prefix="gpupool")`` -> ``{gpu index: {profile: count}}``.

Invariants:
- Output passes ``parse_mig_parted``; entries are ordered by the first device index; ``mig-devices``
  keys are sorted by profile name.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from gpupool.hardware.capability import GpuMode
from gpupool.hardware.plantypes import Plan


class MigPartedError(ValueError):
    def __init__(self, source: str, key: str, value: object, reason: str) -> None:
        super().__init__(f"{source}: {key}={value!r}: {reason}")


@dataclass(frozen=True, slots=True)
class MigPartedEntry:
    devices: tuple[int, ...] | str
    """GPU indices, or the string ``all``."""
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...] = ()
    device_filter: tuple[str, ...] = ()


def to_mig_parted(plan: Plan, *, config_prefix: str = "gpupool") -> dict[str, Any]:
    """A mig-parted v1 document with one config per node (see module docstring)."""
    configs: dict[str, list[dict[str, Any]]] = {}
    nodes: list[str] = []
    for g in plan.gpus:
        if g.node not in nodes:
            nodes.append(g.node)
    for node in nodes:
        groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
        for g in plan.gpus:
            if g.node != node:
                continue
            enabled = g.mode is GpuMode.MIG
            counts = tuple(sorted(Counter(i.profile for i in g.mig).items())) if enabled else ()
            groups.setdefault((enabled, counts), []).append(g.index)
        entries: list[dict[str, Any]] = []
        for (enabled, counts), devices in sorted(groups.items(), key=lambda kv: min(kv[1])):
            entry: dict[str, Any] = {"devices": sorted(devices), "mig-enabled": enabled}
            if enabled:
                entry["mig-devices"] = dict(counts)
            entries.append(entry)
        configs[f"{config_prefix}-{node}"] = entries
    return {"version": "v1", "mig-configs": configs}


def parse_mig_parted(doc: object, *, source: str = "mig-parted") -> dict[str, tuple[MigPartedEntry, ...]]:
    """Validate a mig-parted v1 document (the rules of ``api/spec/v1/spec.go``)."""
    if not isinstance(doc, dict):
        raise MigPartedError(source, "<top>", type(doc).__name__, "expected a mapping")
    for key in doc:
        if key not in ("version", "mig-configs"):
            raise MigPartedError(source, str(key), doc[key], "unknown top-level key")
    if doc.get("version") != "v1":
        raise MigPartedError(source, "version", doc.get("version"), "unknown version (expected v1)")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigPartedError(source, "mig-configs", configs, "expected a non-empty mapping")
    out: dict[str, tuple[MigPartedEntry, ...]] = {}
    for name, entries in configs.items():
        key = f"mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise MigPartedError(source, key, entries, "expected a non-empty list of entries")
        out[str(name)] = tuple(_entry(source, f"{key}[{i}]", e) for i, e in enumerate(entries))
    return out


def _entry(source: str, key: str, e: object) -> MigPartedEntry:
    if not isinstance(e, dict):
        raise MigPartedError(source, key, e, "expected a mapping")
    for k in e:
        if k not in ("devices", "mig-enabled", "mig-devices", "device-filter"):
            raise MigPartedError(source, f"{key}.{k}", e[k], "unknown key")
    devices_raw = e.get("devices")
    devices: tuple[int, ...] | str
    if devices_raw == "all":
        devices = "all"
    elif (
        isinstance(devices_raw, list) and devices_raw and all(type(d) is int and d >= 0 for d in devices_raw)
    ):
        devices = tuple(devices_raw)
    else:
        raise MigPartedError(source, f"{key}.devices", devices_raw, "expected 'all' or a list of GPU indices")
    enabled = e.get("mig-enabled")
    if type(enabled) is not bool:
        raise MigPartedError(source, f"{key}.mig-enabled", enabled, "expected true or false (required)")
    mig_devices_raw = e.get("mig-devices", {})
    if not enabled and "mig-devices" in e and mig_devices_raw:
        raise MigPartedError(
            source, f"{key}.mig-devices", mig_devices_raw, "given while mig-enabled is false"
        )
    if not isinstance(mig_devices_raw, dict) or not all(
        isinstance(p, str) and type(n) is int and n >= 0 for p, n in mig_devices_raw.items()
    ):
        raise MigPartedError(source, f"{key}.mig-devices", mig_devices_raw, "expected {profile: count}")
    filt = e.get("device-filter", [])
    filters = (filt,) if isinstance(filt, str) else tuple(str(f) for f in filt)
    return MigPartedEntry(devices, enabled, tuple(sorted(mig_devices_raw.items())), filters)


def node_layouts(doc: object, node: str, *, config_prefix: str = "gpupool") -> dict[int, dict[str, int]]:
    """Per-GPU profile counts of ``<prefix>-<node>`` (only MIG-enabled devices with explicit indices)."""
    configs = parse_mig_parted(doc)
    name = f"{config_prefix}-{node}"
    if name not in configs:
        raise MigPartedError("mig-parted", "mig-configs", sorted(configs), f"no config named {name!r}")
    out: dict[int, dict[str, int]] = {}
    for entry in configs[name]:
        if not entry.mig_enabled or isinstance(entry.devices, str):
            continue
        for d in entry.devices:
            out[d] = dict(entry.mig_devices)
    return out
