"""`SliceLedger`: the single mutable owner of granted / free capacity per slice, with its indexes.

Role: answers "which healthy slices of this shape have at least X free" in O(log S) and keeps the
books exact. The allocator decides; the ledger only counts.

Invariants (checked on every change; `InvariantViolation` names slice and numbers otherwise):
- per slice: ``granted + free == capacity`` and ``0 <= granted <= capacity`` in both dimensions;
- ``0 <= preemptible_granted <= granted`` (capacity held by leases that may be preempted);
- the free index of a group holds exactly the healthy slices of that group, bucketed by
  ``free_compute_milli`` and keyed ``(free_vram_mib, slice_id)`` inside a bucket; the sorted list of
  non-empty bucket values is kept beside it. A best-fit query visits buckets in ascending free
  compute and takes the first key >= the VRAM need in each: that is the bucket's tightest slice, so
  the cost is O(buckets visited x log S), and monotone policies stop after a few buckets;
- the reclaim index holds exactly the healthy slices with preemptible grants, keyed by what
  preempting every preemptible lease would leave free: ``(free + preemptible)`` in both dimensions;
- the whole-card index holds, per node, the healthy ``WHOLE`` slices with nothing granted.

Watchers (`watch`): callables told the node of every slice whose books, health or presence is about
to change (grants, ungrants, rewinds, trials, add / remove / health), before the change. Derived
indexes over the ledger (`gpupool.core.cardindex`) mark that node stale and rebuild it lazily, so
they follow every change whoever makes it. Watchers must not change the ledger.

A group is the shape ``(kind, capacity vram, capacity compute)``; pools have few shapes, so
searching every matching group costs O(G log S) with G small.

`LedgerTransaction` applies trial changes in place and records their inverse; ``rollback`` undoes
them. The core is single-threaded per allocator, so nobody observes a trial that is rolled back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpupool.core.bucketindex import BucketIndex
from gpupool.core.errors import DuplicateId, InvalidInput, InvariantViolation, UnknownId
from gpupool.core.sortedkeys import SortedKeys
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

GroupKey = tuple[SliceKind, int, int]
FreeKey = tuple[int, int, str]
ReclaimKey = tuple[int, int, str]


class _Entry:
    """Mutable book of one slice. Private: outside the ledger only `SliceState` values are seen."""

    __slots__ = (
        "free_key",
        "granted_compute",
        "granted_vram",
        "group",
        "healthy",
        "num_leases",
        "pre_compute",
        "pre_vram",
        "reclaim_key",
        "slice",
        "state",
    )

    def __init__(self, s: Slice) -> None:
        self.slice = s
        self.group: GroupKey = (s.kind, s.capacity.vram_mib, s.capacity.compute_milli)
        self.granted_vram = 0
        self.granted_compute = 0
        self.pre_vram = 0
        self.pre_compute = 0
        self.num_leases = 0
        self.healthy = s.healthy
        self.free_key: FreeKey | None = None
        self.reclaim_key: ReclaimKey | None = None
        self.state: SliceState | None = None
        """Cached snapshot; cleared on every change (`_unindex` runs before each mutation)."""


@dataclass(frozen=True, slots=True)
class SliceState:
    """An immutable snapshot of one slice's books, as policies and adapters see it."""

    slice: Slice
    granted: Resources
    free: Resources
    preemptible: Resources
    num_leases: int
    healthy: bool


@dataclass(frozen=True, slots=True)
class GroupInfo:
    key: GroupKey
    capacity: Resources
    num_healthy: int


