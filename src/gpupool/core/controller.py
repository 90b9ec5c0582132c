"""`LeaseController`: the one ledger. Composes the `Allocator` (placement leases: instances, jobs, pods),
a second allocator over model instances' KV-cache budgets (request leases), the `AdmissionQueue`, a
`WatermarkBank` and a `LeaseStore` (write-through, group-committed), and emits `GatewayEvent`s.

Admission of a new request (`acquire`), in this order:
1. validate (``InvalidInput`` names the field); a request no healthy slice in its scope (kinds,
   nodes, GPU, model) could ever hold is UNRESOLVABLE (HTTP 503), whatever the queue holds;
2. it is placed now on capacity that no queued request of its band or a higher one holds (the rule
   in `gpupool.core.admission`; where it may go: `gpupool.core.placement`): priority >=
   ``preempt_min_priority`` (P0) may preempt strictly lower preemptible work; sheddable (P2) work is
   never placed on a GPU whose watermark machine is PAUSED and gets BACKPRESSURE (HTTP 429 +
   Retry-After) when only paused GPUs have room;
3. when nothing it may take has room it queues with a deadline (HTTP 202 + ticket), holding the
   capacity it waits for, or is SHED when the band is full (HTTP 429). Capacity freed by release /
   expiry / revocation / RESUME / health, and every queue removal, pumps the queue (`_pump`).

Tickets: queued -> granted (``lease``) | shed (deadline, full) | cancelled | failed (it became
unresolvable, or pumping it raised: the error ends that ticket only, never the call that pumped).
Cancelling a granted ticket changes nothing (the HTTP layer answers 409 naming the lease). Every
ticket change is a `TicketRecord` written in the same batch as the lease writes of the same call;
`recover` reloads them: queued ones wait again until their original deadline, granted ones point at
their lease. Request-lease (KV) tickets are memory-only, like request leases.

Durability: every lease change is recorded as a compare-and-set `StoreWrite` (coalesced per lease)
and the events that go with it wait in the same pending batch. `flush` (or `take_batch` + store
``apply`` on the loop, in a worker thread or pipelined + `deliver`, the gateway's group commit, which
holds a batch back while `pending_ids` names a lease still in flight) makes the batch durable *before*
its events are delivered, so every event describes durable state. Request leases (KV budgets) live
in memory only: they end with the process that serves their request.

A batch the store refuses (full disk, I/O error) is undone (`undo`): every lease it or any later
pending change touched goes back to its last durable version in the allocator, its events are
dropped, and tickets it queued or granted end as ``failed`` naming the store's error; so memory
always equals the store, whatever the store's fault.

Recovery (`recover`): active leases are read back from the store; those past expiry are ended as
EXPIRED, those that no longer fit (slice gone, shrunk or overbooked) are ended as REVOKED, the rest
are restored; afterwards the ledger equals a recomputation from the stored active leases.

Tenancy: calls that take ``tenant`` treat another tenant's lease or ticket as unknown (`UnknownId`).
The controller never reads a clock: all time comes from the injected `Clock`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpupool.core import placement
from gpupool.core.admission import NOTHING, AdmissionConfig, AdmissionQueue, Ticketed
from gpupool.core.allocator import Allocator, LeaseEvent
from gpupool.core.binds import PlacementBinds
from gpupool.core.clock import Clock
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.gpu_admin import GpuAdmin
from gpupool.core.ids import LeaseIdFactory, random_lease_id
from gpupool.core.kvbackends import KV_PREFIX, KvBackends
from gpupool.core.kvlane import KvLane
from gpupool.core.model import Lease, LeaseState, Request, validate_request
from gpupool.core.outcome import Outcome, OutcomeCode, Refusal, shed
from gpupool.core.ports import (
    Backend,
    Batch,
    EventSink,
    GatewayEvent,
    LeaseStore,
    RecoveryReport,
    StoreWrite,
    Write,
)
from gpupool.core.priority import P0, band
from gpupool.core.queuepump import QueuePump
from gpupool.core.sessions import SessionTable
from gpupool.core.ticketbook import TicketBook
from gpupool.core.tickets import TicketStatus
from gpupool.core.watermarks import Reading, WatermarkBank, WatermarkConfig
from gpupool.hardware.slices import Slice


class AdmissionHook(Protocol):
    """Asked before every admission (a reason string, or a `Refusal` with its wait, refuses it as SHED:
    HTTP 429 + reason + Retry-After) and told its outcome right after (`gpupool.core.tidal.plane`)."""

    def before_admit(self, request: Request, *, kv: bool) -> str | Refusal | None: ...

    def after_admit(self, request: Request, out: Outcome) -> None: ...


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    preempt_min_priority: int = P0
    queue_sheddable: bool = True
    """P2 work that finds no room waits in the queue (False: it is shed at once with 429)."""
    retry_after_s: float = 1.0
    ended_retention_s: float = 3600.0
    kv_red_line_pct: int = 100
    """A model instance's KV slice in the ledger holds this share of its KV budget: requests are
    admitted while their predicted use (held + prompt + growth to ``max_tokens``) stays at or below
    it; the rest is the engine's margin for estimate error, so it never preempts silently. The
    gateway (`gpupool serve` / `run`) runs at `DEFAULT_RED_LINE_PCT` (90); 100 is no margin."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    watermarks: WatermarkConfig = field(default_factory=WatermarkConfig)


