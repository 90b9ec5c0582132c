"""`ReplicaShares`: a proxy replica's side of KV-share delegation: request leases granted locally,
in O(1), inside the shares the leader delegated (`gpupool.core.kvshares`).

Role: one book per backend (model instance) holds the replica's share of that backend's KV budget
(``share_mib``, granted by the leader), a local ``cap_mib`` (what it may use now), the request
leases inside it and their use. A request lease is granted only when ``used + need <= cap`` and the
share is still valid on the replica's own clock; nothing is sent anywhere per request.

Renewal (`report` then `apply` or nothing): `report` numbers the call (``seq``), lowers every cap
to the hold it reports (``min(cap, max(used, target))``: a share above the leader's fair target is
given back here, never more than the replica uses) and returns, per backend, hold / used / want
(``want = peak use since the last report + demand refused since then + headroom``, at most the
budget). `apply` takes the leader's answer to the *latest* call only (an older one is ignored, so a
slow answer can never raise a cap after a later call lowered it): cap = share = the granted MiB,
valid until ``sent_at + ttl_s * (1 - margin)``. A call that fails changes nothing (the caps stay at
the promised holds: the leader may hold more for us, never less).

Lapse: when a share's validity passes without a successful renewal the book's share and cap drop
to 0 and its request leases end as REVOKED (the leader's lease, set from the moment it *received*
the call, outlives the validity, so the leader never hands the room to another replica while this
one may still grant in it).

Invariants (checked by `check`): per book ``used`` = the sum of its leases' VRAM, ``cap <= share``,
and ``used <= cap`` except in a book whose share was cut below its use by a leader that had lost
it (``cut``: no grant there until ``used`` falls below the cap); a lane lease is in exactly one book.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from gpupool.core.errors import InvariantViolation
from gpupool.core.kvbackends import KV_PREFIX
from gpupool.core.kvlane import COMPACT_SLACK, compact_expiry
from gpupool.core.kvshares import ShareGrant, ShareReport
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.core.ports import Backend
from gpupool.hardware.units import Resources

DEFAULT_MARGIN = 0.1
"""Share validity ends this fraction of the TTL before the leader's lease (clock-rate slack)."""
ENDED_MEMORY = 4096


@dataclass(slots=True)
class _Book:
    backend: Backend
    share_mib: int = 0
    cap_mib: int = 0
    target_mib: int = 0
    valid_until: float = float("-inf")
    used_mib: int = 0
    peak_mib: int = 0
    refused_mib: int = 0
    paused: bool = False
    cut: bool = False
    """The leader granted less than the book uses (it had lost the share): no grant until use falls."""
    leases: dict[str, Lease] = field(default_factory=dict)

    @property
    def slice_id(self) -> str:
        return KV_PREFIX + self.backend.id


