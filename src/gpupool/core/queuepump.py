"""`QueuePump`: the queue half of `LeaseController`: offering the queued requests capacity after
something ended (a release, an expiry, a preemption, a cancelled ticket), in the queue's order.

Role: a mixin of `LeaseController` only (it owns none of the state it touches; the controller's
``__init__`` creates every attribute declared below), like `TicketBook`, `GpuAdmin` and `KvBackends`.
Invariants (the controller's): a pump pass never raises into its caller (a queued item whose
placement fails ends its own ticket, state ``failed``); a session's queued turn waits for room on
the instance holding its prefix only while it is patient (``patience_s`` after it queued), then
takes any instance; while it is patient, no queued request of its band or a lower one that is not
waiting for the same holder is placed there, wherever it stands in the queue (room that frees on
the holder is the waiting turn's: anything else admitted there first evicts the idle prefix the turn
waits for, the least recently used blocks of the engine); a pass that ended leases is followed by
another, at most `MAX_PUMP_PASSES`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from gpupool.core import placement
from gpupool.core.admission import NOTHING, AdmissionQueue, Ticketed, Verdict
from gpupool.core.allocator import Allocator
from gpupool.core.clock import Clock
from gpupool.core.kvlane import KvLane
from gpupool.core.model import Lease, Request
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.priority import band
from gpupool.core.tickets import MissMemo, TicketStatus

MAX_PUMP_PASSES = 4


class QueuePump:
    allocator: Allocator
    kv: Allocator
    lane: KvLane
    clock: Clock
    queue: AdmissionQueue
    outcomes: Counter[tuple[str, str]]
    preemptions: int
    _tickets: OrderedDict[str, TicketStatus]
    _granting: Ticketed | None
    _kv_models: dict[str, str]
    _ends: int
    _awaited: Mapping[str, int] = MappingProxyType({})
    """Holder slice -> the highest priority of a patient turn waiting for it (this pump pass)."""

    if TYPE_CHECKING:  # the controller's and its other halves' (declared only: no runtime shadowing)

        def _place(
            self, request: Request, gpu_id: str, *, kv: bool, avoid: frozenset[str] = NOTHING
        ) -> Outcome: ...
        def _holder_grant(self, item: Ticketed, avoid: frozenset[str]) -> Lease | None: ...
        def _reclaim_for(self, request: Request, avoid: frozenset[str], session: str = "") -> bool: ...
        def _lane_expire(self) -> None: ...
        def _end_ticket(
            self, st: TicketStatus, state: str, *, lease: Lease | None = None, reason: str = ""
        ) -> TicketStatus: ...

    def _patient(self, item: Ticketed) -> bool:
        """``item`` still waits for room on its session's holder only."""
        return self.clock.now() < item.enqueued_at + item.patience_s

    def _memo_scope(self, item: Ticketed) -> tuple[object, ...]:
        """`MissMemo`'s scope: a turn waiting for its holder only while patient (it targets only the
        holder then, any instance after), so patient and impatient turns never share a miss."""
        return (*item.scope, self._patient(item)) if item.holder else item.scope

    def _hold_target(self, item: Ticketed, held: frozenset[str]) -> frozenset[str]:
        if item.holder and self._patient(item):
            return frozenset((item.holder,)) if item.holder not in held else NOTHING
        alloc = self.kv if item.kv else self.allocator
        kv_models = self._kv_models if item.kv else None
        return placement.hold_target(alloc, item.request, gpu_id=item.gpu_id, kv_models=kv_models, held=held)

    def _pump(self) -> None:
        """Offer every queued item capacity (see `AdmissionQueue.drain`); again while a pass ends
        leases (preemption, expiry), at most `MAX_PUMP_PASSES` times."""
        self.lane.yield_all()  # queued requests see the KV budgets' true free room
        for _ in range(MAX_PUMP_PASSES):
            start = self._ends
            self._lane_expire()  # (the allocators expire theirs before each placement)
            awaited: dict[str, int] = {}
            for x in self.queue:
                if x.holder and self._patient(x) and awaited.get(x.holder, x.priority - 1) < x.priority:
                    awaited[x.holder] = x.priority
            self._awaited = awaited
            self.queue.drain(MissMemo(self._try_queued, lambda: self._ends, self._memo_scope))
            if self._ends == start or not len(self.queue):
                return

    def _try_queued(self, item: Ticketed, avoid: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
        """Pump one queued item. Whatever goes wrong ends this ticket only (state ``failed``)."""
        st = self._tickets.get(item.ticket)
        if self._awaited and item.kv:  # holders that patient turns wait for are theirs
            awaited = [h for h, p in self._awaited.items() if p >= item.priority and h != item.holder]
            if awaited:
                avoid = avoid | frozenset(awaited)
        alloc = self.kv if item.kv else self.allocator
        kv_models = self._kv_models if item.kv else None
        self._granting = item
        why = None
        try:
            lease = self._holder_grant(item, avoid) if item.holder else None
            if lease is not None:
                out = Outcome(OutcomeCode.GRANTED, lease=lease)
            elif item.holder and self._patient(item):
                return Verdict.BLOCKED, self._hold_target(item, avoid)
            else:
                if item.kv:
                    self._reclaim_for(item.request, avoid)
                out = self._place(item.request, item.gpu_id, kv=item.kv, avoid=avoid)
            if not out.granted:
                why = placement.unresolvable(alloc, item.request, gpu_id=item.gpu_id, kv_models=kv_models)
        except Exception as exc:  # NOTE: pumping is the gateway's own work: never raise into the caller
            why = f"placing the queued request failed: {exc}"
        finally:
            self._granting = None
        if why is not None:
            if st is not None:
                self._end_ticket(st, "failed", reason=why)
            self.outcomes[(band(item.priority), "failed")] += 1
            return Verdict.DROPPED, NOTHING
        if out.granted and out.lease is not None:
            if st is not None:
                self._end_ticket(st, "granted", lease=out.lease)
            if out.victims:
                self.preemptions += len(out.victims)
            self.outcomes[(band(item.priority), "granted_from_queue")] += 1
            return Verdict.GRANTED, NOTHING
        return Verdict.BLOCKED, self._hold_target(item, avoid)
