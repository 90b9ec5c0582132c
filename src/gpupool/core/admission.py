"""`AdmissionQueue`: bounded priority bands with deadlines, per-tenant deficit round robin inside a
band, per-item capacity *holds* instead of head-of-line blocking, and a minimum share for sheddable work.

Role: the policy of *who goes next* when the pool is short. It never allocates itself: `drain` offers
every queued item, in order, to a ``try_grant`` callback (the controller) together with the capacity
units (slice ids) it must not take, and the callback answers GRANTED, DROPPED, or BLOCKED with the
units the item *holds* (reserves) while it waits. Pure data structure; time comes in as arguments
(``now``), never from a clock; units are opaque strings to it.

The rule (the only reason a request waits):
  a request that fits now is placed now, on capacity that no queued request of a strictly higher
  or of its own band holds; it waits only when every unit that could take it now is held by such a
  request. A request holds only units it could use itself (a slice of a kind, node, GPU and model it
  accepts and large enough for its demand; N whole cards of one node for an N-GPU request), so a
  waiting request never holds back a request that competes for other capacity, and never one of a
  strictly higher band.
Ordering (total, written down):
- bands by priority value, highest first (every distinct integer priority is its own band);
- inside a band, deficit round robin over tenants: a tenant's next item is offered while its deficit
  covers the item's cost (VRAM MiB x GPUs); otherwise the tenant gets ``quantum_mib`` more and goes to
  the back of the round. Tenants enter the round in arrival order; inside a tenant, FIFO (``seq``).
  A grant is charged to the deficit; a blocked item costs nothing and the next item is offered.
- one `drain` is one pass over every item in that order. An item is offered with the units held by
  the items before it in the pass (higher bands, and its own band earlier in the round); a new
  request (`avoid`) counts as the last item of its band. Every pass recomputes the holds; a hold
  goes with its item (grant, cancel, deadline).
- minimum share: a sheddable (negative priority) item ignores the holds of online (priority >= 0)
  items while sheddable work holds less than ``p2_min_share`` of the last ``share_window`` grants
  (direct grants count too, via `record_grant`): batch gets a trickle under online load.

Invariants: ``len(self)`` equals the items in all bands; every queued ticket is in exactly one tenant
FIFO and in the deadline heap (lazy deletion); every hold belongs to a queued item and is counted in
its band's ``held`` counter; bands never exceed ``max_per_band`` items and the queue never exceeds
``max_total``.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.core.errors import DuplicateId, InvalidInput
from gpupool.core.model import Request
from gpupool.core.priority import band as band_name


class Verdict(StrEnum):
    GRANTED = "granted"
    BLOCKED = "blocked"
    """The pool cannot hold it now: keep it queued, holding the units the callback names."""
    DROPPED = "dropped"
    """It can never be placed, failed, or was cancelled: take it out of the queue and go on."""


NOTHING: frozenset[str] = frozenset()

TryGrant = Callable[["Ticketed", frozenset[str]], tuple[Verdict, frozenset[str]]]
"""``try_grant(item, avoid)``: place ``item`` on units outside ``avoid``; answer the verdict and, when
BLOCKED, the units it holds while it waits (empty: it holds nothing)."""


@dataclass(frozen=True, slots=True)
class Ticketed:
    """A queued request, waiting for capacity until ``deadline_at``."""

    ticket: str
    request: Request
    enqueued_at: float
    deadline_at: float
    seq: int
    gpu_id: str = ""
    """Placement restricted to this GPU ('' = any)."""
    kv: bool = False
    """A request lease on a model instance's KV budget (not a slice lease)."""
    holder: str = ""
    """KV slice holding the prefix of the request's session: it waits for room there first."""
    session: str = ""
    """The request's session ("" for none)."""
    patience_s: float = 0.0
    """How long after ``enqueued_at`` it waits for room on ``holder`` before taking any slice."""
    scope: tuple[object, ...] = field(init=False, repr=False, compare=False)
    """Everything but priority and demand that decides where it may go (memo key of a pump pass)."""

    def __post_init__(self) -> None:
        r = self.request
        scope = (self.kv, self.gpu_id, r.kinds, r.nodes, r.model if self.kv else "", r.gpu_count, self.holder)
        object.__setattr__(self, "scope", scope)

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


@dataclass
class _Band:
    fifo: dict[str, deque[Ticketed]] = field(default_factory=dict)
    rr: deque[str] = field(default_factory=deque)
    deficit: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    """Unit -> number of this band's items holding it."""
    size: int = 0


