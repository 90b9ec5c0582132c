"""`WorkloadTable`: the P2 workloads on this node, what pauser each uses, and whether it is paused.

Role: the agent's only mutable record of batch jobs. Workloads arrive either by local registration
(`register`, the agent API and tests) or from the gateway's lease ledger (`workload_from_lease`:
leases carry their pauser and target as labels).

Lease labels understood (all optional except the pauser):
``gpupool.io/pauser`` (signal | cgroup | vllm-sleep | vllm-pause | cuda-checkpoint),
``gpupool.io/pgid``, ``gpupool.io/pids`` (comma-separated), ``gpupool.io/cgroup``,
``gpupool.io/endpoint``, ``gpupool.io/sleep-level``, ``gpupool.io/nccl-world-size``, ``gpupool.io/mig``.

Invariants:
- One entry per lease id; state moves RUNNING -> PAUSING -> PAUSED -> RESUMING -> RUNNING, or to
  REVOKED (terminal). An action in flight (PAUSING/RESUMING) is never started twice.
- ``on_gpu`` returns entries in the relief order of `gpupool.core.pausers.victim_order`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpupool.core.errors import InvalidInput
from gpupool.core.pausers import Workload

LABEL_PREFIX = "gpupool.io/"


class RunState(StrEnum):
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    REVOKED = "revoked"


@dataclass(slots=True)
class Entry:
    workload: Workload
    state: RunState = RunState.RUNNING
    since_s: float = 0.0
    vram_freed: bool = False
    source: str = "local"
    """``local`` (registered on the agent) or ``ledger`` (from a gateway lease)."""

    @property
    def busy(self) -> bool:
        return self.state in (RunState.PAUSING, RunState.RESUMING)


class WorkloadTable:
    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._paused_count: dict[str, int] = {}
        """GPU id -> entries not RUNNING/REVOKED (so a calm GPU's tick costs one dict lookup)."""

    def register(self, workload: Workload, *, source: str = "local", at_s: float = 0.0) -> Entry:
        old = self._entries.get(workload.lease_id)
        if old is not None:
            if old.state is not RunState.REVOKED:  # a revoked lease stays revoked until forgotten
                self._count(old, -1)
                old.workload = workload
                self._count(old, +1)
            return old
        e = self._entries[workload.lease_id] = Entry(workload, since_s=at_s, source=source)
        return e

    def forget(self, lease_id: str) -> Entry | None:
        e = self._entries.pop(lease_id, None)
        if e is not None:
            self._count(e, -1)
        return e

    def _count(self, e: Entry, sign: int) -> None:
        if e.state not in (RunState.RUNNING, RunState.REVOKED):
            gpu = e.workload.gpu_id
            self._paused_count[gpu] = self._paused_count.get(gpu, 0) + sign

    def has_paused(self, gpu_id: str) -> bool:
        """True when some workload of the GPU is pausing, paused or resuming."""
        return self._paused_count.get(gpu_id, 0) > 0

    def get(self, lease_id: str) -> Entry | None:
        return self._entries.get(lease_id)

    def set_state(self, lease_id: str, state: RunState, *, at_s: float, vram_freed: bool = False) -> None:
        e = self._entries.get(lease_id)
        if e is None or e.state is RunState.REVOKED:
            return
        self._count(e, -1)
        e.state = state
        self._count(e, +1)
        e.since_s = at_s
        e.vram_freed = vram_freed

    def on_gpu(self, gpu_id: str) -> list[Entry]:
        out = [
            e
            for e in self._entries.values()
            if e.workload.gpu_id == gpu_id and e.state is not RunState.REVOKED
        ]
        out.sort(key=lambda e: (e.workload.priority, -e.workload.vram_mib, e.workload.lease_id))
        return out

    def entries(self) -> list[Entry]:
        return sorted(self._entries.values(), key=lambda e: e.workload.lease_id)

    def ledger_ids(self) -> set[str]:
        return {k for k, e in self._entries.items() if e.source == "ledger"}

    def __len__(self) -> int:
        return len(self._entries)


def _int_label(labels: Mapping[str, str], key: str, default: int | None) -> int | None:
    raw = labels.get(LABEL_PREFIX + key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"labels.{LABEL_PREFIX}{key}", raw, "must be an integer") from None


def workload_from_lease(lease: Mapping[str, object]) -> Workload | None:
    """A `Workload` from one ledger lease (gateway JSON), or None when it names no pauser.

    Expected keys: ``lease_id``, ``gpu_id``, ``priority``, ``vram_mib``, ``labels`` (str -> str).
    """
    raw_labels = lease.get("labels") or {}
    if not isinstance(raw_labels, Mapping):
        raise InvalidInput("lease.labels", raw_labels, "must be an object of strings")
    labels = {str(k): str(v) for k, v in raw_labels.items()}
    pauser = labels.get(LABEL_PREFIX + "pauser", "")
    if not pauser:
        return None
    pids_raw = labels.get(LABEL_PREFIX + "pids", "")
    try:
        pids = tuple(int(p) for p in pids_raw.split(",") if p.strip())
    except ValueError:
        raise InvalidInput(
            f"labels.{LABEL_PREFIX}pids", pids_raw, "must be comma-separated integers"
        ) from None
    priority = lease.get("priority", -1)
    vram = lease.get("vram_mib", 0)
    if type(priority) is not int:
        raise InvalidInput("lease.priority", priority, "must be an integer")
    if type(vram) is not int:
        raise InvalidInput("lease.vram_mib", vram, "must be an integer")
    return Workload(
        str(lease.get("lease_id", "")),
        str(lease.get("gpu_id", "")),
        pauser,
        priority=priority,
        vram_mib=vram,
        pgid=_int_label(labels, "pgid", None),
        pids=pids,
        cgroup=labels.get(LABEL_PREFIX + "cgroup", ""),
        endpoint=labels.get(LABEL_PREFIX + "endpoint", ""),
        on_mig=labels.get(LABEL_PREFIX + "mig", "").lower() in ("1", "true", "yes"),
        nccl_world_size=_int_label(labels, "nccl-world-size", 1) or 1,
        sleep_level=_int_label(labels, "sleep-level", 1) or 1,
        labels=tuple(sorted(labels.items())),
    )


def parse_workload_spec(spec: str) -> Workload:
    """``lease=<id>,gpu=<gpu id>,pauser=<name>[,pgid=..][,pids=1;2][,cgroup=..][,endpoint=..]
    [,vram_mib=..][,priority=..][,sleep_level=1|2][,nccl_world_size=..][,mig=true]`` (CLI ``--workload``)."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidInput("workload", spec, "expected key=value pairs: lease=..,gpu=..,pauser=..")
        fields[key.strip()] = value.strip()
    known = {"lease", "gpu", "pauser", "pgid", "pids", "cgroup", "endpoint", "vram_mib", "priority"}
    known |= {"sleep_level", "nccl_world_size", "mig"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidInput(f"workload.{unknown[0]}", fields[unknown[0]], f"unknown key; use {sorted(known)}")
    for key in ("vram_mib", "priority", "pgid", "sleep_level", "nccl_world_size"):
        raw = fields.get(key, "0" if key == "vram_mib" else "-1" if key == "priority" else "")
        try:
            if raw or key in ("vram_mib", "priority"):  # (the others: empty = not given)
                int(raw)
        except ValueError:
            raise InvalidInput(f"workload.{key}", raw, "must be an integer") from None
    try:
        [int(p) for p in fields.get("pids", "").split(";") if p.strip()]
    except ValueError:
        raise InvalidInput("workload.pids", fields["pids"], "must be integers separated by ';'") from None
    labels = {
        LABEL_PREFIX + "pauser": fields.get("pauser", ""),
        LABEL_PREFIX + "pgid": fields.get("pgid", ""),
        LABEL_PREFIX + "pids": fields.get("pids", "").replace(";", ","),
        LABEL_PREFIX + "cgroup": fields.get("cgroup", ""),
        LABEL_PREFIX + "endpoint": fields.get("endpoint", ""),
        LABEL_PREFIX + "sleep-level": fields.get("sleep_level", ""),
        LABEL_PREFIX + "nccl-world-size": fields.get("nccl_world_size", ""),
        LABEL_PREFIX + "mig": fields.get("mig", ""),
    }
    w = workload_from_lease(
        {
            "lease_id": fields.get("lease", ""),
            "gpu_id": fields.get("gpu", ""),
            "priority": int(fields.get("priority", "-1")),
            "vram_mib": int(fields.get("vram_mib", "0")),
            "labels": {k: v for k, v in labels.items() if v},
        }
    )
    if w is None:
        raise InvalidInput("workload.pauser", "", "must name a pauser (signal, cgroup, vllm-sleep, ...)")
    return w
