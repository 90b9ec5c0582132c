"""Tickets: what the controller tells a caller whose request queued, their durable form, and the
per-pump memo of queued requests that found no room.

Role: value types and pure helpers for `gpupool.core.controller`.

Invariants:
- a `TicketStatus` is a value; ``state`` is queued | granted | shed | cancelled | failed; only a
  granted ticket has a ``lease``; ``ended_at`` is None exactly while it is queued;
- `to_record` / `from_record` round-trip every field but ``lease`` (stored as its id) and ``kv``
  (request-lease tickets are never stored);
- `MissMemo` answers "blocked" only when an earlier item of the same scope, no lower priority and no
  larger demand was blocked while avoiding a subset of the units this one must avoid: capacity only
  shrinks during one pump pass, so such an item cannot fit either (the caller calls `forget` when a
  lease ends mid-pass).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.admission import Ticketed
from gpupool.core.model import Lease, Request
from gpupool.core.ports import TicketRecord

TICKET_STATES = ("queued", "granted", "shed", "cancelled", "failed")


@dataclass(frozen=True, slots=True)
class TicketStatus:
    ticket: str
    state: str  # queued | granted | shed | cancelled | failed
    request: Request
    enqueued_at: float
    deadline_at: float
    lease: Lease | None = None
    reason: str = ""
    gpu_id: str = ""
    kv: bool = False
    ended_at: float | None = None


def to_record(st: TicketStatus) -> TicketRecord:
    return TicketRecord(
        ticket=st.ticket,
        state=st.state,
        request=st.request,
        enqueued_at=st.enqueued_at,
        deadline_at=st.deadline_at,
        gpu_id=st.gpu_id,
        lease_id=st.lease.id if st.lease is not None else "",
        reason=st.reason,
        ended_at=st.ended_at,
    )


def from_record(rec: TicketRecord, lease: Lease | None) -> TicketStatus:
    return TicketStatus(
        rec.ticket,
        rec.state,
        rec.request,
        rec.enqueued_at,
        rec.deadline_at,
        lease=lease,
        reason=rec.reason,
        gpu_id=rec.gpu_id,
        ended_at=rec.ended_at,
    )


_Miss = tuple[int, int, int, frozenset[str], frozenset[str]]


class MissMemo:
    """Blocked items of one pump pass, by scope (see the module invariants)."""

    PER_SCOPE = 8

    def __init__(self) -> None:
        self._misses: dict[tuple[object, ...], list[_Miss]] = {}

    @staticmethod
    def _scope(item: Ticketed) -> tuple[object, ...]:
        r = item.request
        return (item.kv, item.gpu_id, r.kinds, r.nodes, r.model if item.kv else "", r.gpu_count)

    def blocked(self, item: Ticketed, avoid: frozenset[str]) -> frozenset[str] | None:
        """The holds of an earlier miss that proves ``item`` cannot fit now, or None."""
        r = item.request
        v, c = r.demand.vram_mib, r.demand.compute_milli
        for prio, mv, mc, seen, holds in self._misses.get(self._scope(item), ()):
            if r.priority <= prio and v >= mv and c >= mc and seen <= avoid:
                return holds
        return None

    def add(self, item: Ticketed, avoid: frozenset[str], holds: frozenset[str]) -> None:
        known = self._misses.setdefault(self._scope(item), [])
        if len(known) < self.PER_SCOPE:
            r = item.request
            known.append((r.priority, r.demand.vram_mib, r.demand.compute_milli, avoid, holds))

    def forget(self) -> None:
        self._misses.clear()


__all__ = ["TICKET_STATES", "MissMemo", "TicketStatus", "from_record", "to_record"]
