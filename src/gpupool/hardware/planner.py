"""Partition planner: cluster spec + workload spec -> per-GPU layout and the placement of every replica.

Role: layer 1's placement step (ARCHITECTURE "Placement" flow). Standard library only.

Public API:
- ``plan(cluster, workloads)`` -> ``Plan`` (see :mod:`gpupool.hardware.plantypes`); raises ``PlanError``
  naming the workload and the shortfall in MiB when a P0/P1 replica cannot be placed. P2 replicas that do
  not fit are listed in ``Plan.unplaced`` (batch work waits for the pool). P2 replicas never reserve
  capacity: after the online layout is fixed each borrows one pool slice (best fit).
- ``inventory_from_plan(plan)`` -> core ``Inventory`` of ``Slice`` (ids as in the plan, labels
  ``workload``/``replica`` or ``pool=p2``, ``uuid`` when the cluster spec knows it).
- ``inventory_from_cluster(cluster)`` -> ``Inventory``: one ``WHOLE`` slice per card (``<node>/<i>/whole``).
- ``mps_quota_mib(need_mib)`` and ``default_thread_pct(quota_mib, usable_mib)``: the MPS sizing rules.

Rules (from the seed): a main LLM (role ``llm``) or ``isolation: mig`` goes to a hard-isolated MIG
instance, the smallest profile that holds it (3g.40gb for a 32B AWQ model on an A100-80GB);
guardrail/intent models go to MPS shares with a pinned memory limit of at least ``MPS_MIN_QUOTA_MIB``;
embedding/rerank go to small MIG instances (1g.10gb) or MPS shares, whichever avoids opening a card;
no replica spans cards; free MIG slots are filled with the largest legal pool instances, free MPS memory
becomes one pool share, unused cards stay whole in the pool.

Objective and determinism: several greedy strategies (card-opening order x embedding preference) run; the
winner minimises (GPUs used, -pool MiB, -largest pool slice MiB, strategy index). Replicas are taken in
the total order (P2 last, role rank, -need MiB, workload name, replica index); cards in cluster order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupool.hardware.capability import GpuMode
from gpupool.hardware.mig import MIG_FAMILIES, MigProfile, best_layout, can_place, family_model, family_of
from gpupool.hardware.planinventory import inventory_from_cluster, inventory_from_plan
from gpupool.hardware.plantypes import GpuPlan, Placement, Plan, PlanError, PlannedSlice, Unplaced
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.spec import ClusterSpec, GpuSpec, Isolation, Role, WorkloadSet, WorkloadSpec
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU

MPS_MIN_QUOTA_MIB = 4096
"""The seed's guardrail share: a 4 GB pinned memory limit."""
MPS_SERVER_RESERVE_MIB = 512
"""Memory kept back on an MPS card for the MPS server's own context."""
MPS_MAX_CLIENTS = 48
MPS_MAX_SHARE_PCT = 75
"""A replica whose quota exceeds this share of a card's memory gets the card whole (own fault domain)."""
MIN_THREAD_PCT = 10

__all__ = [
    "MPS_MIN_QUOTA_MIB",
    "Plan",
    "PlanError",
    "default_thread_pct",
    "inventory_from_cluster",
    "inventory_from_plan",
    "mps_quota_mib",
    "plan",
]


def mps_quota_mib(need_mib: int) -> int:
    """Pinned device memory limit for an MPS client: need rounded up to a GiB, at least 4 GiB."""
    return max(MPS_MIN_QUOTA_MIB, math.ceil(need_mib / 1024) * 1024)


def default_thread_pct(quota_mib: int, usable_mib: int) -> int:
    """Active thread percentage proportional to the memory share, rounded up to 5, in [10, 100]."""
    pct = math.ceil(100 * quota_mib / max(1, usable_mib) / 5) * 5
    return max(MIN_THREAD_PCT, min(100, pct))


