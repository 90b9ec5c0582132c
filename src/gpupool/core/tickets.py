"""Tickets: what the controller tells a caller whose request queued, their durable form, and the
per-pump memo of queued requests that found no room.

Role: value types and pure helpers for `gpupool.core.controller`.

Invariants:
- a `TicketStatus` is a value; ``state`` is queued | granted | shed | cancelled | failed; only a
  granted ticket has a ``lease``; ``ended_at`` is None exactly while it is queued;
- `to_record` / `from_record` round-trip every field but ``lease`` (stored as its id) and ``kv``
  (request-lease tickets are never stored);
- `MissMemo` (one per pump pass) answers "blocked" without a search only when an earlier item of the
  same scope, of no lower priority and no larger demand, was blocked while avoiding a subset of the
  units this one must avoid: capacity only shrinks during a pass, so this one cannot fit either. Such
  an item holds nothing this pass (the earlier one, still queued, holds its target). The memo forgets
  everything as soon as a lease ends mid-pass (preemption, expiry: capacity grew). The scope is the
  caller's (``scope_of``): two turns waiting for the same holder share a target only while both are
  patient (one past its patience may take, and holds, any instance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpupool.core.admission import NOTHING, Ticketed, TryGrant, Verdict
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


_Miss = tuple[int, int, int, frozenset[str]]


class MissMemo:
    """A `TryGrant` that remembers the blocked items of one pump pass (see the module invariants)."""

    PER_SCOPE = 8

    def __init__(
        self,
        try_grant: TryGrant,
        ends: Callable[[], int],
        scope_of: Callable[[Ticketed], tuple[object, ...]] = lambda item: item.scope,
    ) -> None:
        self._try_grant = try_grant
        self._ends = ends
        self._scope_of = scope_of
        self._seen = ends()
        self._misses: dict[tuple[object, ...], list[_Miss]] = {}

    def __call__(self, item: Ticketed, avoid: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
        ends = self._ends()
        if ends != self._seen:
            self._misses.clear()
            self._seen = ends
        r = item.request
        v, c = r.demand.vram_mib, r.demand.compute_milli
        scope = self._scope_of(item)
        for prio, mv, mc, seen in self._misses.get(scope, ()):
            if r.priority <= prio and v >= mv and c >= mc and (seen is avoid or seen <= avoid):
                return Verdict.BLOCKED, NOTHING  # NOTE: the earlier item holds what this one would
        verdict, holds = self._try_grant(item, avoid)
        if verdict is Verdict.BLOCKED and self._ends() == ends:
            known = self._misses.setdefault(scope, [])
            if len(known) < self.PER_SCOPE:
                known.append((r.priority, v, c, avoid))
        return verdict, holds


__all__ = ["TICKET_STATES", "MissMemo", "TicketStatus", "from_record", "to_record"]