class LeaseController(GpuAdmin, KvBackends, PlacementBinds, QueuePump, TicketBook):
    def __init__(
        self,
        slices: Iterable[Slice],
        *,
        clock: Clock,
        store: LeaseStore,
        sink: EventSink | None = None,
        config: ControllerConfig | None = None,
        lease_ids: LeaseIdFactory = random_lease_id,
        ticket_ids: LeaseIdFactory = random_lease_id,
        policy: str = "bestfit",
        autoflush: bool = True,
        ticket_memory: int = 10_000,
    ) -> None:
        self.clock = clock
        self.store = store
        self.sink = sink
        self.config = config or ControllerConfig()
        self.autoflush = autoflush
        self.allocator = Allocator(
            slices,
            clock=clock,
            policy=policy,
            lease_ids=lease_ids,
            on_event=self._on_lease,
            ended_capacity=4096,
        )
        self.kv = Allocator((), clock=clock, lease_ids=lease_ids, on_event=self._on_kv, ended_capacity=4096)
        self.lane = KvLane(self.kv, now=clock.now, lease_ids=lease_ids)
        """Request leases granted inside shares of the KV budgets (`gpupool.core.kvlane`)."""
        self.sessions = SessionTable(self.kv, now=clock.now)
        """Sessions' retained prefixes: preemptible leases on the KV budgets (`gpupool.core.sessions`)."""
        self.queue = AdmissionQueue(self.config.admission)
        self.bank = WatermarkBank(self.config.watermarks)
        self.backends: dict[str, Backend] = {}
        self._models: dict[str, list[Backend]] = {}
        self._ticket_ids = ticket_ids
        self._pending: OrderedDict[str, Write] = OrderedDict()
        self._before: dict[str, Lease | None] = {}
        """Per pending lease id, its last durable version (None: not in the allocator before)."""
        self._touched: dict[str, None] = {}
        """Tickets queued or ended since the last `take_batch`."""
        self._events: list[GatewayEvent] = []
        self._tickets: OrderedDict[str, TicketStatus] = OrderedDict()
        self._ticket_memory = ticket_memory
        self._freed = False
        self.readings: dict[str, Reading] = {}
        """Last reading per GPU; with ``gpu_health`` and ``drained``: read-only outside this class."""
        self.gpu_health: dict[str, str] = {}
        self.drained: set[str] = set()
        self.outcomes: Counter[tuple[str, str]] = Counter()
        """(band, outcome) -> count: codes, ``shed_queue_full`` (band full) apart from deadline sheds."""
        self.preemptions = 0
        self._granting: Ticketed | None = None
        self._gpus = set(self.allocator.ledger.gpu_ids())
        self._kv_models: dict[str, str] = {}  # KV slice id -> model of its backend
        self.closed: set[str] = set()  # slices an admin closed (`GpuAdmin.mark_slice`, `closed`)
        self._unroutable: dict[str, set[str]] = {}  # KV slice -> why out of routing (`set_backend_routable`)
        self._ends = 0
        """Leases ended so far (a pump pass that ends some runs again)."""
        self._bound, self._cards = {}, None  # pod UID -> lease id, the card index: `PlacementBinds`
        self.admission_hook: AdmissionHook | None = None
        """Consulted first by `acquire` (the tidal plane: demand metering, DAY reservation)."""
        self.views: dict[str, Callable[[], object]] = {}
        """Extra sections of ``GET /v1/pool`` (name -> JSON-ready value), e.g. ``tidal``."""
        self._begun = ""
        """The KV slice the last `acquire` pinned its session on (`KvBackends.session_begin`)."""
        self._begun_queued: OrderedDict[str, str] = OrderedDict()
        """Request id -> the KV slice a pump pass pinned its session on (granted from the queue on
        its holder; `KvBackends.session_begin` takes it; at most `MAX_BEGUN_QUEUED` kept)."""
        if not 1 <= self.config.kv_red_line_pct <= 100 or type(self.config.kv_red_line_pct) is not int:
            raise InvalidInput(
                "kv_red_line_pct", self.config.kv_red_line_pct, "must be an integer in [1, 100]"
            )

    # ================================================================== leases
    def acquire(
        self,
        request: Request,
        *,
        wait_s: float | None = None,
        gpu_id: str = "",
        prefer: str = "",
        queue: bool = True,
        session: str = "",
        holder: str = "",
        patience_s: float = 0.0,
    ) -> Outcome:
        """Admit ``request`` now, queue it, or say why not (see the module docstring). ``prefer``: a
        KV slice for a model request, taken when it has room (`KvLane.grant`). ``queue=False``: P2
        work that finds no room is SHED instead of queued (the batch queue waits on its own).
        Taking ``prefer`` may reclaim other sessions' retained prefixes there first
        (`KvBackends._lane_grant`); ``session``: the request's session, whose own retained prefix
        is never reclaimed for it. Queued, a model request waits for room on ``holder`` (the KV
        slice holding its session's prefix: `SessionTable.holder`) for ``patience_s`` seconds
        before it takes any slice (`KvBackends._holder_grant`); with a ``holder``, a patience and
        no ``prefer`` or ``prefer`` = ``holder``, it is granted now only on the holder, else it
        queues for it."""
        validate_request(request)
        if not (0.0 <= patience_s <= self.config.admission.max_wait_s):  # also NaN
            raise InvalidInput(
                "patience_s", patience_s, f"must be in [0, {self.config.admission.max_wait_s}]"
            )
        if holder and holder not in self._kv_models:
            raise InvalidInput("holder", holder, "not a KV slice of a registered backend")
        self._begun = ""
        if gpu_id and gpu_id not in self._gpus:
            raise InvalidInput("gpu_id", gpu_id, "no such GPU in the pool")
        if gpu_id and request.gpu_count > 1:
            raise InvalidInput("gpu_id", gpu_id, "a multi-GPU request cannot name one GPU")
        kv = bool(request.model) and request.model in self.models()
        hook = self.admission_hook
        if hook is not None:
            why = hook.before_admit(request, kv=kv)
            out = (
                self._count(request, self._shed(why))
                if why
                else self._admit(
                    request,
                    wait_s=wait_s,
                    gpu_id="" if kv else gpu_id,
                    kv=kv,
                    prefer=prefer,
                    queue=queue,
                    session=session if kv else "",
                    holder=holder if kv else "",
                    patience_s=patience_s,
                )
            )
            hook.after_admit(request, out)
            return self._finish(out)
        if kv:
            return self._finish(
                self._admit(
                    request,
                    wait_s=wait_s,
                    gpu_id="",
                    kv=True,
                    prefer=prefer,
                    queue=queue,
                    session=session,
                    holder=holder,
                    patience_s=patience_s,
                )
            )
        return self._finish(self._admit(request, wait_s=wait_s, gpu_id=gpu_id, kv=False, queue=queue))

    def place(self, request: Request, slice_ids: tuple[str, ...]) -> Outcome:
        """Grant on exactly these slices (model instances placed by the plan; Kubernetes bind)."""
        out = self.allocator.place(request, slice_ids)
        if out.granted:
            self.queue.record_grant(request.priority)
        return self._finish(self._count(request, out))

    def release(self, lease_id: str, *, tenant: str | None = None, reason: str = "") -> Outcome:
        lane = self._lane_lease(lease_id, tenant)
        if lane is not None:
            return self._end_lane(lane, LeaseState.RELEASED, reason or "released by holder")
        alloc, lease = self._owner(lease_id, tenant)
        if alloc is None:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        return self._finish(alloc.release(lease_id, reason=reason or "released by holder"))

    def renew(self, lease_id: str, *, ttl_s: float | None = None, tenant: str | None = None) -> Outcome:
        lane = self._lane_lease(lease_id, tenant)
        if lane is not None and not lane.state.ended:
            ttl = lane.request.ttl_s if ttl_s is None else ttl_s
            validate_request(replace(lane.request, ttl_s=ttl))
            renewed = self.lane.renew(lease_id, self.clock.now() + float(ttl))
            return self._finish(Outcome(OutcomeCode.RENEWED, lease=renewed))
        if lane is not None:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lane, reason=f"lease already {lane.state}")
        alloc, lease = self._owner(lease_id, tenant)
        if alloc is None:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        return self._finish(alloc.renew(lease_id, ttl_s))

    def revoke(self, lease_id: str, *, reason: str) -> Outcome:
        """End a lease on the pool's initiative (a node agent could not free its GPU in time)."""
        lane = self._lane_lease(lease_id, None)
        if lane is not None:
            return self._end_lane(lane, LeaseState.REVOKED, reason)
        alloc, lease = self._owner(lease_id, None)
        if alloc is None:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        return self._finish(alloc.revoke(lease_id, reason=reason))

    def get(self, lease_id: str, *, tenant: str | None = None) -> Lease:
        lane = self._lane_lease(lease_id, tenant)
        return lane if lane is not None else self._owner(lease_id, tenant)[1]

    def leases(self, *, tenant: str | None = None) -> list[Lease]:
        """Active placement and request leases (of one tenant), sorted by id."""
        out = [x for x in self.allocator.leases if self._tenant_sees(x, tenant)]
        out += [x for x in self.request_leases() if tenant is None or x.request.tenant == tenant]
        return sorted(out, key=lambda x: x.id)

    def tick(self) -> None:
        """Expire due leases and queue deadlines, then pump the queue. Call every ~100-200 ms."""
        self.allocator.expire_due()
        self.kv.expire_due()
        self._lane_expire()
        self.lane.renew_shares()
        for item in self.queue.expire(self.clock.now()):
            st = self._tickets.get(item.ticket)
            if st is not None:
                self._end_ticket(st, "shed", reason="queue deadline passed")
            self.outcomes[(band(item.priority), "shed")] += 1
        self._freed = True
        self._finish(None)

    # ================================================================== durability
    def take_batch(self) -> Batch:
        b = Batch(
            tuple(self._pending.values()),
            tuple(self._events),
            before=tuple(self._before.items()),
            tickets=tuple(self._touched),
        )
        self._pending = OrderedDict()
        self._before = {}
        self._touched = {}
        self._events = []
        return b

    def undo(self, batch: Batch, error: str) -> None:
        """The store could not make ``batch`` durable: undo it and every change made since.

        Leases go back to their last durable versions (new ones vanish, ended ones are active
        again, renewals are rolled back), the events of the undone changes are never delivered,
        and tickets queued or granted by them end as ``failed`` with ``error`` as the reason."""
        versions = dict(batch.before)
        for lid, old in self._before.items():
            versions.setdefault(lid, old)
        tickets = dict.fromkeys((*batch.tickets, *self._touched))
        self._pending = OrderedDict()
        self._before = {}
        self._touched = {}
        self._events = []
        self.allocator.rewind(versions.items())
        self._rebuild_binds()
        why = f"lease store unavailable: {error}"
        for t in tickets:
            st = self._tickets.get(t)
            if st is None:
                continue
            waiting = st.state == "queued" and self.queue.remove(t) is not None
            if waiting or (st.state == "granted" and st.lease is not None and st.lease.id in versions):
                self._end_ticket(st, "failed", reason=why)
        self._freed = True

    def deliver(self, batch: Batch) -> None:
        if self.sink is not None:
            for e in batch.events:
                self.sink(e)

    def flush(self) -> int:
        """Make the pending batch durable, then deliver its events. On a store error the batch is
        undone (`undo`) and the store's exception propagates."""
        b = self.take_batch()
        if b.writes:
            try:
                self.store.apply(b.writes)
            except Exception as exc:
                self.undo(b, str(exc))
                raise
        self.deliver(b)
        return len(b.writes)

    @property
    def dirty(self) -> bool:
        return bool(self._pending or self._events)

    def pending_ids(self) -> Iterable[str]:
        """The lease ids (and ``ticket:``-prefixed ticket ids) the next `take_batch` will write: a
        pipelined committer holds the batch back while one of its leases is still in flight."""
        return self._pending.keys()

    def recover(self) -> RecoveryReport:
        """Reload active leases from the store (see the module docstring). Call once, before serving."""
        now = self.clock.now()
        restored = expired = revoked = 0
        for lease in self.store.active():
            if lease.expires_at <= now:
                why = "expired while the gateway was down"
                self._write(lease.with_state(LeaseState.EXPIRED, at=now, reason=why), lease.revision)
                expired += 1
                continue
            try:
                self.allocator.restore(lease)
                restored += 1
            except (InvalidInput, UnknownId) as exc:
                why = f"not restorable: {exc}"
                self._write(lease.with_state(LeaseState.REVOKED, at=now, reason=why), lease.revision)
                revoked += 1
        self._recover_tickets(now)
        self.flush()
        self.allocator.check_invariants()
        return RecoveryReport(restored=restored, expired=expired, revoked=revoked)

    # ================================================================== views
    def check_invariants(self) -> None:
        self.allocator.check_invariants()
        self.kv.check_invariants()
        self.lane.check()
        self.sessions.check()

    # ================================================================== internals
    def _admit(
        self,
        request: Request,
        *,
        wait_s: float | None,
        gpu_id: str,
        kv: bool,
        prefer: str = "",
        queue: bool = True,
        session: str = "",
        holder: str = "",
        patience_s: float = 0.0,
    ) -> Outcome:
        cfg = self.config.admission
        if wait_s is not None and not 0 < wait_s <= cfg.max_wait_s:
            raise InvalidInput("queue_timeout_s", wait_s, f"must be in (0, {cfg.max_wait_s}]")
        kv_models = self._kv_models if kv else None
        if kv:
            self._lane_expire()
        # granted now on its holder or queued for it (`acquire`), never placed elsewhere now (also when
        # routing preferred the holder: room there taken by queued requests is not a reason to go)
        only_holder = bool(kv and holder and patience_s > 0 and prefer in ("", holder))
        if kv and KvLane.eligible(request):
            held = self.queue.avoid(request.priority) if len(self.queue) else NOTHING
            if only_holder:
                others = frozenset(x for x in self._kv_models if x != holder)
                lease = self._lane_grant(request, held | others, holder, session)
            else:
                lease = self._lane_grant(request, held, prefer, session)
            if lease is not None:
                self.queue.record_grant(request.priority)
                return self._count(request, Outcome(OutcomeCode.GRANTED, lease=lease))
        if kv:
            self.lane.yield_all()  # the allocator's path must see the true free room
            if not KvLane.eligible(request):
                self._reclaim_for(request, self.queue.avoid(request.priority) if len(self.queue) else NOTHING)
        if kv and not len(self.queue) and not only_holder:
            # Request leases with nothing queued: try the placement first; a grant proves a slice in
            # scope could hold the request, which is all `unresolvable` would establish (same outcome,
            # same counts and events, one scan of the model's KV slices fewer per request).
            out = self._place(request, gpu_id, kv=True)
            if out.granted:
                self.queue.record_grant(request.priority)
                return self._count(request, out)
        why = placement.unresolvable(
            self.allocator if not kv else self.kv, request, gpu_id=gpu_id, kv_models=kv_models
        )
        if why is not None:
            return self._count(request, Outcome(OutcomeCode.UNRESOLVABLE, reason=why))
        avoid = self.queue.avoid(request.priority) if len(self.queue) else NOTHING
        out = (
            self._place(request, gpu_id, kv=kv, avoid=avoid)
            if not only_holder
            else Outcome(OutcomeCode.NO_CAPACITY, reason="waiting for room on its session's holder")
        )
        if out.code is not OutcomeCode.NO_CAPACITY:
            if out.granted:
                self.queue.record_grant(request.priority)
            return self._count(request, out)
        if request.priority < 0 and not (self.config.queue_sheddable and queue):
            why = "no room now and sheddable work does not queue"
            return self._count(request, self._shed(why))
        wait = cfg.default_wait_s(request.priority) if wait_s is None else wait_s
        now = self.clock.now()
        item = Ticketed(
            ticket=str(self._ticket_ids()),
            request=request,
            enqueued_at=now,
            deadline_at=now + wait,
            seq=self.queue.next_seq(),
            gpu_id=gpu_id,
            kv=kv,
            holder=holder if kv and patience_s > 0 else "",
            session=session if kv else "",
            patience_s=patience_s if kv and holder else 0.0,
        )
        holds = self._hold_target(item, avoid)
        if not self.queue.push(item, holds):
            out = self._shed(f"queue of band {band(request.priority)} is full")
            return self._count(request, out, outcome="shed_queue_full")  # not a deadline miss
        st = TicketStatus(item.ticket, "queued", request, now, item.deadline_at, gpu_id=gpu_id, kv=kv)
        self._remember(st)
        self._events.append(GatewayEvent(kind="queued", at=now, ticket=item.ticket, tenant=request.tenant))
        queued = Outcome(
            OutcomeCode.QUEUED,
            ticket=item.ticket,
            reason="waiting for capacity",
            retry_after_s=self.config.retry_after_s,
        )
        return self._count(request, queued)

    def _shed(self, why: str | Refusal) -> Outcome:
        return shed(why, self.config.retry_after_s)

    def _count(self, request: Request, out: Outcome, outcome: str = "") -> Outcome:
        """Count ``out`` in `outcomes` under its code, or under ``outcome`` when given."""
        self.outcomes[(band(request.priority), outcome or out.code.value)] += 1
        if out.victims:
            self.preemptions += len(out.victims)
        return out

    def _place(self, request: Request, gpu_id: str, *, kv: bool, avoid: frozenset[str] = NOTHING) -> Outcome:
        """Place now outside ``avoid`` (units held by queued requests that go first), or say why not."""
        return placement.place(
            self.kv if kv else self.allocator,
            request,
            gpu_id=gpu_id,
            kv_models=self._kv_models if kv else None,
            paused=self.paused_gpus() if request.priority < 0 else frozenset(),
            avoid=avoid,
            preempt=not kv and not gpu_id and request.priority >= self.config.preempt_min_priority,
            retry_after_s=self.config.retry_after_s,
        )

    def _finish(self, out: Outcome | None) -> Outcome:
        if self._freed and len(self.queue):
            self._freed = False
            self._pump()
        self._freed = False
        if self.autoflush and self.dirty:
            self.flush()
        return out if out is not None else Outcome(OutcomeCode.RELEASED)

    def _on_lease(self, ev: LeaseEvent) -> None:
        lease = ev.lease
        self._note_bind(ev)
        if ev.kind == "restored":
            return
        self._write(lease, None if ev.kind == "granted" else lease.revision - 1, ev.previous)
        if lease.state.ended:
            self._freed = True
            self._ends += 1
        item = self._granting if ev.kind == "granted" else None
        self._events.append(
            GatewayEvent(
                kind=ev.kind,
                at=ev.at,
                lease=lease,
                ticket=item.ticket if item is not None else "",
                tenant=lease.request.tenant,
                reason=lease.reason,
                wait_s=ev.at - item.enqueued_at if item is not None else 0.0,
            )
        )

    def _write(self, lease: Lease, expected: int | None, previous: Lease | None = None) -> None:
        """Queue the write; ``previous`` is the allocator's version before it (None: not held)."""
        prev = self._pending.get(lease.id)
        if prev is None:
            self._before[lease.id] = previous
        if isinstance(prev, StoreWrite):
            expected = prev.expected_revision
        self._pending[lease.id] = StoreWrite(lease, expected)

    def _owner(self, lease_id: str, tenant: str | None) -> tuple[Allocator | None, Lease]:
        """The allocator holding the lease (None: ended and known only to the store) and the lease.

        Another tenant's lease is unknown (`UnknownId`), so tenants cannot probe ids."""
        alloc: Allocator | None = None
        if self.lane.is_share(lease_id):
            raise UnknownId("lease", lease_id)  # the lane's own bookkeeping, nobody's to touch
        lease = self.allocator.leases.get(lease_id)
        if lease is not None:
            alloc = self.allocator
        elif (lease := self.kv.leases.get(lease_id)) is not None:
            alloc = self.kv
        else:
            lease = self.store.get(lease_id)
            if lease is not None and not lease.state.ended:
                lease = None  # NOTE: active in the store but not restored: not ours to serve
        if lease is None or not self._tenant_sees(lease, tenant):
            raise UnknownId("lease", lease_id)
        return alloc, lease


__all__ = [
    "KV_PREFIX",
    "Backend",
    "Batch",
    "ControllerConfig",
    "LeaseController",
    "RecoveryReport",
    "TicketStatus",
]
