"""`MigManagerActuator`: MIG re-partition on GPU Operator clusters, through NVIDIA's mig-manager.

Role: the `gpupool.hardware.migactuate.MigActuator` for nodes whose MIG layout the GPU Operator's
``k8s-mig-manager`` owns. The protocol is mig-manager's own (NVIDIA/mig-parted, gpu-operator):
1. the mig-parted v1 document is the ConfigMap the ClusterPolicy names (``spec.migManager.config.name``,
   key ``config.yaml``, in the operator's namespace); gpupool adds or replaces one config per node in
   it, named ``gpupool-<node>-<hash>`` (the hash of its entries: a new layout is a new name, so the
   label always changes when the layout does), and leaves every other config as it was;
2. the node label ``nvidia.com/mig.config=<name>`` asks mig-manager to apply it (gpupool drops the
   stale ``nvidia.com/mig.config.state`` in the same patch, so an old ``success`` is never mistaken
   for the new one);
3. mig-manager reports ``nvidia.com/mig.config.state`` = ``pending`` (``rebooting``) -> ``success`` |
   ``failed``; gpupool waits for one of the last two, up to ``timeout_s``.

Invariants:
- Drain first: the ``busy`` hook is asked for every GPU to change; a lease still there means
  nothing is written. mig-manager chooses placements itself (mig-parted takes profile counts), so the
  wish is sent as counts.
- The outcome is ``ok`` only on ``success``; the caller changes its ledger only then.
- Time and sleep are injected (tests run a fake mig-manager thread against the fake API server).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import yaml

from gpupool.hardware.mig import MigInstance
from gpupool.hardware.migactuate import ApplyOutcome, BusyHook, GpuChange
from gpupool.hardware.migparted import parse_mig_parted

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
DEFAULT_NAMESPACE = "gpu-operator"
DEFAULT_CONFIG_MAP = "custom-mig-config"
CONFIG_KEY = "config.yaml"


class NodeApi(Protocol):
    def read_node(self, name: str) -> dict[str, Any]: ...

    def label_node(self, name: str, labels: dict[str, str | None]) -> dict[str, Any]: ...

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def write_config_map(self, namespace: str, name: str, data: dict[str, str]) -> None: ...


def _no_leases(node: str, index: int, doomed: Sequence[MigInstance]) -> Sequence[str]:
    return ()


def node_entries(wanted: Mapping[int, Sequence[MigInstance]]) -> list[dict[str, Any]]:
    """mig-parted entries for the listed GPUs (equal layouts share one entry, ordered by index)."""
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for index, insts in sorted(wanted.items()):
        counts = tuple(sorted(Counter(i.profile for i in insts).items()))
        groups.setdefault(counts, []).append(index)
    return [
        {"devices": sorted(devs), "mig-enabled": True, "mig-devices": dict(counts)}
        for counts, devs in sorted(groups.items(), key=lambda kv: min(kv[1]))
    ]


def config_name(node: str, entries: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:10]
    return f"gpupool-{node}-{digest}"


class MigManagerActuator:
    name = "mig-manager"

    def __init__(
        self,
        api: NodeApi,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        config_map: str = DEFAULT_CONFIG_MAP,
        timeout_s: float = 900.0,
        poll_s: float = 1.0,
        busy: BusyHook = _no_leases,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.config_map = config_map
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.busy = busy
        self.clock = clock
        self.sleep = sleep

    def apply(self, node: str, wanted: Mapping[int, Sequence[MigInstance]]) -> ApplyOutcome:
        changes = tuple(GpuChange(i, (), tuple(sorted(w))) for i, w in sorted(wanted.items()))
        blocked = sorted({lid for i in sorted(wanted) for lid in self.busy(node, i, ())})
        if blocked:
            why = f"drain first: leases still on the GPUs to re-partition: {', '.join(blocked)}"
            return ApplyOutcome(False, self.name, node, changes, why, tuple(blocked))
        entries = node_entries(wanted)
        name = config_name(node, entries)
        labels = (self.api.read_node(node).get("metadata") or {}).get("labels") or {}
        if labels.get(CONFIG_LABEL) == name and labels.get(STATE_LABEL) == "success":
            return ApplyOutcome(True, self.name, node, changes, f"{CONFIG_LABEL}={name} already applied")
        self._write_config(node, name, entries)
        self.api.label_node(node, {CONFIG_LABEL: name, STATE_LABEL: None})
        deadline = self.clock() + self.timeout_s
        state = ""
        while True:
            labels = (self.api.read_node(node).get("metadata") or {}).get("labels") or {}
            state = str(labels.get(STATE_LABEL, ""))
            if labels.get(CONFIG_LABEL) != name:
                why = f"{CONFIG_LABEL} changed to {labels.get(CONFIG_LABEL)!r} by someone else while applying"
                return ApplyOutcome(False, self.name, node, changes, why)
            if state in ("success", "failed"):
                break
            if self.clock() >= deadline:
                shown = state or "unset"
                why = f"mig-manager did not finish within {self.timeout_s:g} s ({STATE_LABEL}={shown})"
                return ApplyOutcome(False, self.name, node, changes, why)
            self.sleep(self.poll_s)
        ok = state == "success"
        why = f"{CONFIG_LABEL}={name}: {STATE_LABEL}={state}"
        if not ok:
            why += " (see the nvidia-mig-manager pod's log on the node)"
        return ApplyOutcome(ok, self.name, node, changes, why)

    def _write_config(self, node: str, name: str, entries: list[dict[str, Any]]) -> None:
        cm = self.api.read_config_map(self.namespace, self.config_map)
        data = dict((cm or {}).get("data") or {})
        doc: dict[str, Any] = {"version": "v1", "mig-configs": {}}
        if data.get(CONFIG_KEY):
            loaded = yaml.safe_load(data[CONFIG_KEY])
            parse_mig_parted(loaded, source=f"configmap {self.namespace}/{self.config_map}")
            doc = loaded
        configs = {k: v for k, v in doc["mig-configs"].items() if not str(k).startswith(f"gpupool-{node}-")}
        configs[name] = entries
        doc["mig-configs"] = configs
        parse_mig_parted(doc, source="generated mig-parted config")
        data[CONFIG_KEY] = yaml.safe_dump(doc, sort_keys=False)
        self.api.write_config_map(self.namespace, self.config_map, data)