class AdmissionQueue:
    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = config or AdmissionConfig()
        self._bands: dict[int, _Band] = {}
        self._order: list[int] = []  # negated priorities, ascending = highest priority first
        self._items: dict[str, Ticketed] = {}
        self._holds: dict[str, frozenset[str]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._recent: deque[bool] = deque(maxlen=self.config.share_window)
        self._recent_sheddable = 0
        self._seq = 0
        self._avoid_cache: dict[tuple[int, bool], frozenset[str]] = {}
        """(priority, ignoring online holds) -> `avoid` answer; cleared whenever a hold changes."""

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

    def holds(self, ticket: str) -> frozenset[str]:
        """The units a queued item holds (empty for an unknown ticket)."""
        return self._holds.get(ticket, NOTHING)

    def share_ok(self) -> bool:
        """Sheddable work holds less than its minimum share of recent grants."""
        if not self._recent:
            return self.config.p2_min_share > 0
        return self._recent_sheddable < self.config.p2_min_share * len(self._recent)

    def avoid(self, priority: int) -> frozenset[str]:
        """Units a new request of ``priority`` must not take: those held by queued items of its band
        or a higher one (a sheddable newcomer ignores online holds while `share_ok` holds)."""
        skip_online = priority < 0 and self.share_ok()
        key = (priority, skip_online)
        hit = self._avoid_cache.get(key)
        if hit is not None:
            return hit
        out: set[str] = set()
        for neg in self._order:
            prio = -neg
            if prio < priority:
                break
            if skip_online and prio >= 0:
                continue
            out.update(self._bands[prio].held)
        self._avoid_cache[key] = ans = frozenset(out)
        return ans

    # ------------------------------------------------------------------ changes
    def push(self, item: Ticketed, holds: frozenset[str] = NOTHING) -> bool:
        """Queue ``item`` (holding ``holds``); False when its band or the queue is full (shed it)."""
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
        self._items[item.ticket] = item
        self._hold(b, item.ticket, holds)
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

    def drain(self, try_grant: TryGrant) -> list[Ticketed]:
        """One pass over every item in the documented order; return the granted items."""
        granted: list[Ticketed] = []
        held_all = held_shed = NOTHING
        for neg in list(self._order):
            prio = -neg
            b = self._bands[prio]
            gone: set[str] = set()
            for item in self._round(b):
                shed_pass = prio < 0 and self.share_ok()
                verdict, holds = try_grant(item, held_shed if shed_pass else held_all)
                if verdict is Verdict.BLOCKED:
                    if self._holds.get(item.ticket, NOTHING) != holds:  # NOTE: the common case is "same"
                        self._hold(b, item.ticket, holds)
                    if holds:
                        if not holds <= held_all:  # NOTE: one set object per change, not per item
                            held_all = held_all | holds
                        if prio < 0 and not holds <= held_shed:
                            held_shed = held_shed | holds
                    continue
                if verdict is Verdict.GRANTED:
                    b.deficit[item.request.tenant] -= item.cost
                    self.record_grant(prio)
                    granted.append(item)
                gone.add(item.ticket)
            for tenant in list(b.rr):
                kept = deque(x for x in b.fifo[tenant] if x.ticket not in gone)
                dropped = [x for x in b.fifo[tenant] if x.ticket in gone]
                b.fifo[tenant] = kept
                for x in dropped:
                    self._forget(x)
        return granted

    # ------------------------------------------------------------------ internals
    def _round(self, b: _Band) -> Iterator[Ticketed]:
        """Every item of band ``b`` once, in deficit-round-robin order (the FIFOs do not change
        during the round; the consumer charges grants to the deficit before asking for more)."""
        quantum = self.config.quantum_mib
        nxt = dict.fromkeys(b.rr, 0)
        rr = deque(b.rr)
        misses = 0
        while rr:
            tenant = rr[0]
            q = b.fifo[tenant]
            i = nxt[tenant]
            if i >= len(q):
                rr.popleft()
                misses = 0
                continue
            head = q[i]
            if b.deficit[tenant] < head.cost:
                misses += 1
                if misses > len(rr):  # a whole round without an offer: skip the idle rounds at once
                    short = [
                        -(-(b.fifo[t][nxt[t]].cost - b.deficit[t]) // quantum)
                        for t in rr
                        if nxt[t] < len(b.fifo[t])
                    ]
                    rounds = min(short, default=0)
                    if rounds > 1:
                        for t in rr:
                            if nxt[t] < len(b.fifo[t]):
                                b.deficit[t] += (rounds - 1) * quantum
                    misses = 0
                b.deficit[tenant] += quantum
                rr.rotate(-1)
                continue
            misses = 0
            nxt[tenant] = i + 1
            yield head

    def _hold(self, b: _Band, ticket: str, holds: frozenset[str]) -> None:
        old = self._holds.pop(ticket, NOTHING)
        held = b.held
        for u in old:
            n = held[u] - 1
            if n:
                held[u] = n
            else:
                del held[u]
        if holds:
            self._holds[ticket] = holds
            for u in holds:
                held[u] = held.get(u, 0) + 1
        if old or holds:
            self._avoid_cache.clear()

    def _forget(self, item: Ticketed) -> None:
        """Drop ``item`` (already out of its FIFO) from the books; its heap entry goes stale."""
        del self._items[item.ticket]
        b = self._bands[item.priority]
        self._hold(b, item.ticket, NOTHING)
        b.size -= 1
        tenant = item.request.tenant
        q = b.fifo.get(tenant)
        if q is not None and not q:
            del b.fifo[tenant]
            del b.deficit[tenant]
            b.rr.remove(tenant)
        if b.size == 0:
            del self._bands[item.priority]
            self._order.remove(-item.priority)
        if len(self._heap) > 4 * len(self._items) + 1024:
            self._heap = [e for e in self._heap if e[2] in self._items]
            heapq.heapify(self._heap)


__all__ = ["NOTHING", "AdmissionConfig", "AdmissionQueue", "Ticketed", "TryGrant", "Verdict"]
