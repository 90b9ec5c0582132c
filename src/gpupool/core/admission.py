"""`AdmissionQueue`: bounded priority bands with deadlines, per-tenant deficit round robin inside a
band, head-of-line blocking between bands that compete, and a minimum share for sheddable work.

Role: the policy of *who goes next* when the pool is short. It never allocates itself: `drain` hands
candidates, in order, to a ``try_grant`` callback (the controller) that answers GRANTED, BLOCKED or
DROPPED. Pure data structure; time comes in as arguments (``now``), never from a clock.

Order (total, written down):
- bands by priority value, highest first (every distinct integer priority is its own band);
- inside a band, deficit round robin over tenants: a tenant's head is served while its deficit covers
  the head's cost (VRAM MiB x GPUs); otherwise the tenant gets ``quantum_mib`` more and goes to the back
  of the round. Tenants enter the round in arrival order; inside a tenant, FIFO (``seq``).
- a head that the pool cannot hold now (BLOCKED) blocks its band, and every lower band whose heads
  *compete* with it (overlapping ``keys``: slice kinds, or the model of a request lease). Lower bands
  that do not compete keep flowing (a P1 waiting for MIG does not hold back P2 work on MPS).
- minimum share: a sheddable (negative priority) head may pass a competing blocker while sheddable
  work holds less than ``p2_min_share`` of the last ``share_window`` grants (direct grants count too,
  via `record_grant`), so batch gets a trickle under online load and the whole pool when it is idle.

Invariants: ``len(self)`` equals the items in all bands; every queued ticket is in exactly one tenant
FIFO, in the deadline heap (lazy deletion) and in the per-band key counters; bands never exceed
``max_per_band`` items and the queue never exceeds ``max_total``.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.core.errors import DuplicateId, InvalidInput
from gpupool.core.model import Request
from gpupool.core.priority import band as band_name
from gpupool.hardware.slices import SliceKind


class Verdict(StrEnum):
    GRANTED = "granted"
    BLOCKED = "blocked"
    """The pool cannot hold it now: keep it queued and stop this band (head-of-line)."""
    DROPPED = "dropped"
    """It can never be placed (or was cancelled): take it out of the queue and go on."""


@dataclass(frozen=True, slots=True)
class Ticketed:
    """A queued request, waiting for capacity until ``deadline_at``."""

    ticket: str
    request: Request
    enqueued_at: float
    deadline_at: float
    seq: int
    keys: frozenset[str] = frozenset()
    """What it competes for (slice kinds, ``model:NAME``); empty competes with everything."""
    gpu_id: str = ""

    @property
    def cost(self) -> int:
        return self.request.demand.vram_mib * self.request.gpu_count

    @property
    def priority(self) -> int:
        return self.request.priority


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    max_per_band: int = 1024
    max_total: int = 4096
    quantum_mib: int = 8192
    p2_min_share: float = 0.10
    share_window: int = 100
    wait_s: tuple[float, float, float] = (5.0, 30.0, 300.0)
    """Default queue deadline of P0, P1 and P2 bands (seconds)."""
    max_wait_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_per_band", "max_total", "quantum_mib", "share_window"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise InvalidInput(f"admission.{name}", v, "must be an integer >= 1")
        if not 0.0 <= self.p2_min_share <= 1.0:
            raise InvalidInput("admission.p2_min_share", self.p2_min_share, "must be in [0, 1]")
        if any(not 0 < w <= self.max_wait_s for w in self.wait_s):
            raise InvalidInput("admission.wait_s", self.wait_s, f"each must be in (0, {self.max_wait_s}]")

    def default_wait_s(self, priority: int) -> float:
        return self.wait_s[{"P0": 0, "P1": 1, "P2": 2}[band_name(priority)]]


_DEFAULT_KINDS = frozenset({SliceKind.MIG.value, SliceKind.MPS.value, SliceKind.WHOLE.value})


def competition_keys(request: Request, *, kv: bool = False) -> frozenset[str]:
    """What a request competes for: the slice kinds it accepts, or ``model:NAME`` for a request lease."""
    if kv:
        return frozenset({"model:" + request.model})
    if request.gpu_count > 1:
        return frozenset({SliceKind.WHOLE.value})
    if not request.kinds:
        return _DEFAULT_KINDS
    return frozenset(k.value for k in request.kinds)


def overlaps(a: frozenset[str], b: frozenset[str] | set[str]) -> bool:
    """Empty key sets compete with everything."""
    if not a or not b:
        return True
    return not a.isdisjoint(b)


@dataclass
class _Band:
    fifo: dict[str, deque[Ticketed]] = field(default_factory=dict)
    rr: deque[str] = field(default_factory=deque)
    deficit: dict[str, int] = field(default_factory=dict)
    keys: Counter[str] = field(default_factory=Counter)
    wildcards: int = 0
    size: int = 0

    def competes(self, keys: frozenset[str]) -> bool:
        if self.size == 0:
            return False
        if self.wildcards or not keys:
            return True
        return any(self.keys[k] for k in keys)


class AdmissionQueue:
    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = config or AdmissionConfig()
        self._bands: dict[int, _Band] = {}
        self._order: list[int] = []  # negated priorities, ascending = highest priority first
        self._items: dict[str, Ticketed] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._recent: deque[bool] = deque(maxlen=self.config.share_window)
        self._recent_sheddable = 0
        self._seq = 0

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, ticket: str) -> bool:
        return ticket in self._items

    def get(self, ticket: str) -> Ticketed | None:
        return self._items.get(ticket)

    def __iter__(self) -> Iterator[Ticketed]:
        """Every queued item, band by band (highest first), FIFO per tenant, tenants in round order."""
        for neg in self._order:
            b = self._bands[-neg]
            for t in b.rr:
                yield from b.fifo[t]

    def depth_by_band(self) -> dict[str, int]:
        out = {"P0": 0, "P1": 0, "P2": 0}
        for prio, b in self._bands.items():
            out[band_name(prio)] += b.size
        return out

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def share_ok(self) -> bool:
        """Sheddable work holds less than its minimum share of recent grants."""
        if not self._recent:
            return self.config.p2_min_share > 0
        return self._recent_sheddable < self.config.p2_min_share * len(self._recent)

    def must_wait(self, priority: int, keys: frozenset[str]) -> bool:
        """A newcomer must queue: a competing item of its band or a higher one is already waiting.

        Sheddable newcomers ignore higher (non-sheddable) bands while `share_ok` holds.
        """
        skip_online = priority < 0 and self.share_ok()
        for neg in self._order:
            prio = -neg
            if prio < priority:
                break
            if skip_online and prio >= 0:
                continue
            if self._bands[prio].competes(keys):
                return True
        return False

    # ------------------------------------------------------------------ changes
    def push(self, item: Ticketed) -> bool:
        """Queue ``item``; False when its band or the whole queue is full (the caller sheds it)."""
        if item.ticket in self._items:
            raise DuplicateId("ticket", item.ticket)
        b = self._bands.get(item.priority)
        if len(self._items) >= self.config.max_total or (
            b is not None and b.size >= self.config.max_per_band
        ):
            return False
        if b is None:
            b = self._bands[item.priority] = _Band()
            bisect.insort(self._order, -item.priority)
        q = b.fifo.get(item.request.tenant)
        if q is None:
            q = b.fifo[item.request.tenant] = deque()
            b.rr.append(item.request.tenant)
            b.deficit[item.request.tenant] = 0
        q.append(item)
        b.size += 1
        if item.keys:
            b.keys.update(item.keys)
        else:
            b.wildcards += 1
        self._items[item.ticket] = item
        heapq.heappush(self._heap, (item.deadline_at, item.seq, item.ticket))
        return True

    def remove(self, ticket: str) -> Ticketed | None:
        item = self._items.get(ticket)
        if item is None:
            return None
        q = self._bands[item.priority].fifo[item.request.tenant]
        q.remove(item)
        self._forget(item)
        return item

    def expire(self, now: float) -> list[Ticketed]:
        """Take out every item whose deadline is <= ``now``, earliest deadline first."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            _, _, ticket = heapq.heappop(self._heap)
            item = self.remove(ticket)
            if item is not None:
                out.append(item)
        return out

    def record_grant(self, priority: int) -> None:
        """Count a grant (queued or direct) toward the minimum-share window."""
        if len(self._recent) == self._recent.maxlen and self._recent[0]:
            self._recent_sheddable -= 1
        shed = priority < 0
        self._recent.append(shed)
        self._recent_sheddable += shed

    def drain(self, try_grant: Callable[[Ticketed], Verdict]) -> list[Ticketed]:
        """Offer heads to ``try_grant`` in the documented order; return the granted items."""
        granted: list[Ticketed] = []
        blocked: set[str] = set()
        blocked_all = False
        quantum = self.config.quantum_mib
        for neg in list(self._order):
            prio = -neg
            b = self._bands.get(prio)
            if b is None:
                continue
            while b.rr:
                tenant = b.rr[0]
                q = b.fifo[tenant]
                head = q[0]
                competing = blocked_all or (bool(blocked) and overlaps(head.keys, blocked))
                if competing and not (prio < 0 and self.share_ok()):
                    break
                if b.deficit[tenant] < head.cost:
                    b.deficit[tenant] += quantum
                    b.rr.rotate(-1)
                    continue
                verdict = try_grant(head)
                if verdict is Verdict.BLOCKED:
                    if head.keys:
                        blocked |= head.keys
                    else:
                        blocked_all = True
                    break
                if verdict is Verdict.GRANTED:
                    b.deficit[tenant] -= head.cost
                    self.record_grant(prio)
                    granted.append(head)
                q.popleft()
                self._forget(head)
        return granted

    # ------------------------------------------------------------------ internals
    def _forget(self, item: Ticketed) -> None:
        """Drop ``item`` from the books (its deadline-heap entry goes stale, skipped by `expire`)."""
        del self._items[item.ticket]
        b = self._bands[item.priority]
        b.size -= 1
        if item.keys:
            b.keys.subtract(item.keys)
        else:
            b.wildcards -= 1
        tenant = item.request.tenant
        if not b.fifo[tenant]:
            del b.fifo[tenant]
            del b.deficit[tenant]
            b.rr.remove(tenant)
        if b.size == 0:
            del self._bands[item.priority]
            self._order.remove(-item.priority)
        if len(self._heap) > 4 * len(self._items) + 1024:
            self._heap = [e for e in self._heap if e[2] in self._items]
            heapq.heapify(self._heap)


__all__ = ["AdmissionConfig", "AdmissionQueue", "Ticketed", "Verdict", "competition_keys", "overlaps"]
