"""`ExtenderPool`: kube-scheduler's questions translated onto the one `LeaseController`. No I/O.

Role: protocol translation only. The ledger, the per-node card index (`gpupool.core.cardindex`) and
the bind compare-and-set keyed by pod UID (`gpupool.core.binds`) are the core's; this class turns a
`PodDemand` into a core `Request`, runs each call through an `Owner` (the controller is
single-threaded: `gpupool.adapters.k8s.owner`), and keeps two small caches of the protocol's own:
the demand seen in filter (bind only gets the pod's name), and filter's costs per (pod UID, index
generation), so prioritize for the same pod and state is a lookup.

Scores (`prioritize`): per node, the core policy's cost of its best card (N-GPU pods: the free whole
cards left after placement, fewer is better), mapped onto 1..10 by min-max over the fitting nodes
(the best node gets 10; all equal -> 10); nodes that do not fit score 0.

Preempt: the core planner's minimal plan per node; a plan is returned only when every victim is a
bound pod (kube-scheduler can evict pods only: leases of the lease API are preempted by the
gateway's own admission).

Invariants: the pool holds no lease state: every lease, pod or not, is the controller's, written to
its store; a pod UID maps to at most one active lease (the core's bind map).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpupool.adapters.k8s.annotations import Placement
from gpupool.adapters.k8s.owner import LockOwner, Owner
from gpupool.adapters.k8s.resources import DEFAULT_TTL_S, PodDemand
from gpupool.core.allocator import Allocator
from gpupool.core.binds import bind_key
from gpupool.core.controller import LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Lease
from gpupool.core.outcome import Outcome
from gpupool.hardware.slices import Slice


@dataclass(frozen=True, slots=True)
class FilterVerdict:
    passed: tuple[str, ...]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


def _same_shape(a: Slice, b: Slice) -> bool:
    return (a.node, a.gpu_id, a.kind, a.capacity, a.gpu_index, a.uuid, a.profile) == (
        b.node,
        b.gpu_id,
        b.kind,
        b.capacity,
        b.gpu_index,
        b.uuid,
        b.profile,
    )


class ExtenderPool:
    def __init__(
        self,
        controller: LeaseController,
        *,
        owner: Owner | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        cache_size: int = 4096,
    ) -> None:
        self.controller = controller
        self.owner: Owner = owner if owner is not None else LockOwner(controller)
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, PodDemand] = OrderedDict()
        self._costs: OrderedDict[tuple[str, int], dict[str, int]] = OrderedDict()
        self._cache_size = cache_size

    @property
    def allocator(self) -> Allocator:
        """The controller's placement allocator (read it through the owner while serving)."""
        return self.controller.allocator

    @property
    def generation(self) -> int:
        return self.owner.read(lambda: self.controller.cards.generation)

    # ------------------------------------------------------------------ inventory
    def add_slice(self, s: Slice) -> None:
        self.owner.write(lambda: self.controller.add_slice(s))

    def remove_slice(self, slice_id: str) -> Slice:
        """Take a slice out of the pool; `InvalidInput` while leases hold it (drain first)."""
        return self.owner.write(lambda: self.controller.remove_slice(slice_id))

    def set_healthy(self, slice_id: str, healthy: bool) -> None:
        self.owner.write(lambda: self.controller.mark_slice(slice_id, healthy=healthy))

    def sync_slices(self, slices: Iterable[Slice], *, nodes: Iterable[str]) -> dict[str, list[str]]:
        """Make the pool's slices on ``nodes`` equal ``slices`` as far as leases allow.

        New slices are added, changed or vanished ones without leases are replaced or removed,
        health follows the new value; a changed or vanished slice that still holds leases is kept
        (marked unhealthy when it vanished) and reported under ``"blocked"``.
        """
        want = {s.id: s for s in slices}
        scope = set(nodes)
        c = self.controller

        def sync() -> dict[str, list[str]]:
            report: dict[str, list[str]] = {"added": [], "removed": [], "health": [], "blocked": []}
            led = c.allocator.ledger
            for node in sorted(scope & set(led.nodes())):
                for sid in list(led.on_node(node)):
                    new = want.get(sid)
                    old = led.slice(sid)
                    if new is not None and _same_shape(old, new):
                        if led.is_healthy(sid) != new.healthy:
                            c.mark_slice(sid, healthy=new.healthy)
                            report["health"].append(sid)
                        continue
                    if led.state(sid).num_leases:
                        report["blocked"].append(sid)
                        if new is None and led.is_healthy(sid):
                            c.mark_slice(sid, healthy=False)
                        continue
                    c.remove_slice(sid)
                    report["removed"].append(sid)
            for sid, s in want.items():
                if sid not in led and s.node in scope:
                    c.add_slice(s)
                    report["added"].append(sid)
            return report

        return self.owner.write(sync)

    def nodes(self) -> list[str]:
        return self.owner.read(self.controller.cards.nodes)

    def slices_of(self, lease: Lease) -> dict[str, Slice]:
        led = self.controller.allocator.ledger
        return self.owner.read(lambda: {g.slice_id: led.slice(g.slice_id) for g in lease.grants})

    def slices(self) -> dict[str, Slice]:
        led = self.controller.allocator.ledger
        return self.owner.read(lambda: {sid: led.slice(sid) for sid in led.slice_ids()})

    # ------------------------------------------------------------------ pods
    def remember(self, demand: PodDemand) -> None:
        """Keep the demand seen in filter so bind (which only gets the pod's name) can use it."""
        with self._lock:
            self._pods[demand.uid] = demand
            self._pods.move_to_end(demand.uid)
            while len(self._pods) > self._cache_size:
                self._pods.popitem(last=False)

    def demand_of(self, uid: str) -> PodDemand | None:
        with self._lock:
            return self._pods.get(uid)

    def lease_of(self, uid: str) -> Lease | None:
        return self.owner.read(lambda: self.controller.bound(uid))

    def home_of(self, uid: str) -> str | None:
        """The node of the pod's active bound lease, None if it holds none. Read without the owner
        (two dictionary lookups, atomic under the interpreter lock): a hint for filter and
        prioritize that may be a moment old, never used to grant (bind re-checks on the owner)."""
        held = self.controller.bound(uid)
        return None if held is None else held.node

    def pod_uids(self) -> list[str]:
        return self.owner.read(self.controller.bound_keys)

    def rivals(self, node: str, gpu_count: int, *, exclude: str) -> list[tuple[str, str]]:
        """``(pod UID, namespace/name)`` of the other pods holding a lease of ``gpu_count`` cards on
        ``node``, oldest grant first: those the device plugin could confuse (`bindguard`)."""
        c = self.controller

        def query() -> list[tuple[str, str]]:
            found = []
            for uid in c.bound_keys():
                lease = c.bound(uid)
                if lease is None or uid == exclude or lease.node != node:
                    continue
                if lease.request.gpu_count == gpu_count:
                    key = dict(lease.request.labels).get("pod", "")
                    found.append((lease.granted_at, uid, key))
            return [(uid, key) for _, uid, key in sorted(found)]

        return self.owner.read(query)

    # ------------------------------------------------------------------ filter / prioritize
    def filter(self, demand: PodDemand, nodes: Iterable[str]) -> FilterVerdict:
        """Per node: pass, fail (resolvable) or fail unresolvably, with a reason. Read-only."""
        request, nodes = demand.to_request(), list(nodes)
        c = self.controller

        def query() -> tuple[int, FilterVerdict, dict[str, int]]:
            c.expire_leases()
            v = c.cards.filter(request, nodes)
            return c.cards.generation, FilterVerdict(v.passed, v.failed, v.unresolvable), v.costs

        generation, verdict, costs = self.owner.read(query)
        with self._lock:
            self._costs[(demand.uid, generation)] = costs
            while len(self._costs) > 64:
                self._costs.popitem(last=False)
        return verdict

    def prioritize(self, demand: PodDemand, nodes: Iterable[str]) -> list[tuple[str, int]]:
        """``(node, score 0..10)`` in input order; see the module docstring for the mapping."""
        nodes = list(nodes)
        c = self.controller

        def costs() -> dict[str, int]:
            c.expire_leases()
            return c.cards.filter(demand.to_request(), nodes).costs

        # the usual case, filter's costs at the current generation, needs no trip to the owner: the
        # generation grows with every change, so equal means these costs are those of the state now
        generation = c.cards_generation
        with self._lock:
            cached = None if generation is None else self._costs.get((demand.uid, generation))
        if cached is None or any(n not in cached for n in nodes):
            cached = self.owner.read(costs)
        fitting = [cached[n] for n in nodes if n in cached]
        lo, hi = (min(fitting), max(fitting)) if fitting else (0, 0)
        out = []
        for n in nodes:
            cost = cached.get(n)
            if cost is None:
                out.append((n, 0))
            elif hi == lo:
                out.append((n, 10))
            else:
                out.append((n, 1 + (9 * (hi - cost)) // (hi - lo)))
        return out

    # ------------------------------------------------------------------ preempt
    def preempt(self, demand: PodDemand, nodes: Iterable[str]) -> dict[str, list[str]]:
        """Minimal victim pod UIDs per node (core planner); nodes needing none or with no plan are omitted."""
        request, nodes = demand.to_request(), list(nodes)

        def plans() -> dict[str, list[str]]:
            out = {}
            for node, plan in self.controller.cards.plans(request, nodes).items():
                keys = [bind_key(v) for v in plan.victims]
                if all(keys):
                    out[node] = [k for k in keys if k]
            return out

        return self.owner.read(plans)

    # ------------------------------------------------------------------ bind / release / adopt
    def reserve(self, demand: PodDemand, node: str) -> Outcome:
        """Commit a lease for the pod on ``node`` (best card there): the core's bind compare-and-set."""
        request = demand.to_request(ttl_s=self.ttl_s)
        return self.owner.write(lambda: self.controller.bind(demand.uid, request, node))

    def release_pod(self, uid: str, *, reason: str, lease_id: str | None = None) -> Lease | None:
        """End the pod's lease (idempotent). Returns the ended lease, or None if it held none.

        With ``lease_id``, only that lease: a pod that meanwhile holds another one keeps it."""
        return self.owner.write(lambda: self.controller.unbind(uid, reason=reason, lease_id=lease_id))

    def renew_pod(self, uid: str) -> bool:
        return self.owner.write(lambda: self.controller.renew_bound(uid))

    def adopt(self, placement: Placement) -> Lease:
        """Reconciliation: re-insert a lease the store lacks, read back from a pod annotation.
        Raises `InvalidInput` on drift."""
        c = self.controller

        def adopt() -> Lease:
            held = c.bound(placement.pod_uid)
            if held is not None and held.id == placement.lease_id:
                return held
            if held is not None:
                why = f"pod already holds lease {held.id}"
                raise InvalidInput("placement.lease", placement.lease_id, why)
            led = c.allocator.ledger
            for g in placement.grants:
                if g.slice_id not in led:
                    raise InvalidInput("placement.grants.slice", g.slice_id, "no such slice in the pool")
                if led.slice(g.slice_id).node != placement.node:
                    raise InvalidInput("placement.node", placement.node, f"slice {g.slice_id} is elsewhere")
            lease = placement.to_lease(granted_at=c.clock.now(), ttl_s=self.ttl_s)
            return c.adopt_bound(placement.pod_uid, lease)

        return self.owner.write(adopt)

    def check(self) -> None:
        """The controller's invariants, with the card index's (rows and memo equal the ledger)."""

        def check() -> None:
            self.controller.check_invariants()
            self.controller.cards.check()

        self.owner.read(check)
