"""`TicketBook`: the ticket half of `LeaseController`: a queued request's ticket, its states
(``queued`` -> ``granted`` | ``shed`` | ``cancelled`` | ``failed``), the bounded in-memory memory of
recent tickets, their durable records, and their reload after a restart.

Role: a mixin of `LeaseController` only (it owns none of the state it touches; the controller's
``__init__`` creates every attribute declared below), like `GpuAdmin` and `KvBackends`.
Invariants (the controller's): a ticket's record is written in the same group commit as the leases
it concerns (request-lease tickets, ``kv``, are not stored); at most ``_ticket_memory`` ended tickets
are kept in memory (queued ones always); a reloaded queued ticket waits again until its deadline,
before any newcomer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

from gpupool.core.admission import AdmissionQueue, Ticketed
from gpupool.core.allocator import Allocator
from gpupool.core.clock import Clock
from gpupool.core.errors import UnknownId
from gpupool.core.model import Lease
from gpupool.core.outcome import Outcome
from gpupool.core.ports import GatewayEvent, LeaseStore, TicketRecord, Write
from gpupool.core.priority import band
from gpupool.core.tickets import TicketStatus, from_record, to_record

if TYPE_CHECKING:
    from gpupool.core.controller import ControllerConfig


class TicketBook:
    allocator: Allocator
    clock: Clock
    store: LeaseStore
    queue: AdmissionQueue
    config: ControllerConfig
    _tickets: OrderedDict[str, TicketStatus]
    _ticket_memory: int
    _touched: dict[str, None]
    _pending: OrderedDict[str, Write]
    _events: list[GatewayEvent]
    _freed: bool

    def _finish(self, out: Outcome | None) -> Outcome:  # the controller's
        raise NotImplementedError

    def _pump(self) -> None:  # the controller's
        raise NotImplementedError

    def ticket(self, ticket: str, *, tenant: str | None = None) -> TicketStatus:
        st = self._tickets.get(ticket)
        if st is None:
            rec = self.store.get_ticket(ticket)
            st = None if rec is None else self._status_of(rec)
        if st is None or (tenant is not None and st.request.tenant != tenant):
            raise UnknownId("ticket", ticket)
        return st

    def cancel(self, ticket: str, *, tenant: str | None = None) -> TicketStatus:
        """End a queued ticket; any other ticket is answered as it is (a granted one keeps its lease)."""
        st = self.ticket(ticket, tenant=tenant)
        if st.state == "queued" and self.queue.remove(ticket) is not None:
            st = self._end_ticket(st, "cancelled", reason="cancelled by holder")
            self._freed = True  # NOTE: its holds are gone: others may take that capacity now
            self._finish(None)
        return st

    def _end_ticket(
        self, st: TicketStatus, state: str, *, lease: Lease | None = None, reason: str = ""
    ) -> TicketStatus:
        now = self.clock.now()
        new = replace(st, state=state, lease=lease, reason=reason, ended_at=now)
        self._remember(new)
        if state != "granted":  # NOTE: a grant's event is the lease's own "granted" event (with the ticket)
            self._events.append(
                GatewayEvent(
                    kind=state if state in ("failed", "cancelled") else "shed",
                    at=now,
                    ticket=st.ticket,
                    tenant=st.request.tenant,
                    reason=reason or state,
                )
            )
        return new

    def _remember(self, st: TicketStatus, *, write: bool = True) -> None:
        self._touched[st.ticket] = None
        self._tickets[st.ticket] = st
        self._tickets.move_to_end(st.ticket)
        if write and not st.kv:
            self._pending["ticket:" + st.ticket] = to_record(st)
        while len(self._tickets) > self._ticket_memory:
            old, s = next(iter(self._tickets.items()))
            if s.state == "queued":
                break
            del self._tickets[old]

    def _status_of(self, rec: TicketRecord) -> TicketStatus:
        lease = None
        if rec.lease_id:
            lease = self.allocator.leases.get(rec.lease_id) or self.store.get(rec.lease_id)
        return from_record(rec, lease)

    def _recover_tickets(self, now: float) -> None:
        """Reload stored tickets (part of `recover`): queued ones wait again until their deadline."""
        self.store.purge_tickets(before_s=now - self.config.ended_retention_s)
        recs = sorted(self.store.tickets(), key=lambda r: (r.enqueued_at, r.ticket))
        for rec in recs[-self._ticket_memory :]:
            st = self._status_of(rec)
            if rec.state != "queued":
                self._remember(st, write=False)
                continue
            if rec.deadline_at <= now:
                self._end_ticket(st, "shed", reason="queue deadline passed while the gateway was down")
                continue
            item = Ticketed(
                rec.ticket, rec.request, rec.enqueued_at, rec.deadline_at, self.queue.next_seq(), rec.gpu_id
            )
            if not self.queue.push(item):
                self._end_ticket(st, "shed", reason=f"queue of band {band(rec.request.priority)} is full")
                continue
            self._remember(st, write=False)
        if len(self.queue):
            self._pump()  # NOTE: before any newcomer: the restored tickets were there first
