"""`ExtenderPool`: the extender's view of one `Allocator`, with a per-node card index. No I/O.

Role: answer kube-scheduler's filter / prioritize / preempt questions for one pod over many nodes
in one read-only pass, and commit (bind) or release placement leases by pod UID.

Per-node index: for every node a tuple of rows, one per healthy slice (see `_Row`; a "card" below is
the core's slice: a whole GPU, a MIG instance or an MPS share), plus its unhealthy shapes. The
allocator's event sink marks a node dirty whenever a lease on it changes; rows are rebuilt lazily
for dirty nodes only, so filter over 1,000 nodes never calls the allocator per node.

Verdicts (`filter`): a node passes when one card has both dimensions free now (N-GPU pods: N free
whole cards); it fails *unresolvably* when no healthy card of an accepted kind could ever hold the
request, or when even evicting every preemptible lease could not make room (preemption cannot help);
otherwise it fails resolvably. The preemption part is a bound (it counts all preemptible grants);
`preempt` is exact, through the core's preemption planner.

Scores (`prioritize`): per node, the core policy's cost of its best card (N-GPU pods: the free whole
cards left after placement, fewer is better), mapped onto 1..10 by min-max over the fitting nodes
(the best node gets 10; all equal -> 10); nodes that do not fit score 0. For a ``monotone`` policy
only the Pareto-tight rows of each shape are costed: a row with at least as much VRAM and compute
free as an earlier fitting row of its shape can never cost less. Filter caches the costs it computed
per (pod UID, pool generation), so prioritize for the same pod and state is a lookup.

Shape memo: verdicts are also kept per demand shape (VRAM, compute, cards, kinds, may-preempt) and
node, for the last `MEMO_SHAPES` shapes; rebuilding a node's rows drops its entries, so a verdict is
always the one a fresh evaluation would give. Replicas of one Deployment share a shape, so a burst of
them costs one full pass, then lookups for the nodes that did not change.

Thread-safety: one re-entrant lock around the allocator and the index (the core is single-threaded).
Invariants: a pod UID maps to at most one active lease; the index of a clean node equals the
ledger's states (`check` recomputes both).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpupool.adapters.k8s.annotations import Placement
from gpupool.adapters.k8s.resources import DEFAULT_TTL_S, PodDemand
from gpupool.core import preemption
from gpupool.core.allocator import Allocator, LeaseEvent
from gpupool.core.clock import Clock
from gpupool.core.errors import InvalidInput, InvariantViolation
from gpupool.core.ids import LeaseIdFactory, random_lease_id
from gpupool.core.ledger import SliceState
from gpupool.core.model import Lease
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.policies import DEFAULT_POLICY, Policy
from gpupool.hardware.slices import Slice, SliceKind

_Row = tuple[int, int, SliceKind, int, int, int, int, int, SliceState]
"""(cap vram, cap compute, kind, free vram, free compute, preemptible vram, preemptible compute,
num leases, state) of one healthy slice; a node's rows sort by shape, then free VRAM, then free compute."""

_Group = tuple[int, int, SliceKind, int, int, tuple[int, ...]]
"""(cap vram, cap compute, kind, first row, end row, free VRAM of those rows): one shape of a node.
Filter bisects the free VRAM to the first row that could hold the demand."""

FIT, BUSY, BUSY_HOPELESS, NEVER = 0, 1, 2, 3
MEMO_SHAPES = 64
"""Demand shapes (VRAM, compute, cards, kinds, may-preempt) whose per-node verdicts are kept."""


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


def _pct(milli: int) -> str:
    return f"{milli / 10:g}%"


