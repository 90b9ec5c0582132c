"""Ports: the Protocols the adapters implement for the lease controller, and the lease codec.

Role: `LeaseStore` is where leases become durable (memory, SQLite, later etcd); `EventSink` is where
controller events go (SSE fan-out, metrics, logs). The core depends on these Protocols only.

Store semantics (the contract suite in ``tests/contract/store`` runs against every implementation):
- ``apply(writes)`` is atomic and durable on return: either every write lands or none does.
- Each `StoreWrite` is a compare-and-set on the lease's revision: ``expected_revision=None`` means
  "the id must not exist yet"; an int means "the stored revision must equal it". Writes inside one
  batch apply in order, so a batch may create a lease and then update it.
- A failed compare raises `RevisionConflict` naming the id, the expected and the actual revision;
  nothing of that batch is applied.
- ``active()`` returns the ACTIVE leases and ``leases()`` all stored ones, both sorted by id (total order).
- ``purge_ended(before_s=t)`` deletes ended leases whose ``ended_at < t``; active ones are never purged.
- Meta entries are a small string key/value space for pool-level settings (watermarks, drained GPUs).
- Tickets (queued requests and what became of them) live in the same store: a `TicketRecord` in a
  batch is an upsert of that ticket (no compare-and-set: one gateway owns its tickets), applied in
  the same transaction as the lease writes around it. ``tickets()`` returns them sorted by id;
  ``purge_tickets(before_s=t)`` deletes ended tickets whose ``ended_at < t``.

The codec (`lease_to_dict` / `lease_from_dict`) is the one wire form of a lease for every store;
it round-trips exactly (floats through ``repr``-exact JSON).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import Resources


class RevisionConflict(GpupoolError):
    """A compare-and-set failed: somebody else wrote the lease (or the id already exists)."""

    def __init__(self, lease_id: str, expected: int | None, actual: int | None) -> None:
        self.lease_id = lease_id
        self.expected = expected
        self.actual = actual
        super().__init__(f"lease {lease_id}: expected revision {expected}, store has {actual}")


@dataclass(frozen=True, slots=True)
class StoreWrite:
    lease: Lease
    expected_revision: int | None
    """None: create (the id must be new); otherwise the revision currently stored."""


@dataclass(frozen=True, slots=True)
class TicketRecord:
    """The durable form of a ticket. ``state``: queued | granted | shed | cancelled | failed;
    ``lease_id`` names the lease a granted ticket produced; ``ended_at`` is None while queued."""

    ticket: str
    state: str
    request: Request
    enqueued_at: float
    deadline_at: float
    gpu_id: str = ""
    lease_id: str = ""
    reason: str = ""
    ended_at: float | None = None


Write = StoreWrite | TicketRecord
"""One item of a store batch: a lease compare-and-set or a ticket upsert."""


class LeaseStore(Protocol):
    def apply(self, writes: Sequence[Write]) -> None:
        """Apply every write atomically and durably, or raise and apply none."""
        ...

    def get(self, lease_id: str) -> Lease | None: ...

    def active(self) -> list[Lease]:
        """ACTIVE leases sorted by id."""
        ...

    def leases(self, *, tenant: str | None = None) -> list[Lease]:
        """Every stored lease (ended ones too), optionally of one tenant, sorted by id."""
        ...

    def purge_ended(self, *, before_s: float) -> int:
        """Delete ended leases with ``ended_at < before_s``; return how many."""
        ...

    def get_ticket(self, ticket: str) -> TicketRecord | None: ...

    def tickets(self) -> list[TicketRecord]:
        """Every stored ticket, sorted by id."""
        ...

    def purge_tickets(self, *, before_s: float) -> int:
        """Delete ended tickets with ``ended_at < before_s``; return how many."""
        ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class GatewayEvent:
    """One thing holders and operators may need to know, in the order it became durable.

    ``kind``: granted | renewed | released | expired | preempted | revoked | queued | shed | failed |
    cancelled | pause | resume. Lease events carry ``lease``; ticket events carry ``ticket``;
    pause/resume carry ``gpu_id`` and the ids of the P2 leases on that GPU in ``lease_ids``.
    """

    kind: str
    at: float
    lease: Lease | None = None
    ticket: str = ""
    tenant: str = ""
    gpu_id: str = ""
    reason: str = ""
    lease_ids: tuple[str, ...] = ()
    tenants: tuple[str, ...] = field(default=())
    """Tenants concerned (for pause/resume: the holders of ``lease_ids``)."""
    wait_s: float = 0.0
    """For a grant from the queue: how long the request waited."""


@dataclass(frozen=True, slots=True)
class Backend:
    """A model instance whose KV-cache budget request leases draw from."""

    id: str
    model: str
    url: str
    node: str
    gpu_id: str
    kv_budget_mib: int
    slice_id: str = ""


@dataclass(frozen=True, slots=True)
class Batch:
    writes: tuple[Write, ...]
    events: tuple[GatewayEvent, ...]
    before: tuple[tuple[str, Lease | None], ...] = ()
    """Per written lease id, its version before the batch (None: new): what an undo puts back."""
    tickets: tuple[str, ...] = ()
    """Tickets queued or ended by the batch's changes."""


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    restored: int
    expired: int
    revoked: int


