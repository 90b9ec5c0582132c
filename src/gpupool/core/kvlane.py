"""`KvLane`: request leases granted from a share of each model instance's KV budget, in O(1).

Role: the proxy takes one request lease per inference request (thousands per second). Granting each
through the KV `Allocator` (placement scan, ledger re-index, lease table, events) cost ~0.1 ms of CPU
per grant + release, the largest part of the proxy's per-request cost. The lane instead holds, per KV
slice, one *share lease* in that allocator (a real lease, so the ledger still sees every MiB in use)
and grants request leases inside the share with counters. This is the delegation shape the one-ledger
design uses for proxy replicas (a replica grants inside a share the ledger gave it).

What the lane serves: a request with a model, no ``nodes``/``kinds``/GPU scope, one GPU, no compute
demand, not preemptible (P0/P1 by default), and only on slices no queued request holds (``avoid``):
everything else takes the allocator's own path, unchanged. Placement is the allocator path's rule for
request leases: the slice with the most free KV (share left + ledger free), ties by slice id.

Share sizing: a share grows (its lease is replaced by a larger one, never beyond the ledger's free
room) to ``used + demand + headroom`` with headroom an eighth of the slice's budget, and shrinks
back when more than a quarter of the budget sits unused in it. `yield_all` shrinks every share to
exactly what its requests use; the controller calls it before anything queues on or pumps the KV
allocator, so queued requests always see the true free room. A share on an unhealthy slice is not
resized (the allocator places nothing there; nobody else may use its room) until its requests end.

Invariants (checked by `check`):
- per slice: ``used_mib`` = the sum of its lane leases' VRAM <= ``share_mib``, and the share lease is
  active in the allocator with exactly ``share_mib`` (none when ``share_mib`` is 0);
- a lane lease is in exactly one slice's book; ended lane leases are remembered (bounded) so `get`
  and a second release answer as for any other lease.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.core.allocator import Allocator
from gpupool.core.errors import InvariantViolation
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.core.priority import PRIORITY_MAX
from gpupool.hardware.units import Resources

SHARE_TENANT = "gpupool-kv-lane"
"""Tenant of the share leases (never a real tenant: tenants cannot see or release them)."""
SHARE_TTL_S = 24 * 3600.0
"""Share leases are renewed by `tick` long before this."""
ENDED_MEMORY = 4096
COMPACT_SLACK = 1024
"""The expiry heap is compacted once it holds this many more than twice the active lane leases."""


class _HoldsLeases(Protocol):
    @property
    def leases(self) -> dict[str, Lease]: ...


def compact_expiry(
    heap: list[tuple[float, str]], where: Mapping[str, _HoldsLeases]
) -> list[tuple[float, str]]:
    """The expiry heap without the entries of ended or since-renewed leases (``where``: active lease
    id -> the book holding it). A released lease leaves its entry behind until its expiry would have
    passed: thousands per second on the proxy path. Callers run it when the heap holds more than
    twice the active leases (+`COMPACT_SLACK`), so it costs amortised O(1) per grant."""
    live = [(at, lid) for at, lid in heap if lid in where and where[lid].leases[lid].expires_at == at]
    heapq.heapify(live)
    return live


@dataclass(slots=True)
class _Book:
    slice_id: str
    gpu_id: str
    node: str
    model: str
    budget_mib: int
    share_id: str = ""
    share_mib: int = 0
    used_mib: int = 0
    leases: dict[str, Lease] = field(default_factory=dict)


class KvLane:
    def __init__(self, kv: Allocator, *, now: Callable[[], float], lease_ids: Callable[[], str]) -> None:
        self.kv = kv
        self._now = now
        self._lease_ids = lease_ids
        self._books: dict[str, _Book] = {}
        self._by_model: dict[str, list[_Book]] = {}
        self._where: dict[str, _Book] = {}
        """Active lane lease id -> its slice's book."""
        self._expiry: list[tuple[float, str]] = []
        self._ended: OrderedDict[str, Lease] = OrderedDict()
        self._shares: dict[str, _Book] = {}
        """Share lease id -> book (to hide shares and to notice when one is revoked)."""
        self._resizing = False

    # ------------------------------------------------------------------ slices
    def add_slice(self, slice_id: str, *, model: str, budget_mib: int) -> None:
        s = self.kv.ledger.slice(slice_id)
        book = _Book(slice_id, s.gpu_id, s.node, model, budget_mib)
        self._books[slice_id] = book
        books = self._by_model.setdefault(model, [])
        books.append(book)
        books.sort(key=lambda b: b.slice_id)

    # ------------------------------------------------------------------ grants
    @staticmethod
    def eligible(request: Request) -> bool:
        return (
            not request.nodes
            and not request.kinds
            and request.gpu_count == 1
            and request.demand.compute_milli == 0
            and not request.is_preemptible
        )

    def grant(self, request: Request, avoid: frozenset[str], prefer: str = "") -> Lease | None:
        """A lane lease for ``request`` (validated, `eligible`), or None when no share can hold it now.
        ``prefer``: a KV slice of the model to use when it has room (a session's prefix lives there);
        otherwise, and by default, the most free slice."""
        need = request.demand.vram_mib
        ledger = self.kv.ledger
        best: _Book | None = None
        best_free = -1
        pb = self._books.get(prefer) if prefer else None
        if (
            pb is not None
            and pb.model == request.model
            and pb.slice_id not in avoid
            and ledger.is_healthy(pb.slice_id)
            and pb.share_mib - pb.used_mib + ledger.free(pb.slice_id).vram_mib >= need
        ):
            best, best_free = pb, need
        for b in () if best is not None else self._by_model.get(request.model, ()):
            if b.slice_id in avoid or not ledger.is_healthy(b.slice_id):
                continue
            free = b.share_mib - b.used_mib + ledger.free(b.slice_id).vram_mib
            if free >= need and free > best_free:
                best, best_free = b, free
        if best is None:
            return None
        if best.share_mib - best.used_mib < need:
            room = best.share_mib + ledger.free(best.slice_id).vram_mib
            if not self._resize(best, min(room, best.used_mib + need + best.budget_mib // 8)):
                return None
        now = self._now()
        lease = Lease(
            id=self._lease_ids(),
            request=request,
            node=best.node,
            grants=(Grant(best.slice_id, best.gpu_id, Resources(need, 0)),),
            granted_at=now,
            expires_at=now + request.ttl_s,
        )
        best.used_mib += need
        best.leases[lease.id] = lease
        self._where[lease.id] = best
        expiry = self._expiry
        heapq.heappush(expiry, (lease.expires_at, lease.id))
        if len(expiry) > 2 * len(self._where) + COMPACT_SLACK:
            self._expiry = compact_expiry(expiry, self._where)
        return lease

    def end(self, lease_id: str, state: LeaseState, reason: str, *, give_back: bool = False) -> Lease | None:
        """End an active lane lease (None when it is not one). ``give_back``: shrink its share to
        what is still used (the controller asks when requests are queued)."""
        book = self._where.pop(lease_id, None)
        if book is None:
            return None
        lease = book.leases.pop(lease_id)
        book.used_mib -= lease.grants[0].resources.vram_mib
        ended = lease.with_state(state, at=self._now(), reason=reason)
        self._remember(ended)
        if give_back:
            self._resize(book, book.used_mib)
        elif book.share_mib - book.used_mib > book.budget_mib // 4:
            self._resize(book, book.used_mib + book.budget_mib // 8)
        return ended

    def renew(self, lease_id: str, expires_at: float) -> Lease | None:
        book = self._where.get(lease_id)
        if book is None:
            return None
        renewed = book.leases[lease_id].renewed(expires_at)
        book.leases[lease_id] = renewed
        heapq.heappush(self._expiry, (expires_at, lease_id))
        return renewed

    def expire_due(self) -> int:
        """End every lane lease past its expiry (as the allocator does before each of its placements;
        O(1) when none is due). Returns how many ended."""
        expiry = self._expiry
        if not expiry:
            return 0
        now = self._now()
        n = 0
        while expiry and expiry[0][0] <= now:
            _, lid = heapq.heappop(expiry)
            book = self._where.get(lid)
            if book is not None and book.leases[lid].expires_at <= now:
                self.end(lid, LeaseState.EXPIRED, "ttl passed without renewal")
                n += 1
        return n

    def renew_shares(self) -> None:
        """Renew the share leases that come near their expiry (the controller's tick)."""
        now = self._now()
        for book in self._books.values():
            if book.share_id:
                share = self.kv.leases.active(book.share_id)
                if share is not None and share.expires_at - now < SHARE_TTL_S / 2:
                    self.kv.renew(book.share_id, SHARE_TTL_S)

    def yield_all(self) -> None:
        """Shrink every share to what its requests use (before queueing or pumping KV requests)."""
        for book in self._books.values():
            if book.share_mib > book.used_mib:
                self._resize(book, book.used_mib)

    # ------------------------------------------------------------------ the allocator's side
    def on_share_ended(self, share_id: str, reason: str) -> None:
        """A share lease ended outside the lane (GPU drained, slice failed): its requests end too."""
        book = self._shares.pop(share_id, None)
        if book is None or self._resizing:
            return
        book.share_id, book.share_mib = "", 0
        for lid in list(book.leases):
            self._where.pop(lid, None)
            lease = book.leases.pop(lid)
            self._remember(lease.with_state(LeaseState.REVOKED, at=self._now(), reason=reason))
        book.used_mib = 0

    def is_share(self, lease_id: str) -> bool:
        return lease_id in self._shares

    def shares(self) -> int:
        return len(self._shares)

    def _resize(self, book: _Book, share_mib: int) -> bool:
        """Replace the book's share lease by one of ``share_mib`` (0: none). False if it cannot grow.
        On an unhealthy slice (GPU drained or failed, engine out of routing) the allocator places no
        lease, so a share there is kept as it is (nobody else may use that room) until it ends."""
        if share_mib == book.share_mib:
            return True
        if share_mib and not self.kv.ledger.is_healthy(book.slice_id):
            return share_mib < book.share_mib
        self._resizing = True
        try:
            if book.share_id:
                self.kv.release(book.share_id, reason="kv lane share resized")
                self._shares.pop(book.share_id, None)
                book.share_id, book.share_mib = "", 0
            if share_mib <= 0:
                return True
            req = Request(
                id=f"kv-lane:{book.slice_id}",
                tenant=SHARE_TENANT,
                priority=PRIORITY_MAX,
                demand=Resources(share_mib, 0),
                ttl_s=SHARE_TTL_S,
                model=book.model,
                preemptible=False,
            )
            out = self.kv.place(req, (book.slice_id,))
            if out.lease is None or not out.granted:
                if book.used_mib:  # cannot happen: the old share was just freed and held at least this
                    raise InvariantViolation(f"kv lane lost the share of {book.slice_id}: {out.reason}")
                return False
            book.share_id, book.share_mib = out.lease.id, share_mib
            self._shares[book.share_id] = book
            return True
        finally:
            self._resizing = False

    # ------------------------------------------------------------------ reading
    def get(self, lease_id: str) -> Lease | None:
        book = self._where.get(lease_id)
        if book is not None:
            return book.leases[lease_id]
        return self._ended.get(lease_id)

    def active(self) -> Iterator[Lease]:
        for book in self._books.values():
            yield from book.leases.values()

    def on_slice(self, slice_id: str) -> list[Lease]:
        book = self._books.get(slice_id)
        return list(book.leases.values()) if book is not None else []

    def __len__(self) -> int:
        return len(self._where)

    def load(self, slice_id: str) -> tuple[int, int]:
        """(MiB used by lane leases, KV budget MiB) of one KV slice; (0, 0) if unknown."""
        book = self._books.get(slice_id)
        return (0, 0) if book is None else (book.used_mib, book.budget_mib)

    def usage(self, slice_id: str) -> tuple[int, int, int]:
        """(share MiB, MiB used by lane leases, lane leases) of one KV slice."""
        book = self._books.get(slice_id)
        return (0, 0, 0) if book is None else (book.share_mib, book.used_mib, len(book.leases))

    def check(self) -> None:
        for book in self._books.values():
            used = sum(x.grants[0].resources.vram_mib for x in book.leases.values())
            if used != book.used_mib or used > book.share_mib:
                raise InvariantViolation(
                    f"kv lane {book.slice_id}: used {book.used_mib} (leases {used}), share {book.share_mib}"
                )
            if book.share_mib:
                share = self.kv.leases.active(book.share_id)
                if share is None or share.total.vram_mib != book.share_mib:
                    raise InvariantViolation(f"kv lane {book.slice_id}: share lease missing or resized")
            elif book.share_id:
                raise InvariantViolation(f"kv lane {book.slice_id}: empty share with a lease")

    def _remember(self, lease: Lease) -> None:
        self._ended[lease.id] = lease
        if len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