@dataclass(frozen=True, slots=True)
class _Rep:
    w: WorkloadSpec
    replica: int

    @property
    def need(self) -> int:
        return self.w.need_mib


@dataclass
class _Card:
    spec: GpuSpec
    order: int
    mode: GpuMode | None = None
    mig: list[tuple[MigProfile, _Rep]] = field(default_factory=list)
    shares: list[tuple[int, int, _Rep]] = field(default_factory=list)
    whole: _Rep | None = None

    @property
    def usable_mps(self) -> int:
        return self.spec.model.memory_mib - MPS_SERVER_RESERVE_MIB

    def mps_free(self) -> int:
        return self.usable_mps - sum(q for q, _, _ in self.shares)

    def supports(self, mode: GpuMode) -> bool:
        forced = self.spec.mode
        if forced is not None and forced is not mode:
            return False
        m = self.spec.model
        if mode is GpuMode.MIG:
            return m.mig_capable
        if mode is GpuMode.MPS:
            return m.mps_capable
        return True


_ROLE_RANK = {Role.LLM: 0, Role.EMBEDDING: 1, Role.RERANK: 1, Role.GUARDRAIL: 2, Role.BATCH: 3}


def _rep_order(r: _Rep) -> tuple[int, int, int, int, str, int]:
    explicit = 0 if r.w.isolation is Isolation.MIG else 1
    return (r.w.priority == "P2", _ROLE_RANK[r.w.role], explicit, -r.need, r.w.name, r.replica)


def _kinds(r: _Rep, embed_mig_first: bool) -> tuple[tuple[GpuMode, ...], bool]:
    """Acceptable modes in preference order, and whether the preference is strict (open a card of the
    preferred mode before using a less preferred mode on an already open card)."""
    if r.w.isolation is Isolation.MIG:
        return (GpuMode.MIG,), True
    if r.w.isolation is Isolation.MPS:
        return (GpuMode.MPS, GpuMode.TIME_SLICE), True
    if r.w.role is Role.LLM:
        return (GpuMode.MIG, GpuMode.MPS, GpuMode.WHOLE, GpuMode.TIME_SLICE), True
    if r.w.role in (Role.EMBEDDING, Role.RERANK) and embed_mig_first:
        return (GpuMode.MIG, GpuMode.MPS, GpuMode.TIME_SLICE, GpuMode.WHOLE), False
    return (GpuMode.MPS, GpuMode.MIG, GpuMode.TIME_SLICE, GpuMode.WHOLE), False


@functools.lru_cache(maxsize=65536)
def _mig_fit(
    family: str, existing: tuple[str, ...], need_mib: int, compute_pct: int | None, explicit_mig: bool
) -> MigProfile | None:
    """Smallest profile (MiB, then SM slices, then name) holding ``need_mib`` that still fits beside
    ``existing`` (a sorted tuple of profile names). Cached: cards in the same state share the answer."""
    fam = MIG_FAMILIES[family]
    need_sm = math.ceil(compute_pct * fam.sm_slices / 100) if compute_pct is not None else 0
    # a full-card MIG instance only when MIG was asked for explicitly; otherwise the card goes whole
    max_sm = fam.sm_slices if explicit_mig else fam.sm_slices - 1
    candidates = sorted(
        (
            p
            for p in fam.profiles
            if not p.media and p.memory_mib >= need_mib and need_sm <= p.sm_slices <= max_sm
        ),
        key=lambda p: (p.memory_mib, p.sm_slices, p.name),
    )
    for p in candidates:
        if can_place(family_model(family), [*existing, p.name]):
            return p
    return None


def _try_mig(card: _Card, r: _Rep) -> tuple[int, MigProfile] | None:
    """(waste MiB, profile) of the smallest profile that still fits beside the card's instances."""
    existing = tuple(sorted(p.name for p, _ in card.mig))
    fam = family_of(card.spec.model)
    p = _mig_fit(fam.name, existing, r.need, r.w.compute_pct, r.w.isolation is Isolation.MIG)
    return None if p is None else (p.memory_mib - r.need, p)


