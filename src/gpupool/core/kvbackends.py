"""`KvBackends`: the request-lease half of `LeaseController`: model instances (backends) and their
KV-cache budgets, and the request leases granted on them, by the KV lane (`gpupool.core.kvlane`, O(1)
inside share leases) or by the KV allocator (scoped or preemptible requests, queued ones).

Role: a mixin of `LeaseController` only, like `GpuAdmin`: it owns none of the state it touches (the
controller's ``__init__`` creates every attribute declared below). Invariants are the controller's and
the lane's: a backend's budget is one KV slice ``kv/<backend id>`` in the KV allocator; the lane's
shares never show as request leases; a lane lease that ends frees its room for the queue first
(``give_back`` when anything is queued), and every end counts in ``_ends`` so pump passes rerun.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.admission import AdmissionQueue
from gpupool.core.allocator import Allocator, LeaseEvent
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.kvlane import KvLane
from gpupool.core.model import Lease, LeaseState
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.ports import Backend
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

KV_PREFIX = "kv/"
REPLICA_SHARE_TENANT = "gpupool-kv-replica"
"""Tenant of the KV shares delegated to proxy replicas (`gpupool.core.kvshares`)."""


class KvBackends:
    kv: Allocator
    lane: KvLane
    queue: AdmissionQueue
    backends: dict[str, Backend]
    _models: dict[str, list[Backend]]
    _kv_models: dict[str, str]
    _freed: bool
    _ends: int

    def _finish(self, out: Outcome | None) -> Outcome:  # the controller's
        raise NotImplementedError

    def register_backend(self, b: Backend) -> None:
        if b.id in self.backends:
            raise InvalidInput("backend.id", b.id, "already registered")
        if b.kv_budget_mib < 1:
            raise InvalidInput("backend.kv_budget_mib", b.kv_budget_mib, "must be >= 1")
        self.kv.add_slice(
            Slice(
                id=KV_PREFIX + b.id,
                node=b.node,
                gpu_id=b.gpu_id,
                kind=SliceKind.MPS,
                capacity=Resources(b.kv_budget_mib, 1000),
                profile=f"kv:{b.model}",
            )
        )
        self.backends[b.id] = b
        self._kv_models[KV_PREFIX + b.id] = b.model
        self.lane.add_slice(KV_PREFIX + b.id, model=b.model, budget_mib=b.kv_budget_mib)
        self._freed = True
        self._models = {}
        for x in sorted(self.backends.values(), key=lambda x: x.id):
            self._models.setdefault(x.model, []).append(x)

    def models(self) -> dict[str, list[Backend]]:  # read-only view, rebuilt on registration
        return self._models

    def backend_of(self, lease: Lease) -> Backend | None:
        sid = lease.slice_ids[0] if lease.grants else ""
        return self.backends.get(sid[len(KV_PREFIX) :]) if sid.startswith(KV_PREFIX) else None

    def request_leases(self) -> Iterable[Lease]:
        """Active request leases (KV budgets): the lane's and the KV allocator's, without shares
        (the lane's, and those delegated to proxy replicas: `gpupool.core.kvshares`)."""
        yield from self.lane.active()
        for x in self.kv.leases:
            if not self.lane.is_share(x.id) and x.request.tenant != REPLICA_SHARE_TENANT:
                yield x

    def request_lease_count(self) -> int:
        replica_shares = sum(1 for x in self.kv.leases if x.request.tenant == REPLICA_SHARE_TENANT)
        return len(self.lane) + len(self.kv.leases) - self.lane.shares() - replica_shares

    def _on_kv(self, ev: LeaseEvent) -> None:
        if ev.lease.state.ended:
            self._freed = True
            if self.lane.is_share(ev.lease.id):
                self.lane.on_share_ended(ev.lease.id, ev.lease.reason)
            else:
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
