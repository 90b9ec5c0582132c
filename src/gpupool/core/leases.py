"""`LeaseTable`: active leases, their per-slice membership, a deadline heap, and recent endings.

Role: lease bookkeeping without any scan of the whole table. Expiry pops a min-heap of
``(expires_at, seq, lease_id, revision)``; renewals push a fresh entry and the stale one is skipped
when popped (lazy deletion), so each allocate costs O(k log n) for the k leases that are actually due.

Invariants:
- a lease id is in exactly one of ``active`` and ``ended``;
- ``on_slice(s)`` lists exactly the active leases with a grant on slice ``s``;
- every active lease has one heap entry carrying its current revision (stale entries may remain).

``ended`` keeps the most recent `ended_capacity` ended leases so that release / renew of a finished
lease is answered idempotently; older endings fall out (their store keeps them).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator

from gpupool.core.errors import DuplicateId, InvariantViolation, UnknownId
from gpupool.core.model import Lease, LeaseState


class LeaseTable:
    def __init__(self, *, ended_capacity: int = 100_000) -> None:
        self._active: dict[str, Lease] = {}
        self._by_slice: dict[str, dict[str, None]] = {}
        self._ended: OrderedDict[str, Lease] = OrderedDict()
        self._ended_capacity = ended_capacity
        self._heap: list[tuple[float, int, str, int]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._active)

    def add(self, lease: Lease) -> None:
        if lease.id in self._active or lease.id in self._ended:
            raise DuplicateId("lease.id", lease.id)
        if lease.state is not LeaseState.ACTIVE:
            raise InvariantViolation(f"lease {lease.id} added in state {lease.state}")
        self._active[lease.id] = lease
        for sid in lease.slice_ids:
            self._by_slice.setdefault(sid, {})[lease.id] = None
        self._push(lease)

    def replace(self, lease: Lease) -> None:
        """Swap an active lease for its next revision (renewal)."""
        old = self._active.get(lease.id)
        if old is None or lease.revision != old.revision + 1 or lease.slice_ids != old.slice_ids:
            raise InvariantViolation(f"lease {lease.id}: bad replacement of revision {old and old.revision}")
        self._active[lease.id] = lease
        self._push(lease)  # NOTE: the old heap entry carries the old revision and is now stale

    def end(self, ended: Lease) -> None:
        """Move an active lease to ``ended`` (``ended`` is the lease in its final state)."""
        if ended.id not in self._active or not ended.state.ended:
            raise InvariantViolation(f"lease {ended.id}: cannot end (state {ended.state})")
        del self._active[ended.id]
        for sid in ended.slice_ids:
            members = self._by_slice[sid]
            del members[ended.id]
            if not members:
                del self._by_slice[sid]
        self._ended[ended.id] = ended
        if len(self._ended) > self._ended_capacity:
            self._ended.popitem(last=False)

    def forget(self, lease_id: str) -> Lease | None:
        """Drop a lease (active or ended) as if it had never been added; return what was there.
        Its heap entries go stale (skipped when popped)."""
        lease = self._active.pop(lease_id, None)
        if lease is None:
            return self._ended.pop(lease_id, None)
        for sid in lease.slice_ids:
            members = self._by_slice[sid]
            del members[lease_id]
            if not members:
                del self._by_slice[sid]
        return lease

    def remember_ended(self, ended: Lease) -> None:
        """Put an ended lease back into the recent endings (undo of a change to it)."""
        if ended.id in self._active or not ended.state.ended:
            raise InvariantViolation(f"lease {ended.id}: cannot remember as ended (state {ended.state})")
        self._ended[ended.id] = ended
        if len(self._ended) > self._ended_capacity:
            self._ended.popitem(last=False)

    def get(self, lease_id: str) -> Lease | None:
        return self._active.get(lease_id) or self._ended.get(lease_id)

    def require(self, lease_id: str) -> Lease:
        lease = self.get(lease_id)
        if lease is None:
            raise UnknownId("lease", lease_id)
        return lease

    def active(self, lease_id: str) -> Lease | None:
        return self._active.get(lease_id)

    def on_slice(self, slice_id: str) -> list[Lease]:
        return [self._active[lid] for lid in self._by_slice.get(slice_id, ())]

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._active.values())

    def due(self, now: float) -> list[str]:
        """Pop and return ids of active leases whose ``expires_at <= now``, earliest first."""
        out: list[str] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, lid, rev = heapq.heappop(heap)
            lease = self._active.get(lid)
            if lease is not None and lease.revision == rev:
                out.append(lid)
        return out

    def next_deadline(self) -> float | None:
        """Earliest expiry among heap entries (may be a stale entry: a lower bound)."""
        return self._heap[0][0] if self._heap else None

    def _push(self, lease: Lease) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (lease.expires_at, self._seq, lease.id, lease.revision))
        if len(self._heap) > 4 * len(self._active) + 1024:
            self._compact()

    def _compact(self) -> None:
        self._heap = [
            e for e in self._heap if (a := self._active.get(e[2])) is not None and a.revision == e[3]
        ]
        heapq.heapify(self._heap)
