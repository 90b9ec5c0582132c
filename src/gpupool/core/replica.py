"""`ProxyReplica`: what the OpenAI proxy of a *proxy replica* calls instead of a `LeaseController`:
request leases granted inside the KV shares the leader delegated (`gpupool.core.kvreplica`), with a
short wait for room.

Role: the same calls and answers the proxy makes on the leader's controller (``acquire`` ->
`Outcome`, ``release``, ``ticket``, ``cancel``, ``models``, ``backend_of``, ``lane.load``), so one
proxy code path serves both. ``acquire``: a lease inside a share now (GRANTED); else, when some
backend of the model is known, the demand is recorded (the next share call asks for it), a renewal
is requested (`renewal_wanted`) and the request waits (QUEUED with a ticket) until room appears in a
share or ``max_wait_s`` passes (then SHED, HTTP 429 + Retry-After); a model with no backend at the
leader, or a request larger than every KV budget of its model, is UNRESOLVABLE (HTTP 503).
Waiting requests are granted highest priority first, then in arrival order, whenever a share grows
or a lease ends (`pump`); each grant or shed is announced to the ``sink`` as a `GatewayEvent` with
its ticket, which is what the HTTP layer waits on.

What the replica does not do (the leader does): placement leases, preemption, the durable admission
queue, watermark readings (a backend on a PAUSED GPU is flagged by the leader in its answer, and
sheddable requests are not granted there), the lease API.

Invariants: those of `ReplicaShares`; a ticket is queued in at most one place; every ended ticket
is remembered (bounded) so a late ``ticket`` call answers its final state.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpupool.core.clock import Clock
from gpupool.core.errors import UnknownId
from gpupool.core.kvbackends import KV_PREFIX
from gpupool.core.kvreplica import ReplicaShares
from gpupool.core.kvshares import ShareGrant, ShareReport
from gpupool.core.model import Lease, LeaseState, Request, validate_request
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.ports import Backend, EventSink, GatewayEvent
from gpupool.core.tickets import TicketStatus

TICKET_MEMORY = 10_000


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    retry_after_s: float = 1.0
    max_wait_s: float = 2.0
    """Longest wait for room in a share before a request is shed (429)."""

    @property
    def admission(self) -> ReplicaConfig:
        """The proxy reads ``config.admission.max_wait_s`` of either core (a controller's or this)."""
        return self


class NoSessions:
    """A replica keeps no session residency: prefix-aware routing among instances and retained
    prefixes live in the leader's ledger (`core.sessions`). A replica takes the instance with the most
    room in its shares; a load balancer in front of replicas should keep a session on one replica."""

    def route(
        self,
        session: str,
        need_mib: int,
        prompt_tokens: int,
        instances: Iterable[str],
        load: Callable[[str], tuple[int, int]],
    ) -> tuple[str, int]:
        return "", prompt_tokens

    def holder(self, session: str, prompt_tokens: int, need_mib: int) -> tuple[str, int, float]:
        return "", prompt_tokens, 0.0

    def prefill_begin(self, instance: str, tokens: int) -> None:
        return None

    def prefill_done(self, instance: str, tokens: int, elapsed_s: float = 0.0) -> None:
        return None

    def note_routed(self, session: str, instance: str) -> None:
        return None


class ProxyReplica:
    def __init__(
        self,
        *,
        clock: Clock,
        lease_ids: Callable[[], str],
        ticket_ids: Callable[[], str],
        config: ReplicaConfig | None = None,
        sink: EventSink | None = None,
    ) -> None:
        self.clock = clock
        self.config = config or ReplicaConfig()
        self.sink = sink
        self.lane = ReplicaShares(now=clock.now, lease_ids=lease_ids)
        self.sessions = NoSessions()
        self._ticket_ids = ticket_ids
        self._models: dict[str, list[Backend]] = {}
        self._waiting: dict[str, tuple[int, int, TicketStatus, str]] = {}
        """ticket -> (-priority, arrival seq, status, prefer)."""
        self._arrivals = itertools.count()
        self._tickets: OrderedDict[str, TicketStatus] = OrderedDict()
        self._renew = False
        self.granted = 0
        self.waited = 0
        self.shed = 0

    # ------------------------------------------------------------------ the leader's answers
    def share_report(self) -> tuple[int, dict[str, ShareReport]]:
        self._renew = False
        return self.lane.report()

    def share_answer(
        self,
        seq: int,
        ttl_s: float,
        backends: Mapping[str, Backend],
        grants: Mapping[str, ShareGrant],
        paused: frozenset[str] = frozenset(),
    ) -> bool:
        """Apply the leader's answer to call ``seq`` (see `ReplicaShares.apply`), then pump."""
        if seq != self.lane.seq:
            return False
        self.lane.set_backends(backends)
        self._models = {}
        for b in sorted(backends.values(), key=lambda x: x.id):
            self._models.setdefault(b.model, []).append(b)
        ok = self.lane.apply(seq, ttl_s, grants, paused)
        self.pump()
        return ok

    def renewal_wanted(self) -> bool:
        """True when demand found no room since the last share call (renew now, not on the timer)."""
        return self._renew

    # ------------------------------------------------------------------ the proxy's calls
    def models(self) -> dict[str, list[Backend]]:
        return self._models

    def kv_capacity_mib(self, backend: Backend) -> int:
        """The most KV cache one request may take on ``backend`` here: its whole budget (`acquire`)."""
        return backend.kv_budget_mib

    def backend_of(self, lease: Lease) -> Backend | None:
        sid = lease.grants[0].slice_id if lease.grants else ""
        return self.lane.backends().get(sid[len(KV_PREFIX) :]) if sid.startswith(KV_PREFIX) else None

    def kv_load(self, slice_id: str) -> tuple[int, int]:
        """(MiB in use, MiB of this replica's share) of one KV slice."""
        return self.lane.load(slice_id)

    def session_begin(self, session: str, lease: Lease) -> None:
        return None  # (`NoSessions`)

    def session_end(self, session: str, slice_id: str, prefix_mib: int) -> None:
        return None  # (`NoSessions`)

    def acquire(
        self,
        request: Request,
        *,
        wait_s: float | None = None,
        gpu_id: str = "",
        prefer: str = "",
        session: str = "",
        holder: str = "",
        patience_s: float = 0.0,
    ) -> Outcome:
        """``session``, ``holder`` and ``patience_s`` are accepted and not used here (`NoSessions`)."""
        validate_request(request)
        self.lane.expire_due()
        backends = self._models.get(request.model)
        if not backends:
            return Outcome(OutcomeCode.UNRESOLVABLE, reason=f"no backend serves model {request.model!r}")
        need = request.demand.vram_mib
        if all(b.kv_budget_mib < need for b in backends):
            most = max(b.kv_budget_mib for b in backends)
            why = f"needs {need} MiB of KV cache; the largest budget of model {request.model!r} is {most} MiB"
            return Outcome(OutcomeCode.UNRESOLVABLE, reason=why)
        first = not self._waiting or all(-w[0] < request.priority for w in self._waiting.values())
        lease = self.lane.grant(request, prefer) if first else None  # (nobody of its band waits first)
        if lease is not None:
            self.granted += 1
            return Outcome(OutcomeCode.GRANTED, lease=lease)
        self.lane.refused(request.model, request.demand.vram_mib)
        self._renew = True
        now = self.clock.now()
        wait = self.config.max_wait_s if wait_s is None else min(wait_s, self.config.max_wait_s)
        st = TicketStatus(self._ticket_ids(), "queued", request, now, now + wait, kv=True)
        self._waiting[st.ticket] = (-request.priority, next(self._arrivals), st, prefer)
        self._remember(st)
        self.waited += 1
        self.pump()  # (it may fit now: it only waited behind earlier requests)
        return Outcome(
            OutcomeCode.QUEUED,
            ticket=st.ticket,
            reason="waiting for room in this replica's kv share",
            retry_after_s=self.config.retry_after_s,
        )

    def release(self, lease_id: str, *, tenant: str | None = None, reason: str = "") -> Outcome:
        lease = self.lane.get(lease_id)
        if lease is None or (tenant is not None and lease.request.tenant != tenant):
            raise UnknownId("lease", lease_id)
        if lease.state.ended:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        ended = self.lane.end(lease_id, LeaseState.RELEASED, reason or "released")
        if self._waiting:
            self.pump()
        return Outcome(OutcomeCode.RELEASED, lease=ended)

    def ticket(self, ticket: str, *, tenant: str | None = None) -> TicketStatus:
        st = self._tickets.get(ticket)
        if st is None or (tenant is not None and st.request.tenant != tenant):
            raise UnknownId("ticket", ticket)
        return st

    def cancel(self, ticket: str, *, tenant: str | None = None) -> TicketStatus:
        st = self.ticket(ticket, tenant=tenant)
        if self._waiting.pop(ticket, None) is not None:
            st = self._end(st, "cancelled", "cancelled by the client")
        return st

    def tick(self) -> None:
        """Expire request leases, lapse shares, shed waits past their deadline, pump."""
        self.lane.expire_due()
        now = self.clock.now()
        for t, (_, _, st, _) in list(self._waiting.items()):
            if st.deadline_at <= now:
                del self._waiting[t]
                self.shed += 1
                self._end(st, "shed", "no room in this replica's kv share before the deadline")
        self.pump()

    def pump(self) -> None:
        """Grant waiting requests that fit now: highest priority first, then arrival order; a
        request that does not fit does not stop a smaller one behind it of the same model."""
        if not self._waiting:
            return
        for t, (_, _, st, prefer) in sorted(self._waiting.items(), key=lambda kv: kv[1][:2]):
            lease = self.lane.grant(st.request, prefer)
            if lease is not None:
                del self._waiting[t]
                self.granted += 1
                self._end(st, "granted", "", lease=lease)

    def waiting(self) -> int:
        return len(self._waiting)

    def check_invariants(self) -> None:
        self.lane.check()

    # ------------------------------------------------------------------ internals
    def _end(self, st: TicketStatus, state: str, reason: str, lease: Lease | None = None) -> TicketStatus:
        now = self.clock.now()
        done = TicketStatus(
            st.ticket, state, st.request, st.enqueued_at, st.deadline_at, lease, reason, kv=True, ended_at=now
        )
        self._remember(done)
        if self.sink is not None:
            self.sink(
                GatewayEvent(kind=state, at=now, ticket=st.ticket, tenant=st.request.tenant, lease=lease)
            )
        return done

    def _remember(self, st: TicketStatus) -> None:
        self._tickets[st.ticket] = st
        self._tickets.move_to_end(st.ticket)
        if len(self._tickets) > TICKET_MEMORY:
            self._tickets.popitem(last=False)