class ReplicaShares:
    def __init__(
        self,
        *,
        now: Callable[[], float],
        lease_ids: Callable[[], str],
        margin: float = DEFAULT_MARGIN,
        headroom_div: int = 16,
    ) -> None:
        if not 0 <= margin < 1:
            raise ValueError(f"margin={margin}: must be in [0, 1)")
        self._now = now
        self._lease_ids = lease_ids
        self.margin = margin
        self.headroom_div = headroom_div
        self._books: dict[str, _Book] = {}
        """backend id -> book."""
        self._by_model: dict[str, list[_Book]] = {}
        self._by_slice: dict[str, _Book] = {}
        self._where: dict[str, _Book] = {}
        self._expiry: list[tuple[float, str]] = []
        self._ended: OrderedDict[str, Lease] = OrderedDict()
        self.seq = 0
        self._sent_at: float | None = None
        """When the latest call (``seq``) was sent; None once its answer was applied."""

    # ------------------------------------------------------------------ backends
    def set_backends(self, backends: Mapping[str, Backend]) -> None:
        """The leader's backends: new ones get an empty book; a vanished one's leases are revoked."""
        for bid in list(self._books):
            if bid not in backends:
                self._lapse(self._books.pop(bid), "backend removed by the leader")
        for bid, b in backends.items():
            book = self._books.get(bid)
            if book is None:
                self._books[bid] = _Book(b)
            elif book.backend != b:
                book.backend = b
        self._by_model = {}
        for book in sorted(self._books.values(), key=lambda x: x.backend.id):
            self._by_model.setdefault(book.backend.model, []).append(book)
        self._by_slice = {b.slice_id: b for b in self._books.values()}

    def backends(self) -> dict[str, Backend]:
        return {bid: b.backend for bid, b in self._books.items()}

    # ------------------------------------------------------------------ grants
    def grant(self, request: Request, prefer: str = "") -> Lease | None:
        """A request lease inside a valid share of ``request.model``: ``prefer`` (a KV slice id) when
        it has room, else the book with the most room left (ties by backend id); None if none has."""
        need = request.demand.vram_mib
        now = self._now()
        sheddable = request.priority < 0
        best: _Book | None = None
        pb = self._by_slice.get(prefer) if prefer else None
        if pb is not None and pb.backend.model == request.model and _fits(pb, need, now, sheddable):
            best = pb
        else:
            room = -1
            for b in self._by_model.get(request.model, ()):
                if _fits(b, need, now, sheddable) and b.cap_mib - b.used_mib > room:
                    best, room = b, b.cap_mib - b.used_mib
        if best is None:
            return None
        lease = Lease(
            id=self._lease_ids(),
            request=request,
            node=best.backend.node,
            grants=(Grant(best.slice_id, best.backend.gpu_id, Resources(need, 0)),),
            granted_at=now,
            expires_at=now + request.ttl_s,
        )
        best.used_mib += need
        best.peak_mib = max(best.peak_mib, best.used_mib)
        best.leases[lease.id] = lease
        self._where[lease.id] = best
        expiry = self._expiry
        heapq.heappush(expiry, (lease.expires_at, lease.id))
        if len(expiry) > 2 * len(self._where) + COMPACT_SLACK:
            self._expiry = compact_expiry(expiry, self._where)
        return lease

    def refused(self, model: str, need_mib: int) -> None:
        """Record demand that found no room (it raises the next report's want)."""
        books = self._by_model.get(model, ())
        if books:
            b = max(books, key=lambda x: (x.cap_mib - x.used_mib, x.backend.id))
            b.refused_mib = min(b.backend.kv_budget_mib, b.refused_mib + need_mib)

    def end(self, lease_id: str, state: LeaseState, reason: str) -> Lease | None:
        book = self._where.pop(lease_id, None)
        if book is None:
            return None
        lease = book.leases.pop(lease_id)
        book.used_mib -= lease.grants[0].resources.vram_mib
        ended = lease.with_state(state, at=self._now(), reason=reason)
        self._remember(ended)
        return ended

    def expire_due(self) -> int:
        """End request leases past their TTL and lapse shares past their validity; how many ended."""
        now = self._now()
        n = 0
        for b in self._books.values():
            if b.share_mib and now >= b.valid_until:
                n += self._lapse(b, "kv share lapsed: no renewal from the leader in time")
        while self._expiry and self._expiry[0][0] <= now:
            _, lid = heapq.heappop(self._expiry)
            book = self._where.get(lid)
            if book is not None and book.leases[lid].expires_at <= now:
                self.end(lid, LeaseState.EXPIRED, "ttl passed without renewal")
                n += 1
        return n

    def _lapse(self, b: _Book, reason: str) -> int:
        b.share_mib = b.cap_mib = 0
        n = len(b.leases)
        for lid in list(b.leases):
            self.end(lid, LeaseState.REVOKED, reason)
        return n

    # ------------------------------------------------------------------ renewal
    def report(self) -> tuple[int, dict[str, ShareReport]]:
        """Start a renewal: the call's ``seq`` and per-backend reports; caps drop to the holds."""
        self.expire_due()
        self.seq += 1
        self._sent_at = self._now()
        out: dict[str, ShareReport] = {}
        for bid, b in self._books.items():
            hold = min(b.cap_mib, max(b.used_mib, b.target_mib))
            b.cap_mib = hold
            budget = b.backend.kv_budget_mib
            want = min(
                budget, max(b.peak_mib, b.used_mib) + b.refused_mib + max(1, budget // self.headroom_div)
            )
            out[bid] = ShareReport(hold, b.used_mib, want)
            b.peak_mib, b.refused_mib = b.used_mib, 0
        return self.seq, out

    def apply(
        self, seq: int, ttl_s: float, grants: Mapping[str, ShareGrant], paused: frozenset[str] = frozenset()
    ) -> bool:
        """The leader's answer to call ``seq``; False (nothing changed) unless it is the latest call."""
        if seq != self.seq or self._sent_at is None:
            return False
        valid = self._sent_at + ttl_s * (1 - self.margin)
        self._sent_at = None
        for bid, g in grants.items():
            b = self._books.get(bid)
            if b is None:
                continue
            b.share_mib = b.cap_mib = g.share_mib
            b.target_mib = g.target_mib
            b.valid_until = valid if g.share_mib else float("-inf")
            b.paused = bid in paused
            b.cut = b.used_mib > b.cap_mib
            if g.share_mib == 0 and b.leases:
                self._lapse(b, "kv share withdrawn by the leader")
        return True

    # ------------------------------------------------------------------ reading
    def get(self, lease_id: str) -> Lease | None:
        book = self._where.get(lease_id)
        return book.leases[lease_id] if book is not None else self._ended.get(lease_id)

    def active(self) -> Iterator[Lease]:
        for b in self._books.values():
            yield from b.leases.values()

    def __len__(self) -> int:
        return len(self._where)

    def load(self, slice_id: str) -> tuple[int, int]:
        """(MiB used by request leases, KV budget MiB) of one KV slice; (0, 0) if unknown."""
        b = self._by_slice.get(slice_id)
        return (0, 0) if b is None else (b.used_mib, b.backend.kv_budget_mib)

    def usage(self, backend_id: str) -> tuple[int, int, int, int]:
        """(share MiB, cap MiB, used MiB, request leases) of one backend."""
        b = self._books.get(backend_id)
        return (0, 0, 0, 0) if b is None else (b.share_mib, b.cap_mib, b.used_mib, len(b.leases))

    def valid(self, backend_id: str) -> bool:
        b = self._books.get(backend_id)
        return b is not None and b.share_mib > 0 and self._now() < b.valid_until

    def check(self) -> None:
        for bid, b in self._books.items():
            used = sum(x.grants[0].resources.vram_mib for x in b.leases.values())
            if b.cut and b.used_mib <= b.cap_mib:
                b.cut = False
            if used != b.used_mib or b.cap_mib > b.share_mib or (b.used_mib > b.cap_mib and not b.cut):
                raise InvariantViolation(
                    f"replica book {bid}: used {b.used_mib} (leases {used}), "
                    f"cap {b.cap_mib}, share {b.share_mib}"
                )
        if len(self._where) != sum(len(b.leases) for b in self._books.values()):
            raise InvariantViolation("replica books: a lease is in no book or in two")

    def _remember(self, lease: Lease) -> None:
        self._ended[lease.id] = lease
        if len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)


def _fits(b: _Book, need: int, now: float, sheddable: bool) -> bool:
    return b.cap_mib - b.used_mib >= need and now < b.valid_until and not (sheddable and b.paused)