class ExtenderPool:
    def __init__(
        self,
        slices: Iterable[Slice] = (),
        *,
        clock: Clock,
        policy: Policy | str = DEFAULT_POLICY,
        ttl_s: float = DEFAULT_TTL_S,
        lease_ids: LeaseIdFactory = random_lease_id,
        cache_size: int = 4096,
    ) -> None:
        self._lock = threading.RLock()
        self._dirty: set[str] = set()
        self._nodes: dict[str, list[str]] = {}
        self._rows: dict[str, tuple[_Row, ...]] = {}
        self._groups: dict[str, tuple[_Group, ...]] = {}
        self._memo: OrderedDict[
            tuple[int, int, int, frozenset[SliceKind], bool], dict[str, tuple[int, int, str]]
        ]
        self._memo = OrderedDict()
        self._sick: dict[str, tuple[tuple[int, int, SliceKind], ...]] = {}
        self._pod_lease: dict[str, str] = {}
        self._pods: OrderedDict[str, PodDemand] = OrderedDict()
        self._costs: OrderedDict[tuple[str, int], dict[str, int]] = OrderedDict()
        self._cache_size = cache_size
        self.ttl_s = ttl_s
        self.generation = 0
        self.allocator = Allocator(clock=clock, policy=policy, lease_ids=lease_ids, on_event=self._on_event)
        for s in slices:
            self.add_slice(s)

    # ------------------------------------------------------------------ inventory
    def add_slice(self, s: Slice) -> None:
        with self._lock:
            self.allocator.add_slice(s)
            self._nodes.setdefault(s.node, []).append(s.id)
            self._touch(s.node)

    def remove_slice(self, slice_id: str) -> Slice:
        """Take a slice out of the pool; `InvalidInput` while leases hold it (drain first)."""
        with self._lock:
            s = self.allocator.remove_slice(slice_id)
            ids = self._nodes[s.node]
            ids.remove(slice_id)
            if not ids:
                del self._nodes[s.node]
                self._rows.pop(s.node, None)
                self._groups.pop(s.node, None)
                self._sick.pop(s.node, None)
                self._dirty.discard(s.node)
                for memo in self._memo.values():
                    memo.pop(s.node, None)
                self.generation += 1
            else:
                self._touch(s.node)
            return s

    def sync_slices(self, slices: Iterable[Slice], *, nodes: Iterable[str]) -> dict[str, list[str]]:
        """Make the pool's slices on ``nodes`` equal ``slices`` as far as leases allow.

        New slices are added, changed or vanished ones without leases are replaced or removed,
        health follows the new value; a changed or vanished slice that still holds leases is kept
        (marked unhealthy when it vanished) and reported under ``"blocked"``.
        """
        want = {s.id: s for s in slices}
        report: dict[str, list[str]] = {"added": [], "removed": [], "health": [], "blocked": []}
        with self._lock:
            led = self.allocator.ledger
            scope = set(nodes)
            for node in sorted(scope & set(self._nodes)):
                for sid in list(self._nodes[node]):
                    new = want.get(sid)
                    old = led.slice(sid)
                    if new is not None and _same_shape(old, new):
                        if led.is_healthy(sid) != new.healthy:
                            self.set_healthy(sid, new.healthy)
                            report["health"].append(sid)
                        continue
                    if led.state(sid).num_leases:
                        report["blocked"].append(sid)
                        if new is None and led.is_healthy(sid):
                            self.set_healthy(sid, False)
                        continue
                    self.remove_slice(sid)
                    report["removed"].append(sid)
            for sid, s in want.items():
                if sid not in led and s.node in scope:
                    self.add_slice(s)
                    report["added"].append(sid)
        return report

    def set_healthy(self, slice_id: str, healthy: bool) -> None:
        with self._lock:
            if healthy:
                self.allocator.mark_healthy(slice_id)
            else:
                self.allocator.mark_unhealthy(slice_id)
            self._touch(self.allocator.ledger.slice(slice_id).node)

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def slices_of(self, lease: Lease) -> dict[str, Slice]:
        with self._lock:
            return {g.slice_id: self.allocator.ledger.slice(g.slice_id) for g in lease.grants}

    def slices(self) -> dict[str, Slice]:
        with self._lock:
            led = self.allocator.ledger
            return {sid: led.slice(sid) for sid in led.slice_ids()}

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
        with self._lock:
            lid = self._pod_lease.get(uid)
            return None if lid is None else self.allocator.leases.active(lid)

    def pod_uids(self) -> list[str]:
        with self._lock:
            return sorted(self._pod_lease)

    # ------------------------------------------------------------------ filter / prioritize
    def filter(self, demand: PodDemand, nodes: Iterable[str]) -> FilterVerdict:
        """Per node: pass, fail (resolvable) or fail unresolvably, with a reason. Read-only."""
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        costs: dict[str, int] = {}
        with self._lock:
            self._refresh()
            nodes = list(nodes)
            for node, (status, value, reason) in zip(
                nodes, self._verdicts(demand, nodes, self._memo_of(demand)), strict=True
            ):
                if status == FIT:
                    passed.append(node)
                    costs[node] = value
                elif status == BUSY:
                    failed[node] = reason
                else:
                    unresolvable[node] = reason
            key = (demand.uid, self.generation)
            self._costs[key] = costs
            while len(self._costs) > 64:
                self._costs.popitem(last=False)
        return FilterVerdict(tuple(passed), failed, unresolvable)

    def prioritize(self, demand: PodDemand, nodes: Iterable[str]) -> list[tuple[str, int]]:
        """``(node, score 0..10)`` in input order; see the module docstring for the mapping."""
        nodes = list(nodes)
        with self._lock:
            cached = self._costs.get((demand.uid, self.generation))
            if cached is None or any(n not in cached for n in nodes):
                self._refresh()
                verdicts = self._verdicts(demand, nodes, self._memo_of(demand))
                cached = {n: v[1] for n, v in zip(nodes, verdicts, strict=True) if v[0] == FIT}
        fitting = [cached[n] for n in nodes if n in cached]
        lo, hi = (min(fitting), max(fitting)) if fitting else (0, 0)
        out = []
        for n in nodes:
            c = cached.get(n)
            if c is None:
                out.append((n, 0))
            elif hi == lo:
                out.append((n, 10))
            else:
                out.append((n, 1 + (9 * (hi - c)) // (hi - lo)))
        return out

    def _evaluate(self, demand: PodDemand, node: str) -> tuple[int, int, str]:
        return self._verdicts(demand, (node,), {})[0]

    def _evaluator(self, demand: PodDemand) -> Callable[[str], tuple[int, int, str]]:
        return lambda node: self._evaluate(demand, node)

    def _verdicts(
        self, demand: PodDemand, nodes: Iterable[str], memo: dict[str, tuple[int, int, str]]
    ) -> list[tuple[int, int, str]]:
        """``(status, cost, reason)`` per node, from ``memo`` or computed (and then memoised).

        The hot loop of filter: everything about the demand is hoisted out of the node loop.
        """
        all_rows, all_groups = self._rows, self._groups
        need_v, need_c, kinds = demand.vram_mib, demand.compute_milli, demand.kinds
        policy = self.allocator.policy
        cost, monotone, res = policy.cost, getattr(policy, "monotone", False), demand.resources
        time_slice = SliceKind.TIME_SLICE
        multi = demand.gpu_count > 1
        out: list[tuple[int, int, str]] = []
        append, memo_get = out.append, memo.get
        for node in nodes:
            verdict = memo_get(node)
            if verdict is not None:
                append(verdict)
                continue
            rows = all_rows.get(node)
            if rows is None:
                verdict = (NEVER, 0, f"node {node} has no gpupool GPUs")
            elif multi:
                verdict = self._evaluate_cards(demand, node, rows)
            else:
                best: int | None = None
                for cap_v, cap_c, kind, lo, hi, keys in all_groups[node]:
                    if (
                        need_v > cap_v
                        or need_c > cap_c
                        or ((kind not in kinds) if kinds else (kind is time_slice))
                    ):
                        continue
                    min_c = cap_c + 1
                    for i in range(lo + bisect_left(keys, need_v), hi):
                        row = rows[i]
                        free_c = row[4]
                        if need_c > free_c:
                            continue
                        if monotone:  # NOTE: rows of a group ascend in free VRAM, so a row that is not
                            if (
                                free_c >= min_c
                            ):  # tighter in compute than an earlier fitting one cannot cost less
                                continue
                            min_c = free_c
                        c = cost(row[8], res)
                        if best is None or c < best:
                            best = c
                verdict = (FIT, best, "") if best is not None else self._why_not(demand, node, rows)
            memo[node] = verdict
            append(verdict)
        return out

    def _why_not(self, demand: PodDemand, node: str, rows: tuple[_Row, ...]) -> tuple[int, int, str]:
        need_v, need_c, kinds = demand.vram_mib, demand.compute_milli, demand.kinds
        ever = reach = False
        most_v = most_c = 0
        largest = max((r[0] for r in rows), default=0)
        for cap_v, cap_c, kind, free_v, free_c, pre_v, pre_c, _, _ in rows:
            if need_v > cap_v or need_c > cap_c:
                continue
            if (kind not in kinds) if kinds else (kind is SliceKind.TIME_SLICE):
                continue
            ever = True
            most_v, most_c = max((most_v, most_c), (free_v, free_c))
            if need_v <= free_v + pre_v and need_c <= free_c + pre_c:
                reach = True
        want = f"{need_v} MiB and {_pct(need_c)} compute"
        if not ever:
            sick = any(
                need_v <= cap_v
                and need_c <= cap_c
                and ((kind in kinds) if kinds else kind is not SliceKind.TIME_SLICE)
                for cap_v, cap_c, kind in self._sick.get(node, ())
            )
            if sick:
                return NEVER, 0, f"every card on {node} that could hold {want} is unhealthy"
            what = f" of kind {sorted(k.value for k in kinds)}" if kinds else ""
            return NEVER, 0, f"no card{what} on {node} could ever hold {want} (largest card: {largest} MiB)"
        busy = f"no single card on {node} has {want} free (most free: {most_v} MiB, {_pct(most_c)})"
        if reach and demand.priority >= 0:
            return BUSY, 0, busy
        return BUSY_HOPELESS, 0, busy + "; evicting preemptible pods would not make room"

    def _evaluate_cards(self, demand: PodDemand, node: str, rows: tuple[_Row, ...]) -> tuple[int, int, str]:
        n, need_v = demand.gpu_count, demand.vram_mib
        able = free = reach = 0
        for cap_v, cap_c, kind, free_v, free_c, pre_v, pre_c, num, _ in rows:
            if kind is not SliceKind.WHOLE or need_v > cap_v:
                continue
            able += 1
            if num == 0:
                free += 1
            elif pre_v == cap_v - free_v and pre_c == cap_c - free_c:
                reach += 1
        if free >= n:
            return FIT, free - n, ""
        if able < n:
            return NEVER, 0, f"node {node} has {able} healthy whole card(s) with {need_v} MiB, pod needs {n}"
        busy = f"node {node} has {free} free whole card(s), pod needs {n}"
        if free + reach >= n and demand.priority >= 0:
            return BUSY, 0, busy
        return BUSY_HOPELESS, 0, busy + "; evicting preemptible pods would not free enough cards"

    # ------------------------------------------------------------------ preempt
    def preempt(self, demand: PodDemand, nodes: Iterable[str]) -> dict[str, list[str]]:
        """Minimal victim pod UIDs per node (core planner); nodes needing none or with no plan are omitted."""
        request = demand.to_request()
        out: dict[str, list[str]] = {}
        with self._lock:
            self._refresh()
            led, leases = self.allocator.ledger, self.allocator.leases
            for node in nodes:
                if node not in self._nodes or self._evaluate(demand, node)[0] == FIT:
                    continue
                plan: preemption.PreemptionPlan | None = None
                if demand.gpu_count > 1:
                    cards = [
                        (led.state(sid), leases.on_slice(sid)) for sid in led.whole_nodes().get(node, [])
                    ]
                    plan = preemption.plan_whole_node(node, cards, request)
                else:
                    for sid in self._nodes[node]:
                        st = led.state(sid)
                        if not st.healthy or not request.accepts(st.slice.kind):
                            continue
                        p = preemption.plan_slice(st, leases.on_slice(sid), request)
                        if p is not None and (plan is None or p.cost_key() < plan.cost_key()):
                            plan = p
                if plan is not None and plan.victims:
                    out[node] = [v.request.id for v in plan.victims]
        return out

    # ------------------------------------------------------------------ bind / release / adopt
    def reserve(self, demand: PodDemand, node: str) -> Outcome:
        """Commit a lease for the pod on ``node`` (best card there), re-validated on the current state."""
        with self._lock:
            held = self.lease_of(demand.uid)
            if held is not None:
                if held.node == node:
                    return Outcome(OutcomeCode.GRANTED, lease=held, reason="already bound")
                self.release_pod(demand.uid, reason=f"re-bound to {node}")
            if node not in self._nodes:
                return Outcome(OutcomeCode.UNRESOLVABLE, reason=f"node {node} has no gpupool GPUs")
            out = self.allocator.allocate(
                demand.to_request(nodes=frozenset({node}), ttl_s=self.ttl_s), preempt=False
            )
            if out.granted and out.lease is not None:
                self._pod_lease[demand.uid] = out.lease.id
            return out

    def release_pod(self, uid: str, *, reason: str, lease_id: str | None = None) -> Lease | None:
        """End the pod's lease (idempotent). Returns the ended lease, or None if it held none.

        With ``lease_id``, only that lease: a pod that meanwhile holds another one keeps it."""
        with self._lock:
            lid = self._pod_lease.get(uid)
            if lid is None or (lease_id is not None and lid != lease_id):
                return None
            del self._pod_lease[uid]
            out = self.allocator.release(lid, reason=reason)
            return out.lease if out.code is OutcomeCode.RELEASED else None

    def renew_pod(self, uid: str) -> bool:
        with self._lock:
            lid = self._pod_lease.get(uid)
            return lid is not None and self.allocator.renew(lid).code is OutcomeCode.RENEWED

    def adopt(self, placement: Placement) -> Lease:
        """Re-insert a lease read back from a pod annotation (restart). Raises `InvalidInput` on drift."""
        with self._lock:
            held = self.lease_of(placement.pod_uid)
            if held is not None:
                if held.id == placement.lease_id:
                    return held
                raise InvalidInput(
                    "placement.lease", placement.lease_id, f"pod already holds lease {held.id}"
                )
            led = self.allocator.ledger
            for g in placement.grants:
                if g.slice_id not in led:
                    raise InvalidInput("placement.grants.slice", g.slice_id, "no such slice in the pool")
                if led.slice(g.slice_id).node != placement.node:
                    raise InvalidInput("placement.node", placement.node, f"slice {g.slice_id} is elsewhere")
            lease = placement.to_lease(granted_at=self.allocator.clock.now(), ttl_s=self.ttl_s)
            self.allocator.restore(lease)
            self._pod_lease[placement.pod_uid] = lease.id
            return lease

    def check(self) -> None:
        """Core invariants plus: every clean node's index rows equal the ledger."""
        with self._lock:
            self.allocator.check_invariants()
            for node in self._rows:
                if node not in self._dirty and self._rows[node] != self._build(node):
                    raise InvariantViolation(f"extender index of node {node} is stale")
            for (vram, compute, cards, kinds, may_preempt), memo in self._memo.items():
                probe = PodDemand(
                    "check", "check", "check", 0 if may_preempt else -1, vram, compute, cards, kinds
                )
                evaluate = self._evaluator(probe)
                for node, verdict in memo.items():
                    if node not in self._dirty and evaluate(node) != verdict:
                        raise InvariantViolation(f"memoised verdict for {node} is stale: {verdict}")

    # ------------------------------------------------------------------ internals
    def _memo_of(self, demand: PodDemand) -> dict[str, tuple[int, int, str]]:
        """Verdicts per node for this demand's shape; a node's entries go when its rows are rebuilt."""
        key = (demand.vram_mib, demand.compute_milli, demand.gpu_count, demand.kinds, demand.priority >= 0)
        memo = self._memo.get(key)
        if memo is None:
            memo = self._memo[key] = {}
            while len(self._memo) > MEMO_SHAPES:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return memo

    def _on_event(self, event: LeaseEvent) -> None:
        self._touch(event.lease.node)
        if event.lease.state.ended and self._pod_lease.get(event.lease.request.id) == event.lease.id:
            del self._pod_lease[event.lease.request.id]

    def _touch(self, node: str) -> None:
        self._dirty.add(node)
        self.generation += 1

    def _refresh(self) -> None:
        self.allocator.expire_due()
        if self._dirty:
            for memo in self._memo.values():
                for node in self._dirty:
                    memo.pop(node, None)
        for node in self._dirty:
            self._rows[node] = self._build(node)
        self._dirty.clear()

    def _build(self, node: str) -> tuple[_Row, ...]:
        led = self.allocator.ledger
        rows = []
        sick = []
        for sid in self._nodes[node]:
            st = led.state(sid)
            cap = st.slice.capacity
            kind = st.slice.kind
            if not st.healthy:
                sick.append((cap.vram_mib, cap.compute_milli, kind))
                continue
            rows.append(
                (
                    cap.vram_mib,
                    cap.compute_milli,
                    kind,
                    st.free.vram_mib,
                    st.free.compute_milli,
                    st.preemptible.vram_mib,
                    st.preemptible.compute_milli,
                    st.num_leases,
                    st,
                )
            )
        rows.sort(key=lambda r: (r[0], r[1], r[2], r[3], r[4], r[8].slice.id))
        groups: list[_Group] = []
        lo = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or rows[i][:3] != rows[lo][:3]:
                cap_v, cap_c, kind = rows[lo][0], rows[lo][1], rows[lo][2]
                groups.append((cap_v, cap_c, kind, lo, i, tuple(r[3] for r in rows[lo:i])))
                lo = i
        self._groups[node] = tuple(groups)
        self._sick[node] = tuple(sick)
        return tuple(rows)
