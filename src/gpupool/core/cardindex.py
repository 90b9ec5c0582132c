"""`CardIndex`: for one demand, per node, "fits now / fits after preemption / never" and the cost of
the node's best card, in one pass over many nodes; a read-only query over an `Allocator`'s ledger.

Role: the question kube-scheduler's extender asks for every pending pod (filter, prioritize,
preempt), answered by the core so that pods, model instances and batch jobs are judged on the one
ledger that grants them. No I/O, no clock, no threads: the owner of the allocator serialises calls.

Rows: for every node a tuple of rows, one per healthy slice (see `_Row`; a "card" is the core's
slice: a whole GPU, a MIG instance or an MPS share), grouped by shape, plus its unhealthy shapes.
Kept current incrementally by the ledger's own change notices (`SliceLedger.watch`): every grant,
ungrant, rewind, health change, add or remove marks its node stale, and stale nodes are rebuilt
lazily at the next query, so a query over 1,000 nodes never calls the allocator per node.

Verdicts: a node FITs when one card has both dimensions free now (N-card demands: N free whole
cards); it is NEVER when no healthy card of an accepted kind could ever hold the demand; BUSY when
evicting the preemptible leases could make room and the demand may preempt (priority >=
`PREEMPTING_MIN_PRIORITY`); otherwise BUSY_HOPELESS. The preemption part of the verdict is a bound
(it counts all preemptible grants); `plans` is exact, through the core's preemption planner. Each
verdict of a failing node carries a reason naming the numbers.

Costs: the allocator policy's cost of the node's best card (N-card demands: the free whole cards
left after placement). For a ``monotone`` policy only the Pareto-tight rows of each shape are
costed: a row with at least as much VRAM and compute free as an earlier fitting row of its shape can
never cost less.

Shape memo: verdicts are kept per demand shape (VRAM, compute, cards, kinds, may-preempt) and node
for the last ``memo_shapes`` shapes; rebuilding a node's rows drops its entries, so a memoised
verdict is always the one a fresh evaluation would give (`check` proves it).

Invariants: the rows of a clean node equal the ledger's states; `generation` grows on every change
notice, so a caller may key caches on it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.core import preemption
from gpupool.core.allocator import Allocator
from gpupool.core.errors import InvariantViolation
from gpupool.core.ledger import SliceState
from gpupool.core.model import Request
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import Resources

_Row = tuple[int, int, SliceKind, int, int, int, int, int, SliceState]
"""(cap vram, cap compute, kind, free vram, free compute, preemptible vram, preemptible compute,
num leases, state) of one healthy slice; a node's rows sort by shape, then free VRAM, then free compute."""

_Group = tuple[int, int, SliceKind, int, int, tuple[int, ...]]
"""(cap vram, cap compute, kind, first row, end row, free VRAM of those rows): one shape of a node.
A query bisects the free VRAM to the first row that could hold the demand."""

Verdict = tuple[int, int, str]
"""(status, cost, reason): status FIT (cost set, reason empty) or BUSY / BUSY_HOPELESS / NEVER."""

FIT, BUSY, BUSY_HOPELESS, NEVER = 0, 1, 2, 3
PREEMPTING_MIN_PRIORITY = 0
"""Demands of at least this priority may have preemptible lower-priority leases evicted for them."""
MEMO_SHAPES = 64


@dataclass(frozen=True, slots=True)
class NodeVerdicts:
    """One demand over many nodes: passing nodes in input order with their best card's cost, and a
    reason per failing node, resolvable (preemption may help) or not."""

    passed: tuple[str, ...]
    costs: dict[str, int]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def _pct(milli: int) -> str:
    return f"{milli / 10:g}%"


def _shape(request: Request) -> tuple[int, int, int, frozenset[SliceKind], bool]:
    d = request.demand
    return (d.vram_mib, d.compute_milli, request.gpu_count, request.kinds, request.priority >= 0)