def _fit(card: _Card, r: _Rep, mode: GpuMode) -> int | None:
    """Waste in MiB if ``r`` fits on ``card`` in ``mode`` (card open in that mode or unopened)."""
    if card.mode is not None and card.mode is not mode:
        return None
    if card.mode is None and not card.supports(mode):
        return None
    if mode is GpuMode.MIG:
        hit = _try_mig(card, r)
        return None if hit is None else hit[0]
    if mode in (GpuMode.MPS, GpuMode.TIME_SLICE):
        if mode is GpuMode.TIME_SLICE and card.spec.mode is not GpuMode.TIME_SLICE:
            return None  # time-slicing only where the cluster spec forces it (no memory isolation)
        if len(card.shares) >= MPS_MAX_CLIENTS:
            return None
        # a huge replica gets the card whole unless MPS was asked for (by the workload or the cluster)
        capped = r.w.isolation is not Isolation.MPS and card.spec.mode is None
        if capped and mps_quota_mib(r.need) * 100 > MPS_MAX_SHARE_PCT * card.usable_mps:
            return None
        free = card.mps_free() - mps_quota_mib(r.need)
        return None if free < 0 else free
    if card.mode is None and r.need <= card.spec.model.memory_mib:  # WHOLE: one dedicated replica
        return card.spec.model.memory_mib - r.need
    return None


def _assign(card: _Card, r: _Rep, mode: GpuMode) -> None:
    card.mode = mode
    if mode is GpuMode.MIG:
        hit = _try_mig(card, r)
        assert hit is not None
        card.mig.append((hit[1], r))
    elif mode in (GpuMode.MPS, GpuMode.TIME_SLICE):
        quota = mps_quota_mib(r.need)
        pct = r.w.compute_pct or default_thread_pct(quota, card.usable_mps)
        card.shares.append((quota, pct, r))
    else:
        card.whole = r


_OPEN_ORDERS = ("best-fit", "small-first", "large-first", "cluster")


def _open_key(order: str, card: _Card, waste: int) -> tuple[int, int]:
    mem = card.spec.model.memory_mib
    if order == "best-fit":
        return (waste, card.order)
    if order == "small-first":
        return (mem, card.order)
    if order == "large-first":
        return (-mem, card.order)
    return (0, card.order)


def _place_one(cards: list[_Card], r: _Rep, open_order: str, embed_mig_first: bool) -> bool:
    kinds, strict = _kinds(r, embed_mig_first)

    def best_open(mode: GpuMode) -> _Card | None:
        scored = [(w, c.order, c) for c in cards if c.mode is mode and (w := _fit(c, r, mode)) is not None]
        return min(scored, key=lambda t: (t[0], t[1]))[2] if scored else None

    def best_new(mode: GpuMode, *, non_mig_only: bool = False) -> _Card | None:
        # fresh cards of one (model, forced mode) are interchangeable: the lowest-order one stands for all
        reps: dict[tuple[str, GpuMode | None], _Card] = {}
        for c in cards:
            if c.mode is None and not (non_mig_only and c.spec.model.mig_capable):
                reps.setdefault((c.spec.model.name, c.spec.mode), c)
        fresh = [(c, w) for c in reps.values() if (w := _fit(c, r, mode)) is not None]
        return min(fresh, key=lambda t: _open_key(open_order, t[0], t[1]))[0] if fresh else None

    def new_non_mig(mode: GpuMode) -> _Card | None:
        return best_new(mode, non_mig_only=True)

    steps: list[tuple[GpuMode, Callable[[GpuMode], _Card | None]]]
    if strict:
        steps = [(m, f) for m in kinds for f in (best_open, best_new)]
    else:
        steps = [(m, best_open) for m in kinds]
        if kinds[0] is GpuMode.MPS:
            # MPS-first work (guardrails) opens a card without MIG before taking a free MIG slot, and
            # takes a free MIG slot before turning a MIG-capable card into an MPS card.
            steps = [(GpuMode.MPS, best_open), (GpuMode.MPS, new_non_mig), *steps[1:]]
        steps += [(m, best_new) for m in kinds]
    for mode, finder in steps:
        card = finder(mode)
        if card is not None:
            _assign(card, r, mode)
            return True
    return False


