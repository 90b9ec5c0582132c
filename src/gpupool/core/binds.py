"""`PlacementBinds`: placement leases keyed by a holder's own id (a Kubernetes pod UID), granted by
compare-and-set on the one ledger, and the per-node card index over it.

Role: a mixin of `LeaseController` only, like `GpuAdmin`: it owns none of the state it touches (the
controller's ``__init__`` creates every attribute declared below). It is what kube-scheduler's
extender commits through, so a pod, a model instance and a batch job are granted by the same
allocator, written to the same `LeaseStore` and recovered by the same `recover`.

Binds: ``bind(key, request, node)`` is one compare-and-set on the key, evaluated atomically by the
controller's single owner: when the key already holds an active lease on ``node`` the answer is that
lease (idempotent: a retried bind grants nothing); otherwise the request is granted on the node's
best card, and only once that grant succeeded is a lease the key held on another node released (the
holder was re-bound: a re-bind that finds no room leaves the first lease in place). The grant is
validated on the current books (`Allocator.allocate` scoped to the node, never preempting: kube-scheduler and
the preemptor own eviction). A bound lease carries the label ``("bind", key)``; the key -> lease map
is derived from the allocator's events (granted, restored, ended), and every read checks the lease is
still active there, so a store undo that rewinds the allocator can never leave a key pointing at a
lease the ledger does not hold (`_rebuild_binds` re-derives the map after an undo).

Tenancy: a bound lease belongs to the orchestrator that bound it (its pod reconciler releases it when
the pod ends): the lease API shows it to admins only, so a tenant whose name equals a namespace can
neither see nor release a running pod's lease (`_tenant_sees`).

Invariants: a key maps to at most one active lease; a bound lease is written to the store like any
other (granted, renewed, released, expired: the controller's `_on_lease`), so after a restart the
store, not an annotation, brings it back (`recover` restores it and the "restored" event re-keys it);
`adopt_bound` exists for reconciliation only, when the store lost a lease an annotation still names.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.core.admission import AdmissionQueue
from gpupool.core.allocator import Allocator, LeaseEvent
from gpupool.core.cardindex import CardIndex
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.model import Lease, Request
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.ports import LeaseStore
from gpupool.hardware.slices import Slice

BIND_LABEL = "bind"


def bind_key(lease: Lease) -> str | None:
    """The holder key of a bound lease, or None for any other lease."""
    for k, v in lease.request.labels:
        if k == BIND_LABEL:
            return v
    return None


def _keyed(request: Request, key: str, node: str) -> Request:
    labels = (*((k, v) for k, v in request.labels if k != BIND_LABEL), (BIND_LABEL, key))
    return replace(request, labels=labels, nodes=frozenset({node}))


class PlacementBinds:
    allocator: Allocator
    store: LeaseStore
    queue: AdmissionQueue
    _bound: dict[str, str]
    _cards: CardIndex | None
    _gpus: set[str]
    _freed: bool

    def _finish(self, out: Outcome | None) -> Outcome:  # the controller's
        raise NotImplementedError

    def _count(self, request: Request, out: Outcome) -> Outcome:  # the controller's
        raise NotImplementedError

    def _write(self, lease: Lease, expected: int | None, previous: Lease | None = None) -> None:
        raise NotImplementedError  # the controller's

    @property
    def cards(self) -> CardIndex:
        """The per-node card index over the placement ledger (built on first use, then kept current
        by the ledger's change notices: a controller that never answers the extender pays nothing)."""
        if self._cards is None:
            self._cards = CardIndex(self.allocator)
        return self._cards

    @property
    def cards_generation(self) -> int | None:
        """The card index's generation, None before its first use: one attribute read, so another
        thread may read it without the owner to tell whether costs it cached are still current."""
        return None if self._cards is None else self._cards.generation

    # ------------------------------------------------------------------ queries
    def bound(self, key: str) -> Lease | None:
        lid = self._bound.get(key)
        return None if lid is None else self.allocator.leases.active(lid)

    def bound_keys(self) -> list[str]:
        return sorted(k for k in self._bound if self.bound(k) is not None)

    # ------------------------------------------------------------------ changes
    def bind(self, key: str, request: Request, node: str) -> Outcome:
        """Compare-and-set ``key`` -> a lease of ``request`` on ``node`` (see the module docstring)."""
        if not key:
            raise InvalidInput("key", key, "must be a non-empty string")
        held = self.bound(key)
        if held is not None and held.node == node:
            return Outcome(OutcomeCode.GRANTED, lease=held, reason="already bound")
        if not self.allocator.ledger.on_node(node):
            return self._finish(Outcome(OutcomeCode.UNRESOLVABLE, reason=f"node {node} has no gpupool GPUs"))
        req = _keyed(request, key, node)
        out = self.allocator.allocate(req, preempt=False)
        if out.granted:
            self.queue.record_grant(req.priority)
            if held is not None:
                self.allocator.release(held.id, reason=f"re-bound to {node}")
        return self._finish(self._count(req, out))

    def unbind(self, key: str, *, reason: str, lease_id: str | None = None) -> Lease | None:
        """End the key's lease (idempotent); with ``lease_id`` only that lease. Returns the ended lease."""
        held = self.bound(key)
        if held is None or (lease_id is not None and held.id != lease_id):
            return None
        out = self.allocator.release(held.id, reason=reason)
        self._finish(None)
        return out.lease if out.code is OutcomeCode.RELEASED else None

    def renew_bound(self, key: str) -> bool:
        held = self.bound(key)
        if held is None:
            return False
        ok = self.allocator.renew(held.id).code is OutcomeCode.RENEWED
        self._finish(None)
        return ok

    def adopt_bound(self, key: str, lease: Lease) -> Lease:
        """Reconciliation: put back an active lease the store lost but its holder still names (a pod
        annotation), written to the store. `InvalidInput` when the key holds another lease or the
        lease no longer fits the ledger."""
        held = self.bound(key)
        if held is not None:
            if held.id == lease.id:
                return held
            raise InvalidInput("lease.id", lease.id, f"{key} already holds lease {held.id}")
        stored = self.store.get(lease.id)
        if stored is not None and not stored.state.ended:
            raise InvalidInput("lease.id", lease.id, "is active in the store but not in the ledger")
        keyed = replace(
            lease,
            request=_keyed(lease.request, key, lease.node),
            revision=1 if stored is None else stored.revision + 1,
        )
        try:
            self.allocator.restore(keyed)
        except UnknownId as exc:
            raise InvalidInput("lease.grants", lease.id, str(exc)) from None
        self._write(keyed, None if stored is None else stored.revision)
        self._finish(None)
        return keyed

    def add_slice(self, s: Slice) -> None:
        """A new slice in the placement ledger (an inventory the extender reads from node annotations)."""
        self.allocator.add_slice(s)
        self._gpus.add(s.gpu_id)
        self._freed = True
        self._finish(None)

    def remove_slice(self, slice_id: str) -> Slice:
        """Take a slice out; `InvalidInput` while leases hold it (drain or revoke first)."""
        s = self.allocator.remove_slice(slice_id)
        self._gpus = set(self.allocator.ledger.gpu_ids())
        self._finish(None)
        return s

    def expire_leases(self) -> None:
        """End placement leases past their expiry now (the gateway's `tick` does this too)."""
        self.allocator.expire_due()
        self._finish(None)

    # ------------------------------------------------------------------ upkeep
    @staticmethod
    def _tenant_sees(lease: Lease, tenant: str | None) -> bool:
        """Whether the lease API shows ``lease`` to ``tenant`` (None: an admin sees every lease)."""
        return tenant is None or (lease.request.tenant == tenant and bind_key(lease) is None)

    def _note_bind(self, ev: LeaseEvent) -> None:
        """Keep the key map: called by the controller for every placement lease event."""
        key = bind_key(ev.lease)
        if key is None:
            return
        if ev.lease.state.ended:
            if self._bound.get(key) == ev.lease.id:
                del self._bound[key]
        else:
            self._bound[key] = ev.lease.id

    def _rebuild_binds(self) -> None:
        """Re-derive the key map from the active leases (after an undo rewound the allocator)."""
        self._bound = {}
        for lease in self.allocator.leases:
            key = bind_key(lease)
            if key is not None:
                self._bound[key] = lease.id