class CardIndex:
    def __init__(self, allocator: Allocator, *, memo_shapes: int = MEMO_SHAPES) -> None:
        self._alloc = allocator
        self._ledger = allocator.ledger
        self._rows: dict[str, tuple[_Row, ...]] = {}
        self._groups: dict[str, tuple[_Group, ...]] = {}
        self._sick: dict[str, tuple[tuple[int, int, SliceKind], ...]] = {}
        self._memo: OrderedDict[tuple[int, int, int, frozenset[SliceKind], bool], dict[str, Verdict]]
        self._memo = OrderedDict()
        self._memo_shapes = memo_shapes
        self._dirty: set[str] = set(self._ledger.nodes())
        self.generation = 0
        self._ledger.watch(self._touch)

    # ------------------------------------------------------------------ queries
    def nodes(self) -> list[str]:
        return sorted(self._ledger.nodes())

    def filter(self, request: Request, nodes: Iterable[str]) -> NodeVerdicts:
        """Every node's verdict for ``request`` (see the module docstring). Read-only."""
        nodes = list(nodes)
        passed: list[str] = []
        costs: dict[str, int] = {}
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for node, (status, value, reason) in zip(nodes, self.verdicts(request, nodes), strict=True):
            if status == FIT:
                passed.append(node)
                costs[node] = value
            elif status == BUSY:
                failed[node] = reason
            else:
                unresolvable[node] = reason
        return NodeVerdicts(tuple(passed), costs, failed, unresolvable)

    def verdicts(self, request: Request, nodes: Iterable[str]) -> list[Verdict]:
        """``(status, cost, reason)`` per node in input order, from the shape memo or computed."""
        self._refresh()
        return self._verdicts(request, nodes, self._memo_of(request))

    def plans(self, request: Request, nodes: Iterable[str]) -> dict[str, preemption.PreemptionPlan]:
        """Per node that does not fit now, the core planner's minimal preemption plan, if any."""
        self._refresh()
        led, leases = self._ledger, self._alloc.leases
        out: dict[str, preemption.PreemptionPlan] = {}
        for node in nodes:
            ids = led.on_node(node)
            if not ids or self._verdicts(request, (node,), {})[0][0] == FIT:
                continue
            plan: preemption.PreemptionPlan | None = None
            if request.gpu_count > 1:
                cards = [(led.state(sid), leases.on_slice(sid)) for sid in led.whole_nodes().get(node, [])]
                plan = preemption.plan_whole_node(node, cards, request)
            else:
                for sid in ids:
                    st = led.state(sid)
                    if not st.healthy or not request.accepts(st.slice.kind):
                        continue
                    p = preemption.plan_slice(st, leases.on_slice(sid), request)
                    if p is not None and (plan is None or p.cost_key() < plan.cost_key()):
                        plan = p
            if plan is not None and plan.victims:
                out[node] = plan
        return out

    def check(self) -> None:
        """Every clean node's rows equal the ledger, and every memoised verdict a fresh evaluation."""
        for node in self._rows:
            if node not in self._dirty and self._rows[node] != self._build(node)[0]:
                raise InvariantViolation(f"card index of node {node} is stale")
        for (vram, compute, cards, kinds, may_preempt), memo in self._memo.items():
            probe = Request(
                id="check",
                tenant="check",
                priority=PREEMPTING_MIN_PRIORITY if may_preempt else PREEMPTING_MIN_PRIORITY - 1,
                demand=Resources(vram, compute),
                ttl_s=1.0,
                kinds=kinds,
                gpu_count=cards,
            )
            for node, verdict in memo.items():
                if node not in self._dirty and self._verdicts(probe, (node,), {})[0] != verdict:
                    raise InvariantViolation(f"memoised verdict for {node} is stale: {verdict}")

    # ------------------------------------------------------------------ evaluation
    def _verdicts(self, request: Request, nodes: Iterable[str], memo: dict[str, Verdict]) -> list[Verdict]:
        """The hot loop: everything about the demand is hoisted out of the node loop."""
        all_rows, all_groups = self._rows, self._groups
        res = request.demand
        need_v, need_c, kinds = res.vram_mib, res.compute_milli, request.kinds
        policy = self._alloc.policy
        cost, monotone = policy.cost, getattr(policy, "monotone", False)
        time_slice = SliceKind.TIME_SLICE
        multi = request.gpu_count > 1
        out: list[Verdict] = []
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
                verdict = self._cards_verdict(request, node, rows)
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
                        if monotone:
                            # rows of a group ascend in free VRAM: a row that is not tighter in
                            # compute than an earlier fitting one cannot cost less
                            if free_c >= min_c:
                                continue
                            min_c = free_c
                        c = cost(row[8], res)
                        if best is None or c < best:
                            best = c
                verdict = (FIT, best, "") if best is not None else self._why_not(request, node, rows)
            memo[node] = verdict
            append(verdict)
        return out

    def _why_not(self, request: Request, node: str, rows: tuple[_Row, ...]) -> Verdict:
        need_v, need_c, kinds = request.demand.vram_mib, request.demand.compute_milli, request.kinds
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
        if reach and request.priority >= PREEMPTING_MIN_PRIORITY:
            return BUSY, 0, busy
        return BUSY_HOPELESS, 0, busy + "; evicting preemptible pods would not make room"

    def _cards_verdict(self, request: Request, node: str, rows: tuple[_Row, ...]) -> Verdict:
        n, need_v = request.gpu_count, request.demand.vram_mib
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
        if free + reach >= n and request.priority >= PREEMPTING_MIN_PRIORITY:
            return BUSY, 0, busy
        return BUSY_HOPELESS, 0, busy + "; evicting preemptible pods would not free enough cards"

    # ------------------------------------------------------------------ upkeep
    def _touch(self, node: str) -> None:
        self._dirty.add(node)
        self.generation += 1

    def _memo_of(self, request: Request) -> dict[str, Verdict]:
        key = _shape(request)
        memo = self._memo.get(key)
        if memo is None:
            memo = self._memo[key] = {}
            while len(self._memo) > self._memo_shapes:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return memo

    def _refresh(self) -> None:
        if not self._dirty:
            return
        for memo in self._memo.values():
            for node in self._dirty:
                memo.pop(node, None)
        for node in self._dirty:
            if self._ledger.on_node(node):
                self._rows[node], self._groups[node], self._sick[node] = self._build(node)
            else:
                self._rows.pop(node, None)
                self._groups.pop(node, None)
                self._sick.pop(node, None)
        self._dirty.clear()

    def _build(
        self, node: str
    ) -> tuple[tuple[_Row, ...], tuple[_Group, ...], tuple[tuple[int, int, SliceKind], ...]]:
        led = self._ledger
        rows = []
        sick = []
        for sid in led.on_node(node):
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
        return tuple(rows), tuple(groups), tuple(sick)