def _largest_space(cards: list[_Card], r: _Rep) -> int:
    kinds, _ = _kinds(r, True)
    best = 0
    for c in cards:
        for mode in kinds:
            if c.mode is not None and c.mode is not mode:
                continue
            if c.mode is None and not c.supports(mode):
                continue
            if mode is GpuMode.MIG:
                existing = [p.name for p, _ in c.mig]
                fam = family_of(c.spec.model)
                fits = [p.memory_mib for p in fam.profiles if can_place(c.spec.model, [*existing, p.name])]
                best = max(best, *fits, 0)
            elif mode in (GpuMode.MPS, GpuMode.TIME_SLICE):
                best = max(best, c.mps_free())
            elif c.mode is None:
                best = max(best, c.spec.model.memory_mib)
    return best


@dataclass
class _Run:
    cards: list[_Card]
    unplaced: list[Unplaced]
    failure: PlanError | None = None


def _run(cluster: ClusterSpec, reps: list[_Rep], open_order: str, embed_mig_first: bool) -> _Run:
    cards = [_Card(g, i) for i, g in enumerate(cluster.gpus())]
    run = _Run(cards, [])
    for r in reps:
        if _place_one(cards, r, open_order, embed_mig_first):
            continue
        space = _largest_space(cards, r)
        short = max(1, r.need - space) if space < r.need else 0
        iso = r.w.isolation.value
        kinds, _ = _kinds(r, True)
        if not any(c.supports(m) for c in cards for m in kinds):
            wanted = "/".join(m.value for m in kinds)
            why = f"no GPU in the cluster supports {wanted}: short by {r.need} MiB"
            short = r.need
        elif short:
            why = f"largest space left for it is {space} MiB: short by {short} MiB"
        else:
            why = f"no card offers an acceptable slice kind (isolation {iso}) with {r.need} MiB free"
        if r.w.priority == "P2":
            run.unplaced.append(Unplaced(r.w.name, r.replica, r.need, why))
            continue
        msg = (
            f"workload {r.w.name!r} replica {r.replica} needs {r.need} MiB (role {r.w.role.value}, "
            f"isolation {iso}) and cannot be placed: {why}"
        )
        run.failure = PlanError(msg, workload=r.w.name, shortfall_mib=short or r.need)
        return run
    return run


