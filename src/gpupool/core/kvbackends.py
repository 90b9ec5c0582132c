"""`KvBackends`: the request-lease half of `LeaseController`: model instances (backends) and their
KV-cache budgets, and the request leases granted on them, by the KV lane (`gpupool.core.kvlane`, O(1)
inside share leases) or by the KV allocator (scoped or preemptible requests, queued ones).

Role: a mixin of `LeaseController` only, like `GpuAdmin`: it owns none of the state it touches (the
controller's ``__init__`` creates every attribute declared below). Invariants are the controller's and
the lane's: a backend's budget is one KV slice ``kv/<backend id>`` in the KV allocator; the lane's
shares never show as request leases; a lane lease that ends frees its room for the queue first
(``give_back`` when anything is queued), and every end counts in ``_ends`` so pump passes rerun.

Sessions' retained prefixes (`gpupool.core.sessions`) are preemptible leases on the same KV slices;
they are not request leases (not listed or counted as such). A KV slice's capacity is the backend's
budget x ``kv_red_line_pct`` (the red line). Admission of a request lease that finds no room: first
the retained prefixes of other sessions on the preferred slice are reclaimed (LRU, through the
preemption planner), then the most free slice is taken, then retained prefixes are reclaimed on the
slice with the most room, and only then does the request queue (`_lane_grant`, `_reclaim_for`; queued
ones reclaim the same way when pumped). A queued turn of a session with a *holder* (the slice holding
its prefix, `SessionTable.holder`) is offered only its holder while ``patience_s`` lasts
(`_holder_grant`: its own retained prefix taken back, other sessions' reclaimed LRU-first), and
holds only that slice meanwhile; its pin is kept for `session_begin` by request id.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpupool.core.admission import AdmissionQueue, Ticketed
from gpupool.core.allocator import Allocator, LeaseEvent
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.kvlane import KvLane
from gpupool.core.model import Lease, LeaseState, Request
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.ports import Backend, GatewayEvent
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

if TYPE_CHECKING:
    from gpupool.core.controller import ControllerConfig
    from gpupool.core.sessions import SessionTable

KV_PREFIX = "kv/"
MAX_BEGUN_QUEUED = 4096
"""Pins made by pump passes kept for their `KvBackends.session_begin` (older ones are dropped)."""
REPLICA_SHARE_TENANT = "gpupool-kv-replica"
"""Tenant of the KV shares delegated to proxy replicas (`gpupool.core.kvshares`)."""


class KvBackends:
    kv: Allocator
    lane: KvLane
    sessions: SessionTable
    config: ControllerConfig
    _begun: str
    _begun_queued: OrderedDict[str, str]
    _granting: Ticketed | None
    _events: list[GatewayEvent]
    queue: AdmissionQueue
    backends: dict[str, Backend]
    _models: dict[str, list[Backend]]
    _kv_models: dict[str, str]
    _freed: bool
    _ends: int
    _unroutable: dict[str, set[str]]

    def _finish(self, out: Outcome | None) -> Outcome:  # the controller's
        raise NotImplementedError

    if TYPE_CHECKING:  # `QueuePump`'s and `GpuAdmin`'s (declared only: other controller bases define them)

        def _patient(self, item: Ticketed) -> bool: ...

        def _gpu_open(self, gpu_id: str) -> bool: ...  # `GpuAdmin`'s

    def register_backend(self, b: Backend) -> None:
        if b.id in self.backends:
            raise InvalidInput("backend.id", b.id, "already registered")
        if b.kv_budget_mib < 1:
            raise InvalidInput("backend.kv_budget_mib", b.kv_budget_mib, "must be >= 1")
        cap = max(1, b.kv_budget_mib * self.config.kv_red_line_pct // 100)
        self.kv.add_slice(
            Slice(
                id=KV_PREFIX + b.id,
                node=b.node,
                gpu_id=b.gpu_id,
                kind=SliceKind.MPS,
                capacity=Resources(cap, 1000),
                profile=f"kv:{b.model}",
            )
        )
        self.backends[b.id] = b
        self._kv_models[KV_PREFIX + b.id] = b.model
        self.lane.add_slice(KV_PREFIX + b.id, model=b.model, budget_mib=cap)
        if not self._gpu_open(b.gpu_id):
            self.kv.mark_unhealthy(KV_PREFIX + b.id)  # its GPU is closed (`GpuAdmin._sync_kv`)
        self._freed = True
        self._models = {}
        for x in sorted(self.backends.values(), key=lambda x: x.id):
            self._models.setdefault(x.model, []).append(x)

    def set_backend_routable(self, backend_id: str, routable: bool, *, reason: str = "asleep") -> None:
        """Take a backend out of routing (no new request lease on it; those it holds run on) or put it
        back (queued requests are pumped) for one ``reason``: ``asleep`` (the tidal standby
        sleeper's switch for a sleeping engine) or ``unplaced`` (its model instance holds no
        placement lease: `gpupool.cli.instances`). It is routable only when no reason holds it out;
        put back on a drained or unhealthy GPU, it takes requests once the GPU is back (`GpuAdmin`)."""
        if backend_id not in self.backends:
            raise UnknownId("backend", backend_id)
        sid = KV_PREFIX + backend_id
        gpu = self.backends[backend_id].gpu_id
        if routable:
            held = self._unroutable.get(sid, set()) - {reason}
            if held:
                self._unroutable[sid] = held
            else:
                self._unroutable.pop(sid, None)
            if not held and self._gpu_open(gpu):
                self.kv.mark_healthy(sid)
                self._freed = True
        else:
            self._unroutable.setdefault(sid, set()).add(reason)
            self.kv.mark_unhealthy(sid)
        self._finish(None)

    def unroutable_reasons(self, backend_id: str) -> frozenset[str]:
        """Why the backend is out of routing (`set_backend_routable`); empty: routable (its GPU open)."""
        return frozenset(self._unroutable.get(KV_PREFIX + backend_id, ()))

    def models(self) -> dict[str, list[Backend]]:  # read-only view, rebuilt on registration
        return self._models

    def kv_capacity_mib(self, backend: Backend) -> int:
        """The most KV cache one request may take on ``backend``: its budget x the red line."""
        return self.kv.ledger.slice(KV_PREFIX + backend.id).capacity.vram_mib

    def backend_of(self, lease: Lease) -> Backend | None:
        sid = lease.grants[0].slice_id if lease.grants else ""
        return self.backends.get(sid[len(KV_PREFIX) :]) if sid.startswith(KV_PREFIX) else None

    def request_leases(self) -> Iterable[Lease]:
        """Active request leases (KV budgets): the lane's and the KV allocator's, without shares
        (the lane's, and those delegated to proxy replicas: `gpupool.core.kvshares`)."""
        yield from self.lane.active()
        for x in self.kv.leases:
            if (
                not self.lane.is_share(x.id)
                and not self.sessions.owns(x.id)
                and x.request.tenant != REPLICA_SHARE_TENANT
            ):
                yield x

    def request_lease_count(self) -> int:
        replica_shares = sum(1 for x in self.kv.leases if x.request.tenant == REPLICA_SHARE_TENANT)
        return (
            len(self.lane)
            + len(self.kv.leases)
            - self.lane.shares()
            - self.sessions.leases()
            - replica_shares
        )

    # ------------------------------------------------------------------ sessions and the red line
    def kv_load(self, slice_id: str) -> tuple[int, int]:
        """(MiB held by request leases, capacity MiB = the red line) of one KV slice; retained
        prefixes are not counted (they are reclaimed for requests). (0, 0) if unknown."""
        if slice_id not in self._kv_models:
            return (0, 0)
        st = self.kv.ledger.state(slice_id)
        share, used, _ = self.lane.usage(slice_id)
        cap = st.slice.capacity.vram_mib
        retained = self.sessions.usage(slice_id)[0]
        return (cap - st.free.vram_mib - share + used - retained, cap)

    def _room(self, slice_id: str) -> tuple[int, int]:
        """(MiB a lane grant could take now, unused MiB of the slice's lane share)."""
        share, used, _ = self.lane.usage(slice_id)
        return share - used + self.kv.ledger.free(slice_id).vram_mib, share - used

    def _lane_grant(self, request: Request, held: frozenset[str], prefer: str, session: str) -> Lease | None:
        """A lane lease: on ``prefer`` after reclaiming other sessions' prefixes there if that makes
        room (the session's own prefix there is taken back by its turn), else on the most free
        slice, else on a slice where reclaiming makes room."""
        need = request.demand.vram_mib
        if prefer and prefer not in held and self.kv.ledger.is_healthy(prefer):
            room, spare = self._room(prefer)
            if room < need:
                own = self.sessions.residency(session, prefer) if session else None
                mine = own.gpu_mib if own is not None and own.lease_id else 0
                if room + mine + self.sessions.reclaimable_mib(prefer, keep=session) >= need:
                    self.sessions.begin(session, prefer)
                    self._begun = prefer
                    self.sessions.reclaim(prefer, need - spare, keep=session)
        lease = self.lane.grant(request, held, prefer)
        if self._begun and (lease is None or lease.grants[0].slice_id != prefer):
            self._begun = ""  # cannot happen (the room was counted first); undo the pin all the same
            r = self.sessions.residency(session, prefer)
            self.sessions.end(session, prefer, r.gpu_mib if r is not None else 0)
        if lease is None and self._reclaim_for(request, held, session):
            lease = self.lane.grant(request, held)
        return lease

    def _reclaim_for(self, request: Request, avoid: frozenset[str], session: str = "") -> bool:
        """Make room for ``request`` on one of its model's KV slices outside ``avoid`` by reclaiming
        retained prefixes (the slice with the most room already, fewest reclaims); True when a
        slice has room (now or after), False (nothing ended) when none could."""
        need = request.demand.vram_mib
        best: tuple[int, str] | None = None
        for sid, model in self._kv_models.items():
            if model != request.model or sid in avoid or not self.kv.ledger.is_healthy(sid):
                continue
            room, _ = self._room(sid)
            if room >= need:
                return True
            if room + self.sessions.reclaimable_mib(sid, keep=session) >= need and (
                best is None or (room, sid) > best
            ):
                best = (room, sid)
        if best is None:
            return False
        return self.sessions.reclaim(best[1], need - self._room(best[1])[1], keep=session)

    def _holder_grant(self, item: Ticketed, avoid: frozenset[str]) -> Lease | None:
        """A queued request on its session's holder (``item.holder``), when it fits there after
        reclaiming other sessions' retained prefixes (LRU, through the preemption planner) and
        taking back its own; None, ending nothing, when it does not fit or an earlier queued
        request holds that slice (``avoid``)."""
        h, session, request = item.holder, item.session, item.request
        if h in avoid or not self.kv.ledger.is_healthy(h):
            return None
        need = request.demand.vram_mib
        free = self.kv.ledger.free(h).vram_mib
        own = self.sessions.residency(session, h)
        mine = own.gpu_mib if own is not None and own.lease_id else 0
        if free + mine + self.sessions.reclaimable_mib(h, keep=session) < need:
            return None
        self.sessions.begin(session, h)
        self.sessions.reclaim(h, need, keep=session)
        out = self.kv.place(request, (h,))
        if out.granted and out.lease is not None:
            self._begun_queued[request.id] = h
            while len(self._begun_queued) > MAX_BEGUN_QUEUED:
                self._begun_queued.popitem(last=False)
            return out.lease
        r = self.sessions.residency(session, h)  # cannot happen (the room was counted first): undo the pin
        self.sessions.end(session, h, r.gpu_mib if r is not None else 0)
        return None

    def session_begin(self, session: str, lease: Lease) -> None:
        """``session``'s turn holds ``lease`` (a request lease on a KV slice): pin the session there
        (counting the lease's MiB as its prefix on the GPU while it runs), unless the admission
        that granted it already did (it reclaimed on that slice)."""
        sid = lease.grants[0].slice_id if lease.grants else ""
        begun, self._begun = self._begun, ""
        queued = self._begun_queued.pop(lease.request.id, "")
        if not session or not sid:
            return
        if sid not in (begun, queued):
            self.sessions.begin(session, sid, lease.total.vram_mib)
        else:
            r = self.sessions.residency(session, sid)
            if r is not None:
                r.gpu_mib = max(r.gpu_mib, lease.total.vram_mib)

    def session_end(self, session: str, slice_id: str, prefix_mib: int) -> None:
        """``session``'s turn on ``slice_id`` ended (its request lease released first): the slice now
        retains ``prefix_mib`` of its prefix, as a preemptible lease (`SessionTable.end`)."""
        self.sessions.end(session, slice_id, prefix_mib, make_room=self.lane.yield_all)

    def _on_kv(self, ev: LeaseEvent) -> None:
        item = self._granting
        if ev.kind == "granted" and item is not None and item.kv and ev.lease.request.id == item.request.id:
            # request leases have no events of their own, but a queued request's waiter needs its grant
            self._events.append(
                GatewayEvent(
                    kind="granted",
                    at=ev.at,
                    lease=ev.lease,
                    ticket=item.ticket,
                    tenant=ev.lease.request.tenant,
                    wait_s=ev.at - item.enqueued_at,
                )
            )
        if ev.lease.state.ended:
            self._freed = True
            if self.lane.is_share(ev.lease.id):
                self.lane.on_share_ended(ev.lease.id, ev.lease.reason)
            else:
                if self.sessions.owns(ev.lease.id):
                    self.sessions.on_ended(ev.lease)
                self._ends += 1

    def _lane_expire(self) -> None:
        n = self.lane.expire_due()
        if n:
            self._ends += n
            self._freed = True
            if len(self.queue):
                self.lane.yield_all()  # what they held goes to the queue, not back into a share

    def _lane_lease(self, lease_id: str, tenant: str | None) -> Lease | None:
        """The lane's lease (active or recently ended) of this id; another tenant's is unknown."""
        lease = self.lane.get(lease_id)
        if lease is not None and tenant is not None and lease.request.tenant != tenant:
            raise UnknownId("lease", lease_id)
        return lease

    def _end_lane(self, lease: Lease, state: LeaseState, reason: str) -> Outcome:
        if lease.state.ended:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        ended = self.lane.end(lease.id, state, reason, give_back=bool(len(self.queue)))
        self._freed = True
        self._ends += 1
        return self._finish(Outcome(OutcomeCode.RELEASED, lease=ended))
