"""`MemoryLeaseStore`: the reference semantics of `LeaseStore`, in one process's memory.

Invariants: ``apply`` validates the whole batch against a scratch view before touching the real
map, so a conflict leaves the store unchanged; values are the frozen `Lease` objects themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.core.model import Lease, LeaseState
from gpupool.core.ports import RevisionConflict, TicketRecord, Write


class MemoryLeaseStore:
    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._tickets: dict[str, TicketRecord] = {}
        self._meta: dict[str, str] = {}
        self.commits = 0

    def apply(self, writes: Sequence[Write]) -> None:
        scratch: dict[str, Lease] = {}
        tickets: dict[str, TicketRecord] = {}
        for w in writes:
            if isinstance(w, TicketRecord):
                tickets[w.ticket] = w
                continue
            lid = w.lease.id
            cur = scratch.get(lid) or self._leases.get(lid)
            actual = None if cur is None else cur.revision
            if actual != w.expected_revision:
                raise RevisionConflict(lid, w.expected_revision, actual)
            scratch[lid] = w.lease
        self._leases.update(scratch)
        self._tickets.update(tickets)
        self.commits += 1

    def get(self, lease_id: str) -> Lease | None:
        return self._leases.get(lease_id)

    def active(self) -> list[Lease]:
        return [x for _, x in sorted(self._leases.items()) if x.state is LeaseState.ACTIVE]

    def leases(self, *, tenant: str | None = None) -> list[Lease]:
        return [x for _, x in sorted(self._leases.items()) if tenant is None or x.request.tenant == tenant]

    def purge_ended(self, *, before_s: float) -> int:
        gone = [
            lid
            for lid, x in self._leases.items()
            if x.state.ended and x.ended_at is not None and x.ended_at < before_s
        ]
        for lid in gone:
            del self._leases[lid]
        return len(gone)

    def get_ticket(self, ticket: str) -> TicketRecord | None:
        return self._tickets.get(ticket)

    def tickets(self) -> list[TicketRecord]:
        return [t for _, t in sorted(self._tickets.items())]

    def purge_tickets(self, *, before_s: float) -> int:
        gone = [k for k, t in self._tickets.items() if t.ended_at is not None and t.ended_at < before_s]
        for k in gone:
            del self._tickets[k]
        return len(gone)

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value

    def close(self) -> None:
        """Nothing to release; the contents stay readable (tests reopen nothing)."""