def _finish_card(c: _Card, placements: list[Placement]) -> GpuPlan:
    if c.mode is None and c.spec.mode in (GpuMode.MIG, GpuMode.MPS, GpuMode.TIME_SLICE):
        c.mode = c.spec.mode  # forced by the cluster spec: partition it even without online work
    g = c.spec
    base = g.gpu_id
    model = g.model
    slices: list[PlannedSlice] = []

    def place(r: _Rep, s: PlannedSlice) -> None:
        placements.append(
            Placement(r.w.name, r.replica, g.node, g.index, base, s.id, s.vram_mib, r.need, s.kind)
        )

    if c.mode is GpuMode.MIG:
        fam = family_of(model)
        layout = best_layout(model, [p.name for p, _ in c.mig])
        assert layout is not None
        reps = sorted(c.mig, key=lambda t: (t[0].name, t[1].w.name, t[1].replica))
        starts = sorted(layout.instances, key=lambda i: (i.profile, i.start))
        for (p, r), inst in zip(reps, starts, strict=True):
            s = PlannedSlice(
                f"{base}/mig-{p.name}-{inst.start}",
                SliceKind.MIG,
                p.memory_mib,
                p.sm_slices * COMPUTE_MILLI_PER_GPU // fam.sm_slices,
                p.name,
                inst.start,
                workload=r.w.name,
                replica=r.replica,
            )
            slices.append(s)
            place(r, s)
        for inst in layout.pool:
            pp = fam.profile(inst.profile)
            assert pp is not None
            slices.append(
                PlannedSlice(
                    f"{base}/mig-{pp.name}-{inst.start}",
                    SliceKind.MIG,
                    pp.memory_mib,
                    pp.sm_slices * COMPUTE_MILLI_PER_GPU // fam.sm_slices,
                    pp.name,
                    inst.start,
                    pool=True,
                )
            )
        slices.sort(key=lambda s: (s.start, s.id))
        names = sorted({r.w.name for _, r in c.mig}) or ["nothing (mode forced by the cluster spec)"]
        pool_txt = " + ".join(str(i) for i in layout.pool) or "none"
        reason = (
            f"MIG: hard isolation for {', '.join(names)} ({model.name} supports MIG); "
            f"free slots to the P2 pool: {pool_txt}"
        )
        return GpuPlan(g.node, g.index, model, GpuMode.MIG, tuple(slices), reason, uuid=g.uuid)
    if c.mode in (GpuMode.MPS, GpuMode.TIME_SLICE):
        kind = SliceKind.MPS if c.mode is GpuMode.MPS else SliceKind.TIME_SLICE
        for quota, pct, r in sorted(c.shares, key=lambda t: (t[2].w.name, t[2].replica)):
            s = PlannedSlice(
                f"{base}/mps-{r.w.name}-{r.replica}",
                kind,
                quota,
                pct * 10,
                "mps",
                thread_pct=pct,
                workload=r.w.name,
                replica=r.replica,
            )
            slices.append(s)
            place(r, s)
        free = c.mps_free()
        left_pct = max(0, 100 - sum(p for _, p, _ in c.shares))
        if free > 0:
            slices.append(
                PlannedSlice(
                    f"{base}/mps-pool",
                    kind,
                    free,
                    left_pct * 10,
                    "mps",
                    thread_pct=max(left_pct, 1),
                    pool=True,
                )
            )
        names = sorted({r.w.name for _, _, r in c.shares}) or ["none yet"]
        if c.mode is GpuMode.TIME_SLICE:
            reason = (
                f"TIME-SLICE (last resort, no memory isolation): forced by the cluster spec; "
                f"{len(c.shares)} clients ({', '.join(names)}); {free} MiB to the P2 pool"
            )
            return GpuPlan(g.node, g.index, model, GpuMode.TIME_SLICE, tuple(slices), reason, True, g.uuid)
        why = "has no MIG" if not model.mig_capable else "hosts no workload that needs hard isolation"
        reason = (
            f"MPS: {model.name} {why}; {len(c.shares)} clients ({', '.join(names)}) with pinned memory "
            f"limits; {free} MiB to the P2 pool"
        )
        return GpuPlan(g.node, g.index, model, GpuMode.MPS, tuple(slices), reason, uuid=g.uuid)
    whole = PlannedSlice(f"{base}/whole", SliceKind.WHOLE, model.memory_mib, COMPUTE_MILLI_PER_GPU)
    if c.whole is not None:
        r = c.whole
        s = PlannedSlice(
            whole.id,
            SliceKind.WHOLE,
            whole.vram_mib,
            whole.compute_milli,
            workload=r.w.name,
            replica=r.replica,
        )
        place(r, s)
        reason = f"whole: {r.w.name} replica {r.replica} needs {r.need} MiB; no MIG/MPS slice holds it"
        return GpuPlan(g.node, g.index, model, GpuMode.WHOLE, (s,), reason, uuid=g.uuid)
    pool = PlannedSlice(whole.id, SliceKind.WHOLE, whole.vram_mib, whole.compute_milli, pool=True)
    return GpuPlan(
        g.node,
        g.index,
        model,
        GpuMode.WHOLE,
        (pool,),
        "whole: unused, whole card in the P2 pool",
        uuid=g.uuid,
    )


