"""`Allocator`: filter -> score -> reserve over a `SliceLedger` and a `LeaseTable`, on an injected clock.

Role: the mechanism. It owns the loop; the `Policy` only scores. Every public call returns an
`Outcome` (an expected "no" is a value); exceptions mean misuse (`InvalidInput`, `UnknownId`) or a
broken invariant, and leave the books unchanged.

Cost per call (S slices, G slice shapes, k leases due):
- allocate: O(k log n) expiry + O(G log S) index search + the slices the policy cannot rule out;
- release / renew: O(log S);
- preemption (only when nothing fits): per slice shape, the first `PREEMPTION_CANDIDATES` slices
  with a feasible plan, in ascending reachable (free + preemptible) compute then VRAM order; the
  search ends at once on a one-victim plan whose victim has the lowest preemptible priority in the
  pool (nothing can beat it but a smaller victim). N-GPU preemption looks at the WHOLE cards of
  every node.

Invariants: those of the ledger and the lease table, plus: the ledger's grants equal the sum of the
active leases' grants (`check_invariants` recomputes it), no request is split across GPUs, no lease
sits on an unhealthy slice, a victim always has strictly lower priority than its preemptor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpupool.core import preemption
from gpupool.core.clock import Clock
from gpupool.core.errors import InvalidInput, InvariantViolation, UnknownId
from gpupool.core.ids import LeaseIdFactory, random_lease_id
from gpupool.core.leases import LeaseTable
from gpupool.core.ledger import GroupInfo, LedgerTransaction, SliceLedger, SliceState
from gpupool.core.model import Grant, Lease, LeaseState, Request, validate_request
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.policies import DEFAULT_POLICY, Policy, get_policy
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

PREEMPTION_CANDIDATES = 8
"""Feasible preemption plans examined per slice shape before the best of them is taken."""
EARLY_WARNING_RATIO = 0.85


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """A change of one lease, delivered to the ``on_event`` sink in the order it happened."""

    kind: str  # granted | renewed | released | expired | preempted | revoked | restored
    lease: Lease
    at: float
    previous: Lease | None = None
    """The lease as it was just before this change (None for a grant or a restore)."""


EventSink = Callable[[LeaseEvent], None]


class Allocator:
    def __init__(
        self,
        slices: Iterable[Slice] = (),
        *,
        clock: Clock,
        policy: Policy | str = DEFAULT_POLICY,
        lease_ids: LeaseIdFactory = random_lease_id,
        on_event: EventSink | None = None,
        early_warning_ratio: float = EARLY_WARNING_RATIO,
        ended_capacity: int = 100_000,
    ) -> None:
        self.clock = clock
        self.policy: Policy = get_policy(policy) if isinstance(policy, str) else policy
        self._observe: Callable[[Request], None] | None = getattr(self.policy, "observe", None)
        """A learning policy's hook (`FragGradient.observe`): told each request once, before scoring."""
        self.ledger = SliceLedger()
        self.leases = LeaseTable(ended_capacity=ended_capacity)
        self._lease_ids = lease_ids
        self._on_event = on_event
        if not 0.0 < early_warning_ratio <= 1.0:
            raise InvalidInput("early_warning_ratio", early_warning_ratio, "must be in (0, 1]")
        self._warn_permille = round(early_warning_ratio * 1000)
        self._preemptible_priorities: Counter[int] = Counter()
        """Priority -> number of active preemptible leases (few distinct values)."""
        for s in slices:
            self.ledger.add(s)

    # ================================================================== pool
    def add_slice(self, s: Slice) -> None:
        self.ledger.add(s)

    def remove_slice(self, slice_id: str) -> Slice:
        return self.ledger.remove(slice_id)

    def mark_unhealthy(self, slice_id: str, *, revoke: bool = False, reason: str = "") -> tuple[Lease, ...]:
        """Stop new leases on the slice. Returns the leases on it (revoked when ``revoke``)."""
        self.ledger.set_healthy(slice_id, False)
        on = tuple(self.leases.on_slice(slice_id))
        if not revoke:
            return on
        why = reason or f"slice {slice_id} unhealthy"
        return tuple(self._end(lease, LeaseState.REVOKED, why) for lease in on)

    def mark_healthy(self, slice_id: str) -> None:
        self.ledger.set_healthy(slice_id, True)

    # ================================================================== leases
    def allocate(self, request: Request, *, preempt: bool = True) -> Outcome:
        """Grant ``request`` on the best slice, preempting strictly lower-priority work if allowed."""
        validate_request(request)
        self.expire_due()
        if self._observe is not None:
            self._observe(request)
        if request.gpu_count > 1:
            return self._allocate_cards(request, preempt=preempt)
        groups = [
            g
            for g in self.ledger.groups()
            if g.num_healthy and request.accepts(g.key[0]) and request.demand.fits_in(g.capacity)
        ]
        if not groups:
            return self._unresolvable(request)
        sid = self._best_slice(request, groups)
        if sid is not None:
            return self._commit(request, (sid,), (request.demand,), victims=())
        if preempt:
            plan = self._plan_single(request, groups)
            if plan is not None:
                return self._commit_plan(request, plan)
        return Outcome(OutcomeCode.NO_CAPACITY, reason=self._no_capacity_reason(request, groups))

    def place(self, request: Request, slice_ids: tuple[str, ...]) -> Outcome:
        """Grant ``request`` on exactly these slices (simulator policies, Kubernetes bind).

        Returns GRANTED, NO_CAPACITY (they lack room now: a lost race) or UNRESOLVABLE (they can never
        hold it). Raises `UnknownId` for an unknown slice and `InvalidInput` for a malformed placement.
        """
        validate_request(request)
        self.expire_due()
        if len(slice_ids) != request.gpu_count or len(set(slice_ids)) != len(slice_ids):
            raise InvalidInput("slice_ids", slice_ids, f"need {request.gpu_count} distinct slice(s)")
        states = [self.ledger.state(sid) for sid in slice_ids]
        if len({st.slice.node for st in states}) != 1:
            raise InvalidInput("slice_ids", slice_ids, "all slices of one request must be on one node")
        if len({st.slice.gpu_id for st in states}) != len(states):
            raise InvalidInput("slice_ids", slice_ids, "a request never takes two slices of one GPU")
        if self._observe is not None:
            self._observe(request)  # NOTE: after the checks that raise: bad input leaves the mix unchanged
        for st in states:
            if not request.accepts(st.slice.kind) or not request.demand.fits_in(st.slice.capacity):
                return Outcome(
                    OutcomeCode.UNRESOLVABLE,
                    reason=f"slice {st.slice.id} ({st.slice.kind}, {st.slice.capacity}) "
                    f"cannot hold {request.demand}",
                )
            if request.nodes and st.slice.node not in request.nodes:
                return Outcome(OutcomeCode.UNRESOLVABLE, reason=f"node {st.slice.node} not allowed")
            busy = request.gpu_count > 1 and st.num_leases > 0
            if not st.healthy or busy or not request.demand.fits_in(st.free):
                return Outcome(OutcomeCode.NO_CAPACITY, reason=f"slice {st.slice.id} has {st.free} free")
        amounts = tuple(self._amount(request, st.slice) for st in states)
        return self._commit(request, tuple(slice_ids), amounts, victims=())

    def release(self, lease_id: str, *, reason: str = "") -> Outcome:
        """End a lease and free its capacity. Idempotent: a second call returns ALREADY_ENDED."""
        lease = self.leases.require(lease_id)
        if lease.state.ended:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        return Outcome(
            OutcomeCode.RELEASED, lease=self._end(lease, LeaseState.RELEASED, reason or "released")
        )

    def revoke(self, lease_id: str, *, state: LeaseState = LeaseState.REVOKED, reason: str) -> Outcome:
        """End a lease on the pool's initiative (drain, failed pause, preemption by an operator)."""
        if state is LeaseState.ACTIVE:
            raise InvalidInput("state", state, "a revoked lease must end")
        lease = self.leases.require(lease_id)
        if lease.state.ended:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        return Outcome(OutcomeCode.RELEASED, lease=self._end(lease, state, reason))

    def renew(self, lease_id: str, ttl_s: float | None = None) -> Outcome:
        """Move the expiry to now + ``ttl_s`` (default: the request's ttl). Ended leases stay ended."""
        if ttl_s is not None:
            validate_request(_with_ttl(self.leases.require(lease_id).request, ttl_s))
        self.expire_due()
        lease = self.leases.require(lease_id)
        if lease.state.ended:
            return Outcome(OutcomeCode.ALREADY_ENDED, lease=lease, reason=f"lease already {lease.state}")
        ttl = lease.request.ttl_s if ttl_s is None else float(ttl_s)
        renewed = lease.renewed(self.clock.now() + ttl)
        self.leases.replace(renewed)
        self._emit("renewed", renewed, lease)
        return Outcome(OutcomeCode.RENEWED, lease=renewed)

    def expire_due(self) -> tuple[Lease, ...]:
        """Reclaim every active lease whose expiry has passed. Returns them in expiry order."""
        due = self.leases.due(self.clock.now())
        out = []
        for lid in due:
            lease = self.leases.active(lid)
            if lease is not None:
                out.append(self._end(lease, LeaseState.EXPIRED, "ttl passed without renewal"))
        return tuple(out)

    def restore(self, lease: Lease) -> None:
        """Re-insert an ACTIVE lease read back from a store (restart). Validates that it fits."""
        if lease.state is not LeaseState.ACTIVE:
            raise InvalidInput("lease.state", lease.state, "only active leases are restored")
        validate_request(lease.request)
        tx = LedgerTransaction(self.ledger)
        try:
            for g in lease.grants:
                st = self.ledger.state(g.slice_id)
                if not g.resources.fits_in(st.free):
                    raise InvalidInput("lease.grants", g.slice_id, f"{g.resources} exceeds free {st.free}")
                tx.grant(g.slice_id, g.resources, preemptible=lease.request.is_preemptible)
            self.leases.add(lease)
        except Exception:
            tx.rollback()
            raise
        tx.commit()
        self._count_preemptible(lease, +1)
        self._emit("restored", lease)

    def rewind(self, versions: Iterable[tuple[str, Lease | None]]) -> None:
        """Put each lease id back to the given version (None: never existed), without events.

        For undoing changes a store could not make durable: every current version leaves the books
        first, then the given versions come back, so any set of versions that was consistent
        together fits again (on unhealthy slices too: a lease may sit on a slice marked unhealthy
        without revocation)."""
        wanted = list(versions)
        for lid, _ in wanted:
            cur = self.leases.forget(lid)
            if cur is not None and cur.state is LeaseState.ACTIVE:
                for g in cur.grants:
                    self.ledger.ungrant(g.slice_id, g.resources, preemptible=cur.request.is_preemptible)
                self._count_preemptible(cur, -1)
        for _, old in wanted:
            if old is None:
                continue
            if old.state is not LeaseState.ACTIVE:
                self.leases.remember_ended(old)
                continue
            for g in old.grants:
                self.ledger.grant(g.slice_id, g.resources, preemptible=old.request.is_preemptible)
            self.leases.add(old)
            self._count_preemptible(old, +1)

    # ================================================================== queries
    def get(self, lease_id: str) -> Lease:
        return self.leases.require(lease_id)

    def slice_state(self, slice_id: str) -> SliceState:
        return self.ledger.state(slice_id)

    def states(self) -> list[SliceState]:
        return [self.ledger.state(sid) for sid in self.ledger.slice_ids()]

    def check_invariants(self) -> None:
        """Recompute every slice's grants from the active leases and compare with the ledger."""
        self.ledger.check()
        want: dict[str, list[int]] = {sid: [0, 0, 0, 0, 0] for sid in self.ledger.slice_ids()}
        for lease in self.leases:
            if len({g.gpu_id for g in lease.grants}) != len(lease.grants):
                raise InvariantViolation(f"lease {lease.id} has two grants on one GPU")
            for g in lease.grants:
                w = want[g.slice_id]
                w[0] += g.resources.vram_mib
                w[1] += g.resources.compute_milli
                w[4] += 1
                if lease.request.is_preemptible:
                    w[2] += g.resources.vram_mib
                    w[3] += g.resources.compute_milli
        for sid, w in want.items():
            st = self.ledger.state(sid)
            got = [
                st.granted.vram_mib,
                st.granted.compute_milli,
                st.preemptible.vram_mib,
                st.preemptible.compute_milli,
                st.num_leases,
            ]
            if got != w:
                raise InvariantViolation(f"slice {sid}: ledger {got} != leases {w}")

    # ================================================================== internals
    def _amount(self, request: Request, s: Slice) -> Resources:
        return s.capacity if request.gpu_count > 1 else request.demand

    def _best_slice(self, request: Request, groups: list[GroupInfo]) -> str | None:
        demand = request.demand
        need_v, need_c = demand.vram_mib, demand.compute_milli
        policy, ledger, nodes = self.policy, self.ledger, request.nodes
        fast = policy.monotone and not nodes
        best: tuple[int, int, int, str] | None = None
        for g in groups:
            cap = g.capacity
            if fast:
                for free_v, free_c, sid in ledger.tightest_per_bucket(g.key, need_v, need_c):
                    if best is not None and policy.cost_floor(cap, 0, free_c - need_c) > best[0]:
                        break
                    key = (policy.cost(ledger.state(sid), demand), free_v, free_c, sid)
                    if best is None or key < best:
                        best = key
                continue
            for free_v, free_c, sid in ledger.free_from(g.key, need_v, need_c):
                if nodes and ledger.slice(sid).node not in nodes:
                    continue
                key = (policy.cost(ledger.state(sid), demand), free_v, free_c, sid)
                if best is None or key < best:
                    best = key
        return None if best is None else best[3]

    def _plan_single(self, request: Request, groups: list[GroupInfo]) -> preemption.PreemptionPlan | None:
        lowest = min(self._preemptible_priorities, default=None)
        if lowest is None or lowest >= request.priority:
            return None  # NOTE: nothing in the pool may be preempted by this request: O(1) "no"
        best: preemption.PreemptionPlan | None = None
        for g in groups:
            looked = 0
            for _, _, sid in self.ledger.reclaim_from(
                g.key, request.demand.vram_mib, request.demand.compute_milli
            ):
                st = self.ledger.state(sid)
                if request.nodes and st.slice.node not in request.nodes:
                    continue
                plan = preemption.plan_slice(st, self.leases.on_slice(sid), request)
                if plan is None:
                    continue
                if best is None or plan.cost_key() < best.cost_key():
                    best = plan
                    if len(plan.victims) == 1 and plan.victims[0].priority == lowest:
                        return best
                looked += 1
                if looked >= PREEMPTION_CANDIDATES:
                    break
        return best

    def _allocate_cards(self, request: Request, *, preempt: bool) -> Outcome:
        n, demand = request.gpu_count, request.demand
        possible = False
        for node, ids in self.ledger.whole_nodes().items():
            if request.nodes and node not in request.nodes:
                continue
            fitting = [
                sid
                for sid in ids
                if self.ledger.is_healthy(sid) and demand.fits_in(self.ledger.slice(sid).capacity)
            ]
            if len(fitting) >= n:
                possible = True
                break
        if not possible:
            return self._unresolvable(request)
        for _, node in self.ledger.nodes_with_free_whole(n):
            if request.nodes and node not in request.nodes:
                continue
            free_cards = sorted(
                (self.ledger.slice(sid).capacity.vram_mib, sid)
                for sid in self.ledger.free_whole(node)
                if demand.fits_in(self.ledger.slice(sid).capacity)
            )
            if len(free_cards) >= n:
                picked = tuple(sorted(sid for _, sid in free_cards[:n]))
                amounts = tuple(self.ledger.slice(sid).capacity for sid in picked)
                return self._commit(request, picked, amounts, victims=())
        if preempt:
            best: preemption.PreemptionPlan | None = None
            for node, ids in self.ledger.whole_nodes().items():
                if request.nodes and node not in request.nodes:
                    continue
                cards = [(self.ledger.state(sid), self.leases.on_slice(sid)) for sid in ids]
                plan = preemption.plan_whole_node(node, cards, request)
                if plan is not None and (best is None or plan.cost_key() < best.cost_key()):
                    best = plan
            if best is not None:
                return self._commit_plan(request, best)
        return Outcome(
            OutcomeCode.NO_CAPACITY, reason=f"no node has {n} free whole GPUs with {demand.vram_mib} MiB each"
        )

    def _commit_plan(self, request: Request, plan: preemption.PreemptionPlan) -> Outcome:
        for v in plan.victims:
            if not preemption.can_preempt(v, request):
                raise InvariantViolation(
                    f"plan would preempt {v.id} (priority {v.priority}) for {request.priority}"
                )
        tx = LedgerTransaction(self.ledger)
        for v in plan.victims:
            for g in v.grants:
                tx.ungrant(g.slice_id, g.resources, preemptible=v.request.is_preemptible)
        amounts = tuple(self._amount(request, self.ledger.slice(sid)) for sid in plan.slice_ids)
        for sid, amount in zip(plan.slice_ids, amounts, strict=True):
            st = self.ledger.state(sid)
            fits = amount.fits_in(st.free) and (request.gpu_count == 1 or st.num_leases == 0)
            if not fits:
                tx.rollback()
                return Outcome(OutcomeCode.NO_CAPACITY, reason=f"preemption plan on {sid} did not make room")
        tx.rollback()  # NOTE: the trial proved the fit; now end the victims for real, then grant.
        now = self.clock.now()
        victims = tuple(
            self._end(
                v, LeaseState.PREEMPTED, f"preempted by request {request.id} (priority {request.priority})"
            )
            for v in plan.victims
            if self.leases.active(v.id) is not None
        )
        out = self._commit(request, plan.slice_ids, amounts, victims=victims)
        if not out.granted:
            raise InvariantViolation(f"preemption at {now} freed room on {plan.slice_ids} but grant failed")
        return out

    def _commit(
        self,
        request: Request,
        slice_ids: tuple[str, ...],
        amounts: tuple[Resources, ...],
        *,
        victims: tuple[Lease, ...],
    ) -> Outcome:
        now = self.clock.now()
        tx = LedgerTransaction(self.ledger)
        grants = []
        warn = False
        try:
            for sid, amount in zip(slice_ids, amounts, strict=True):
                tx.grant(sid, amount, preemptible=request.is_preemptible)
                s = self.ledger.slice(sid)
                grants.append(Grant(slice_id=sid, gpu_id=s.gpu_id, resources=amount))
                used = s.capacity.vram_mib - self.ledger.free(sid).vram_mib
                warn = warn or used * 1000 >= self._warn_permille * s.capacity.vram_mib
            lease = Lease(
                id=self._lease_ids(),
                request=request,
                node=self.ledger.slice(slice_ids[0]).node,
                grants=tuple(grants),
                granted_at=now,
                expires_at=now + request.ttl_s,
            )
            self.leases.add(lease)
        except Exception:
            tx.rollback()
            raise
        tx.commit()
        self._count_preemptible(lease, +1)
        self._emit("granted", lease)
        code = OutcomeCode.PREEMPTED_VICTIMS if victims else OutcomeCode.GRANTED
        return Outcome(code, lease=lease, victims=victims, early_warning=warn)

    def _end(self, lease: Lease, state: LeaseState, reason: str) -> Lease:
        ended = lease.with_state(state, at=self.clock.now(), reason=reason)
        for g in lease.grants:
            self.ledger.ungrant(g.slice_id, g.resources, preemptible=lease.request.is_preemptible)
        self.leases.end(ended)
        self._count_preemptible(lease, -1)
        self._emit(state.value, ended, lease)
        return ended

    def _count_preemptible(self, lease: Lease, delta: int) -> None:
        if lease.request.is_preemptible:
            p = lease.priority
            self._preemptible_priorities[p] += delta
            if self._preemptible_priorities[p] <= 0:
                del self._preemptible_priorities[p]

    def _emit(self, kind: str, lease: Lease, previous: Lease | None = None) -> None:
        if self._on_event is not None:
            self._on_event(LeaseEvent(kind=kind, lease=lease, at=self.clock.now(), previous=previous))

    def _unresolvable(self, request: Request) -> Outcome:
        kinds = ", ".join(sorted(k.value for k in request.kinds)) if request.kinds else "any"
        return Outcome(
            OutcomeCode.UNRESOLVABLE,
            reason=(
                f"no healthy slice of kind {kinds} could ever hold {request.demand}"
                + (f" x {request.gpu_count} GPUs on one node" if request.gpu_count > 1 else "")
            ),
        )

    def _no_capacity_reason(self, request: Request, groups: list[GroupInfo]) -> str:
        largest = max((self.ledger.largest_free(g.key) or (0, 0, "")) for g in groups)
        return (
            f"no slice has {request.demand} free now (largest free: {largest[0]} MiB on "
            f"{largest[2] or 'none'}) and no lower-priority preemptible lease can make room"
        )


def _with_ttl(request: Request, ttl_s: float) -> Request:
    from dataclasses import replace

    return replace(request, ttl_s=ttl_s)


__all__ = ["Allocator", "EventSink", "LeaseEvent", "SliceKind", "UnknownId"]