class SliceLedger:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._free: dict[GroupKey, BucketIndex] = {}
        self._reclaim: dict[GroupKey, BucketIndex] = {}
        self._num_healthy: dict[GroupKey, int] = {}
        self._whole_by_node: dict[str, list[str]] = {}
        self._free_whole: dict[str, set[str]] = {}
        self._whole_count: SortedKeys[tuple[int, str]] = SortedKeys()
        self._by_gpu: dict[str, list[str]] = {}
        self._groups: list[GroupInfo] | None = None
        self._watchers: list[Callable[[str], None]] = []
        self._by_node: dict[str, list[str]] = {}

    def watch(self, on_node: Callable[[str], None]) -> None:
        """Call ``on_node(node)`` before any change to a slice of that node (see the docstring)."""
        self._watchers.append(on_node)

    # ------------------------------------------------------------------ slices
    def add(self, s: Slice) -> None:
        if s.id in self._entries:
            raise DuplicateId("slice.id", s.id)
        gpu_slices = self._by_gpu.get(s.gpu_id)
        if gpu_slices:
            other = self._entries[gpu_slices[0]].slice
            if other.node != s.node:
                raise InvalidInput(
                    "slice.node", s.node, f"GPU {s.gpu_id!r} is already on node {other.node!r}"
                )
        e = _Entry(s)
        for w in self._watchers:
            w(s.node)
        self._groups = None
        self._entries[s.id] = e
        self._by_gpu.setdefault(s.gpu_id, []).append(s.id)
        self._by_node.setdefault(s.node, []).append(s.id)
        if s.kind is SliceKind.WHOLE:
            self._whole_by_node.setdefault(s.node, []).append(s.id)
        self._free.setdefault(e.group, BucketIndex())
        self._reclaim.setdefault(e.group, BucketIndex())
        self._num_healthy.setdefault(e.group, 0)
        if e.healthy:
            self._num_healthy[e.group] += 1
        self._reindex(e)

    def remove(self, slice_id: str) -> Slice:
        e = self._entry(slice_id)
        if e.num_leases or e.granted_vram or e.granted_compute:
            raise InvalidInput("slice_id", slice_id, f"has {e.num_leases} active lease(s); drain it first")
        self._unindex(e)
        self._groups = None
        if e.healthy:
            self._num_healthy[e.group] -= 1
        del self._entries[slice_id]
        self._by_gpu[e.slice.gpu_id].remove(slice_id)
        on_node = self._by_node[e.slice.node]
        on_node.remove(slice_id)
        if not on_node:
            del self._by_node[e.slice.node]
        if e.slice.kind is SliceKind.WHOLE:
            self._whole_by_node[e.slice.node].remove(slice_id)
        return e.slice

    def set_healthy(self, slice_id: str, healthy: bool) -> None:
        e = self._entry(slice_id)
        if e.healthy == healthy:
            return
        self._unindex(e)
        self._groups = None
        e.healthy = healthy
        self._num_healthy[e.group] += 1 if healthy else -1
        self._reindex(e)

    # ------------------------------------------------------------------ books
    def grant(self, slice_id: str, res: Resources, *, preemptible: bool) -> None:
        e = self._entry(slice_id)
        cap = e.slice.capacity
        vram = e.granted_vram + res.vram_mib
        compute = e.granted_compute + res.compute_milli
        if not res.is_nonnegative() or vram > cap.vram_mib or compute > cap.compute_milli:
            raise InvariantViolation(
                f"grant {res} on slice {slice_id} exceeds capacity {cap} (granted "
                f"{e.granted_vram} MiB x {e.granted_compute} mGPU)"
            )
        self._unindex(e)
        e.granted_vram, e.granted_compute = vram, compute
        e.num_leases += 1
        if preemptible:
            e.pre_vram += res.vram_mib
            e.pre_compute += res.compute_milli
        self._reindex(e)

    def ungrant(self, slice_id: str, res: Resources, *, preemptible: bool) -> None:
        e = self._entry(slice_id)
        vram = e.granted_vram - res.vram_mib
        compute = e.granted_compute - res.compute_milli
        pre_vram = e.pre_vram - res.vram_mib if preemptible else e.pre_vram
        pre_compute = e.pre_compute - res.compute_milli if preemptible else e.pre_compute
        if vram < 0 or compute < 0 or pre_vram < 0 or pre_compute < 0 or e.num_leases <= 0:
            raise InvariantViolation(
                f"ungrant {res} on slice {slice_id} below zero (granted {e.granted_vram} MiB x "
                f"{e.granted_compute} mGPU, preemptible {e.pre_vram} MiB, leases {e.num_leases})"
            )
        self._unindex(e)
        e.granted_vram, e.granted_compute = vram, compute
        e.pre_vram, e.pre_compute = pre_vram, pre_compute
        e.num_leases -= 1
        self._reindex(e)

    # ------------------------------------------------------------------ queries
    def __contains__(self, slice_id: str) -> bool:
        return slice_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def slice(self, slice_id: str) -> Slice:
        return self._entry(slice_id).slice

    def state(self, slice_id: str) -> SliceState:
        e = self._entry(slice_id)
        if e.state is not None:
            return e.state
        cap = e.slice.capacity
        e.state = SliceState(
            slice=e.slice,
            granted=Resources(e.granted_vram, e.granted_compute),
            free=Resources(cap.vram_mib - e.granted_vram, cap.compute_milli - e.granted_compute),
            preemptible=Resources(e.pre_vram, e.pre_compute),
            num_leases=e.num_leases,
            healthy=e.healthy,
        )
        return e.state

    def free(self, slice_id: str) -> Resources:
        e = self._entry(slice_id)
        cap = e.slice.capacity
        return Resources(cap.vram_mib - e.granted_vram, cap.compute_milli - e.granted_compute)

    def is_healthy(self, slice_id: str) -> bool:
        return self._entry(slice_id).healthy

    def slice_ids(self) -> Iterator[str]:
        return iter(self._entries)

    def groups(self) -> list[GroupInfo]:
        """One entry per slice shape; cached until a slice is added, removed or changes health."""
        if self._groups is None:
            self._groups = [
                GroupInfo(key=g, capacity=Resources(g[1], g[2]), num_healthy=self._num_healthy[g])
                for g in self._free
            ]
        return self._groups

    def free_from(
        self, group: GroupKey, need_vram_mib: int, need_compute_milli: int = 0
    ) -> Iterator[FreeKey]:
        """Every healthy slice of ``group`` that fits the need as ``(free_vram, free_compute, id)``:
        free-compute buckets ascending, free VRAM ascending inside. O(matches)."""
        return self._free[group].fitting(need_vram_mib, need_compute_milli)

    def tightest_per_bucket(
        self, group: GroupKey, need_vram_mib: int, need_compute_milli: int
    ) -> Iterator[FreeKey]:
        """Per free-compute bucket >= the need (ascending), its slice with the least free VRAM that
        still fits (ties by slice id). Lazy: the caller stops when its policy bound says so."""
        return self._free[group].tightest_per_bucket(need_vram_mib, need_compute_milli)

    def largest_free(self, group: GroupKey) -> FreeKey | None:
        return self._free[group].largest_vram()

    def reclaim_from(
        self, group: GroupKey, need_vram_mib: int, need_compute_milli: int
    ) -> Iterator[ReclaimKey]:
        """Healthy slices with preemptible grants whose free + preemptible capacity fits the need."""
        return self._reclaim[group].fitting(need_vram_mib, need_compute_milli)

    def whole_nodes(self) -> dict[str, list[str]]:
        """Node -> its WHOLE slice ids (healthy or not), in insertion order."""
        return self._whole_by_node

    def free_whole(self, node: str) -> set[str]:
        """Healthy WHOLE slices on ``node`` with nothing granted."""
        return self._free_whole.get(node, set())

    def nodes_with_free_whole(self, at_least: int) -> Iterator[tuple[int, str]]:
        """``(num_free_whole, node)`` for nodes with at least that many free WHOLE slices, fewest first."""
        return self._whole_count.iter_from((at_least, ""))

    def on_gpu(self, gpu_id: str) -> list[str]:
        return self._by_gpu.get(gpu_id, [])

    def on_node(self, node: str) -> list[str]:
        """The node's slice ids (healthy or not) in insertion order; empty for an unknown node."""
        return self._by_node.get(node, [])

    def nodes(self) -> Iterator[str]:
        """Nodes with at least one slice, in the order their first slice was added."""
        return iter(self._by_node)

    def gpu_ids(self) -> Iterator[str]:
        return iter(self._by_gpu)

    # ------------------------------------------------------------------ internals
    def _entry(self, slice_id: str) -> _Entry:
        try:
            return self._entries[slice_id]
        except KeyError:
            raise UnknownId("slice", slice_id) from None

    def _unindex(self, e: _Entry) -> None:
        e.state = None
        if self._watchers:
            for w in self._watchers:
                w(e.slice.node)
        if e.free_key is not None:
            self._free[e.group].remove(e.free_key)
            e.free_key = None
        if e.reclaim_key is not None:
            self._reclaim[e.group].remove(e.reclaim_key)
            e.reclaim_key = None
        if e.slice.kind is SliceKind.WHOLE:
            ids = self._free_whole.get(e.slice.node)
            if ids and e.slice.id in ids:
                self._whole_count.remove((len(ids), e.slice.node))
                ids.discard(e.slice.id)
                if ids:
                    self._whole_count.add((len(ids), e.slice.node))

    def _reindex(self, e: _Entry) -> None:
        if not e.healthy:
            return
        cap = e.slice.capacity
        free_vram = cap.vram_mib - e.granted_vram
        free_compute = cap.compute_milli - e.granted_compute
        e.free_key = (free_vram, free_compute, e.slice.id)
        self._free[e.group].add(e.free_key)
        if e.pre_vram or e.pre_compute:
            e.reclaim_key = (free_vram + e.pre_vram, free_compute + e.pre_compute, e.slice.id)
            self._reclaim[e.group].add(e.reclaim_key)
        if e.slice.kind is SliceKind.WHOLE and e.num_leases == 0:
            ids = self._free_whole.setdefault(e.slice.node, set())
            if ids:
                self._whole_count.remove((len(ids), e.slice.node))
            ids.add(e.slice.id)
            self._whole_count.add((len(ids), e.slice.node))

    def check(self) -> None:
        """Verify every invariant of the module docstring; raise `InvariantViolation` otherwise."""
        for sid, e in self._entries.items():
            cap = e.slice.capacity
            if not (0 <= e.granted_vram <= cap.vram_mib and 0 <= e.granted_compute <= cap.compute_milli):
                raise InvariantViolation(
                    f"slice {sid}: granted {e.granted_vram}/{e.granted_compute} vs {cap}"
                )
            if not (0 <= e.pre_vram <= e.granted_vram and 0 <= e.pre_compute <= e.granted_compute):
                raise InvariantViolation(f"slice {sid}: preemptible {e.pre_vram} > granted {e.granted_vram}")
            indexed = e.free_key is not None and e.free_key in self._free[e.group]
            if indexed != e.healthy:
                raise InvariantViolation(f"slice {sid}: healthy={e.healthy} but indexed={indexed}")
        for g in self._free:
            if self._free[g].bucket_keys() != self._free[g].bucket_values():
                raise InvariantViolation(f"bucket list of {g} disagrees with its buckets")
            for key in self.free_from(g, 0):
                e = self._entries[key[2]]
                cap = e.slice.capacity
                want = (cap.vram_mib - e.granted_vram, cap.compute_milli - e.granted_compute, key[2])
                if e.group != g or key != want:
                    raise InvariantViolation(f"free index of {g} has stale key {key}, want {want}")


class LedgerTransaction:
    """Trial changes over a `SliceLedger` with an undo log: ``commit`` keeps, ``rollback`` undoes."""

    def __init__(self, ledger: SliceLedger) -> None:
        self._ledger = ledger
        self._undo: list[tuple[bool, str, Resources, bool]] = []

    def grant(self, slice_id: str, res: Resources, *, preemptible: bool) -> None:
        self._ledger.grant(slice_id, res, preemptible=preemptible)
        self._undo.append((True, slice_id, res, preemptible))

    def ungrant(self, slice_id: str, res: Resources, *, preemptible: bool) -> None:
        self._ledger.ungrant(slice_id, res, preemptible=preemptible)
        self._undo.append((False, slice_id, res, preemptible))

    def rollback(self) -> None:
        while self._undo:
            was_grant, sid, res, pre = self._undo.pop()
            if was_grant:
                self._ledger.ungrant(sid, res, preemptible=pre)
            else:
                self._ledger.grant(sid, res, preemptible=pre)

    def commit(self) -> None:
        self._undo.clear()