def _place_batch(gpus: tuple[GpuPlan, ...], batch: list[_Rep], placements: list[Placement]) -> list[Unplaced]:
    """P2 replicas borrow pool slices: best fit (least MiB left), one replica per pool slice."""
    taken: set[str] = set()
    unplaced: list[Unplaced] = []
    for r in sorted(batch, key=lambda r: (-r.need, r.w.name, r.replica)):
        ok_kinds = {
            Isolation.MIG: {SliceKind.MIG},
            Isolation.MPS: {SliceKind.MPS, SliceKind.TIME_SLICE},
        }.get(r.w.isolation, set(SliceKind))
        cands = [
            (s.vram_mib, s.id, g, s)
            for g in gpus
            for s in g.slices
            if s.pool and s.id not in taken and s.kind in ok_kinds
        ]
        fits = [c for c in cands if c[0] >= r.need]
        if not fits:
            largest = max((c[0] for c in cands), default=0)
            unplaced.append(
                Unplaced(
                    r.w.name,
                    r.replica,
                    r.need,
                    f"no free pool slice holds {r.need} MiB (largest {largest} MiB: short by "
                    f"{max(0, r.need - largest)} MiB); it waits for pool capacity",
                )
            )
            continue
        _, sid, g, s = min(fits, key=lambda c: (c[0], c[1]))
        taken.add(sid)
        placements.append(
            Placement(r.w.name, r.replica, g.node, g.index, g.gpu_id, sid, s.vram_mib, r.need, s.kind)
        )
    return unplaced


def _score(run: _Run, batch: list[_Rep]) -> tuple[int, int, int, int]:
    used = sum(1 for c in run.cards if c.mode is not None)
    placements: list[Placement] = []
    gpus = tuple(_finish_card(c, placements) for c in run.cards)
    unplaced = _place_batch(gpus, batch, placements)
    pools = [s for g in gpus for s in g.slices if s.pool]
    total = sum(s.vram_mib for s in pools)
    return (used, len(unplaced), -total, -max((s.vram_mib for s in pools), default=0))


def plan(cluster: ClusterSpec, workloads: WorkloadSet) -> Plan:
    """Plan every replica of ``workloads`` onto ``cluster`` (see the module docstring for the rules)."""
    every = sorted((_Rep(w, i) for w in workloads.workloads for i in range(w.replicas)), key=_rep_order)
    online = [r for r in every if r.w.priority != "P2"]
    batch = [r for r in every if r.w.priority == "P2"]
    best: tuple[tuple[int, ...], _Run] | None = None
    first_failure: PlanError | None = None
    idx = 0
    for embed_mig_first in (True, False):
        for open_order in _OPEN_ORDERS:
            run = _run(cluster, online, open_order, embed_mig_first)
            idx += 1
            if run.failure is not None:
                first_failure = first_failure or run.failure
                continue
            key = (*_score(run, batch), idx)
            if best is None or key < best[0]:
                best = (key, run)
    if best is None:
        assert first_failure is not None
        src = workloads.source
        raise PlanError(
            f"{src}: {first_failure}",
            workload=first_failure.workload,
            shortfall_mib=first_failure.shortfall_mib,
        )
    run = best[1]
    placements: list[Placement] = []
    gpus = tuple(_finish_card(c, placements) for c in run.cards)
    unplaced = _place_batch(gpus, batch, placements)
    placements.sort(key=lambda p: (p.workload, p.replica))
    return Plan(gpus, tuple(placements), tuple(unplaced), cluster.source, workloads.source)