class EventSink(Protocol):
    def __call__(self, event: GatewayEvent) -> None: ...


# ---------------------------------------------------------------------- codec
def request_to_dict(r: Request) -> dict[str, Any]:
    """A `Request` as the JSON object stored inside a lease or a ticket."""
    return {
        "id": r.id,
        "tenant": r.tenant,
        "priority": r.priority,
        "vram_mib": r.demand.vram_mib,
        "compute_milli": r.demand.compute_milli,
        "ttl_s": r.ttl_s,
        "kinds": sorted(k.value for k in r.kinds),
        "preemptible": r.preemptible,
        "gpu_count": r.gpu_count,
        "nodes": sorted(r.nodes),
        "model": r.model,
        "labels": [list(kv) for kv in r.labels],
    }


def request_from_dict(r: dict[str, Any]) -> Request:
    """The inverse of `request_to_dict`; KeyError / TypeError / ValueError on a malformed object."""
    return Request(
        id=str(r["id"]),
        tenant=str(r["tenant"]),
        priority=int(r["priority"]),
        demand=Resources(int(r["vram_mib"]), int(r["compute_milli"])),
        ttl_s=float(r["ttl_s"]),
        kinds=frozenset(SliceKind(k) for k in r["kinds"]),
        preemptible=r["preemptible"],
        gpu_count=int(r["gpu_count"]),
        nodes=frozenset(r["nodes"]),
        model=str(r["model"]),
        labels=tuple((str(k), str(v)) for k, v in r["labels"]),
    )


def lease_to_dict(lease: Lease) -> dict[str, Any]:
    return {
        "id": lease.id,
        "request": request_to_dict(lease.request),
        "node": lease.node,
        "grants": [
            {
                "slice_id": g.slice_id,
                "gpu_id": g.gpu_id,
                "vram_mib": g.resources.vram_mib,
                "compute_milli": g.resources.compute_milli,
            }
            for g in lease.grants
        ],
        "granted_at": lease.granted_at,
        "expires_at": lease.expires_at,
        "state": lease.state.value,
        "revision": lease.revision,
        "ended_at": lease.ended_at,
        "reason": lease.reason,
    }


def lease_from_dict(d: dict[str, Any]) -> Lease:
    try:
        request = request_from_dict(d["request"])
        grants = tuple(
            Grant(
                slice_id=str(g["slice_id"]),
                gpu_id=str(g["gpu_id"]),
                resources=Resources(int(g["vram_mib"]), int(g["compute_milli"])),
            )
            for g in d["grants"]
        )
        return Lease(
            id=str(d["id"]),
            request=request,
            node=str(d["node"]),
            grants=grants,
            granted_at=float(d["granted_at"]),
            expires_at=float(d["expires_at"]),
            state=LeaseState(d["state"]),
            revision=int(d["revision"]),
            ended_at=None if d["ended_at"] is None else float(d["ended_at"]),
            reason=str(d["reason"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput("lease", d.get("id") if isinstance(d, dict) else d, f"malformed: {exc}") from None


def ticket_to_dict(t: TicketRecord) -> dict[str, Any]:
    return {
        "ticket": t.ticket,
        "state": t.state,
        "request": request_to_dict(t.request),
        "enqueued_at": t.enqueued_at,
        "deadline_at": t.deadline_at,
        "gpu_id": t.gpu_id,
        "lease_id": t.lease_id,
        "reason": t.reason,
        "ended_at": t.ended_at,
    }


def ticket_from_dict(d: dict[str, Any]) -> TicketRecord:
    try:
        request = request_from_dict(d["request"])
        return TicketRecord(
            ticket=str(d["ticket"]),
            state=str(d["state"]),
            request=request,
            enqueued_at=float(d["enqueued_at"]),
            deadline_at=float(d["deadline_at"]),
            gpu_id=str(d["gpu_id"]),
            lease_id=str(d["lease_id"]),
            reason=str(d["reason"]),
            ended_at=None if d["ended_at"] is None else float(d["ended_at"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        tid = d.get("ticket") if isinstance(d, dict) else d
        raise InvalidInput("ticket", tid, f"malformed: {exc}") from None


def encode_ticket(t: TicketRecord) -> str:
    return json.dumps(ticket_to_dict(t), separators=(",", ":"), sort_keys=True)


def decode_ticket(text: str) -> TicketRecord:
    return ticket_from_dict(json.loads(text))


def encode_lease(lease: Lease) -> str:
    return json.dumps(lease_to_dict(lease), separators=(",", ":"), sort_keys=True)


def decode_lease(text: str) -> Lease:
    return lease_from_dict(json.loads(text))


__all__ = [
    "Backend",
    "Batch",
    "EventSink",
    "GatewayEvent",
    "LeaseStore",
    "RecoveryReport",
    "RevisionConflict",
    "StoreWrite",
    "TicketRecord",
    "Write",
    "decode_lease",
    "decode_ticket",
    "encode_lease",
    "encode_ticket",
    "lease_from_dict",
    "lease_to_dict",
    "ticket_from_dict",
    "ticket_to_dict",
]
