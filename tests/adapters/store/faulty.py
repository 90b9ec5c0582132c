"""`FaultyStore`: a real store (SQLite in these tests) whose writes can be made to fail on demand,
raising exactly what SQLite raises on a full disk. Reads always go through."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gpupool.core.model import Lease
from gpupool.core.ports import LeaseStore, TicketRecord, Write

DISK_FULL = "database or disk is full"


class FaultyStore:
    def __init__(self, inner: LeaseStore) -> None:
        self.inner = inner
        self.fail: BaseException | None = None
        self.meta_ok = False
        """True: settings (`set_meta`) still go through while lease batches fail (the small write
        that fits, then the batch that does not)."""
        self.refused = 0

    def disk_full(self, *, meta_ok: bool = False) -> None:
        self.fail = sqlite3.OperationalError(DISK_FULL)
        self.meta_ok = meta_ok

    def heal(self) -> None:
        self.fail = None

    def _check(self) -> None:
        if self.fail is not None:
            self.refused += 1
            raise self.fail

    def apply(self, writes: Sequence[Write]) -> None:
        self._check()
        self.inner.apply(writes)

    def get(self, lease_id: str) -> Lease | None:
        return self.inner.get(lease_id)

    def active(self) -> list[Lease]:
        return self.inner.active()

    def leases(self, *, tenant: str | None = None) -> list[Lease]:
        return self.inner.leases(tenant=tenant)

    def purge_ended(self, *, before_s: float) -> int:
        self._check()
        return self.inner.purge_ended(before_s=before_s)

    def get_ticket(self, ticket: str) -> TicketRecord | None:
        return self.inner.get_ticket(ticket)

    def tickets(self) -> list[TicketRecord]:
        return self.inner.tickets()

    def purge_tickets(self, *, before_s: float) -> int:
        self._check()
        return self.inner.purge_tickets(before_s=before_s)

    def get_meta(self, key: str) -> str | None:
        return self.inner.get_meta(key)

    def set_meta(self, key: str, value: str) -> None:
        if not self.meta_ok:
            self._check()
        self.inner.set_meta(key, value)

    def close(self) -> None:
        self.inner.close()
