"""`ShareDelegator`: the leader's side of KV-share delegation to proxy replicas.

Role: request leases (one per proxied inference request, thousands per second) must not each reach
the leader or its store. The leader instead delegates to every proxy replica a *share* of every
model instance's KV budget; the replica grants request leases locally inside it
(`gpupool.core.kvreplica`). A share is itself a lease in the KV allocator's ledger (tenant
`SHARE_TENANT`, one per replica incarnation and backend), so the ledger counts every delegated MiB,
and it carries an expiry: a replica that stops renewing loses its share when it expires, nothing
more, and the room goes back to the others.

Protocol (one call per replica every ``ttl_s / 3``; `renew`): the replica sends, per backend,
``hold_mib`` (the share it keeps and promises not to exceed until the answer arrives: never more
than it was last granted), ``used_mib`` and ``want_mib`` (its demand: peak use + refused demand +
headroom), with a sequence number. The leader shrinks the share lease to ``hold`` (safe: the
replica promised), then grows it towards the replica's fair ``target`` by at most the slice's free
room, and answers ``share_mib`` (>= hold) and ``target_mib``. The replica uses the new share until
``sent_at + ttl_s`` minus a margin on its own clock, which ends before the leader's lease (set from
the moment it *received* the call); a share above target is shrunk by the replica itself at its
next renewal (to ``max(used, target)``), so rebalancing never takes room a replica is using.

Targets are max-min fair over the replicas' wants (`fair_shares`): a replica wanting less than the
fair level gets its want, the rest share the remainder equally; the pool split is the slice's free
room plus the replicas' current shares (what the leader's own lane and queued requests hold is not
redistributed). No share grows on a slice a queued request holds (``held``), and there the target
drops to what the replica uses, so its unused room goes back to the queue at its next call.

Sequence numbers: a call with ``seq`` not above the last one processed for that incarnation is
refused (`StaleShareReport`), so a delayed, retried call cannot resize a share after a later one.
A restarted replica is a new incarnation: its old shares simply expire.

On an unhealthy KV slice (its GPU degraded or drained) a share is never grown nor re-adopted;
an existing one is renewed as it is and its target drops to the replica's use, so it drains. A
share revoked by the leader (a failed GPU) is known to its replica only at its next call.

Invariants (checked by `check`): per KV slice the shares are leases in the allocator (so their sum
plus every other KV lease never exceeds the budget: the ledger's own invariant); each recorded share
equals its active lease's VRAM; a granted share is never below the hold its call reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpupool.core.allocator import Allocator
from gpupool.core.errors import GpupoolError, InvalidInput, InvariantViolation
from gpupool.core.kvbackends import KV_PREFIX, REPLICA_SHARE_TENANT
from gpupool.core.model import Request
from gpupool.core.ports import Backend
from gpupool.core.priority import PRIORITY_MAX
from gpupool.hardware.units import Resources

SHARE_TENANT = REPLICA_SHARE_TENANT
"""Tenant of replica share leases (never a real tenant: tenants cannot see or release them; they
are not listed among request leases)."""
MIN_TTL_S = 0.5
MAX_TTL_S = 60.0
MAX_ID_CHARS = 128


class StaleShareReport(GpupoolError):
    """A share call whose sequence number is not above the last one processed (a delayed retry)."""

    def __init__(self, holder: str, seq: int, last: int) -> None:
        super().__init__(f"share report seq {seq} of {holder} is stale (last processed {last})")
        self.seq, self.last = seq, last


@dataclass(frozen=True, slots=True)
class ShareReport:
    hold_mib: int
    used_mib: int
    want_mib: int


@dataclass(frozen=True, slots=True)
class ShareGrant:
    share_mib: int
    target_mib: int


@dataclass(slots=True)
class _Share:
    lease_id: str
    """Its lease in the KV allocator; "" while the holder has no room yet (only a want)."""
    mib: int
    want_mib: int
    until: float
    """A want without a lease counts in the fair split until then (the call's time + ttl)."""


@dataclass(slots=True)
class _Holder:
    replica: str
    seq: int = -1
    shares: dict[str, _Share] = field(default_factory=dict)
    """backend id -> its share (lease active at the last look; `_live` re-checks)."""


def fair_shares(pool_mib: int, wants: Mapping[str, int]) -> dict[str, int]:
    """Max-min fair integer split of ``pool_mib`` over ``wants``: nobody gets more than it wants;
    whoever gets less than it wants gets at least as much as anybody else (the leftover MiB of the
    integer division go to the first holders in id order). Sum <= ``pool_mib``."""
    out: dict[str, int] = {}
    left = max(0, pool_mib)
    order = sorted(wants, key=lambda h: (wants[h], h))
    for i, h in enumerate(order):
        n = len(order) - i
        level = left // n
        give = min(max(0, wants[h]), level)
        out[h] = give
        left -= give
    # integer leftovers: those capped by the level (not by their want) get one more MiB each
    for h in sorted(out):
        if left <= 0:
            break
        if out[h] < wants[h]:
            out[h] += 1
            left -= 1
    return out


class ShareDelegator:
    def __init__(
        self,
        kv: Allocator,
        *,
        backends: Callable[[], Mapping[str, Backend]],
        held: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        """``backends``: the registered model instances (KV slice ``kv/<id>`` each); ``held``: KV
        slice ids that queued requests hold (no share grows there)."""
        self.kv = kv
        self._backends = backends
        self._held = held
        self._holders: dict[str, _Holder] = {}
        self.calls = 0
        """Share calls processed (the leader's whole per-replica cost of the request path)."""

    # ------------------------------------------------------------------ the call
    def renew(
        self,
        replica: str,
        incarnation: str,
        seq: int,
        reports: Mapping[str, ShareReport],
        *,
        ttl_s: float,
    ) -> dict[str, ShareGrant]:
        """Process one share call (see the module docstring); returns a grant for every backend.
        Raises `InvalidInput` (nothing changed) or `StaleShareReport`."""
        holder_id = _holder_id(replica, incarnation)
        _check_seq(seq)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s):
            raise InvalidInput("ttl_s", ttl_s, "must be a finite number of seconds")
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise InvalidInput("ttl_s", ttl_s, f"must be in [{MIN_TTL_S}, {MAX_TTL_S}] s")
        backends = self._backends()
        for bid, r in reports.items():
            if bid not in backends:
                raise InvalidInput(f"shares.{bid}", bid, "no such backend")
            for name in ("hold_mib", "used_mib", "want_mib"):
                v = getattr(r, name)
                if type(v) is not int or v < 0:
                    raise InvalidInput(f"shares.{bid}.{name}", v, "must be an integer >= 0")
        h = self._holders.get(holder_id)
        if h is not None and seq <= h.seq:
            raise StaleShareReport(holder_id, seq, h.seq)
        if h is None:
            h = self._holders[holder_id] = _Holder(replica)
        h.seq = seq
        self.calls += 1
        self.kv.expire_due()
        held = self._held()
        out: dict[str, ShareGrant] = {}
        for bid in sorted(backends):
            r = reports.get(bid, ShareReport(0, 0, 0))
            out[bid] = self._one(holder_id, h, backends[bid], r, ttl_s=ttl_s, queued=KV_PREFIX + bid in held)
        if not h.shares:
            del self._holders[holder_id]
        return out

    def release_all(self, replica: str, incarnation: str) -> int:
        """A replica stopping cleanly gives every share back at once. Returns how many ended."""
        h = self._holders.pop(_holder_id(replica, incarnation), None)
        n = 0
        for s in h.shares.values() if h is not None else ():
            if s.lease_id and self.kv.leases.active(s.lease_id) is not None:
                self.kv.release(s.lease_id, reason="proxy replica stopped")
                n += 1
        return n

    def _one(
        self, holder_id: str, h: _Holder, b: Backend, r: ShareReport, *, ttl_s: float, queued: bool
    ) -> ShareGrant:
        sid = KV_PREFIX + b.id
        cur = self._live(h, b.id)
        if not self.kv.ledger.is_healthy(sid):
            # no new room on an unhealthy slice; a share there is kept (renewed, not resized: a new
            # lease could not be placed) while the replica drains it, never re-adopted
            if cur is None or not cur.lease_id:
                return ShareGrant(0, 0)
            self.kv.renew(cur.lease_id, ttl_s)
            hold = min(r.hold_mib, cur.mib)
            return ShareGrant(hold, min(hold, r.used_mib))
        free = self.kv.ledger.free(sid).vram_mib
        # what it keeps: never more than it holds now; a replica whose lease lapsed (or that a new
        # leader does not know) re-adopts what is free, up to what it reports
        hold = min(r.hold_mib, cur.mib) if cur is not None else min(r.hold_mib, free)
        others = self._shares_on(b.id, skip=holder_id)
        pool = free + (cur.mib if cur is not None else 0) + sum(m for m, _ in others.values())
        wants = {k: w for k, (_, w) in others.items()}
        wants[holder_id] = r.want_mib
        target = fair_shares(pool, wants)[holder_id]
        if queued:  # queued online requests wait for this budget: give back what is not in use
            target = min(target, r.used_mib)
        room = free + (cur.mib if cur is not None else 0) - hold
        grow = 0 if queued else max(0, min(target - hold, room))
        new = hold + grow
        self._set(h, holder_id, b, cur, mib=new, want=r.want_mib, ttl_s=ttl_s)
        return ShareGrant(new, target)

    def _set(
        self, h: _Holder, holder_id: str, b: Backend, cur: _Share | None, *, mib: int, want: int, ttl_s: float
    ) -> None:
        until = self.kv.clock.now() + ttl_s
        if cur is not None and cur.mib == mib:
            if cur.lease_id:
                self.kv.renew(cur.lease_id, ttl_s)
            cur.want_mib, cur.until = want, until
            return
        if cur is not None:
            if cur.lease_id:
                self.kv.release(cur.lease_id, reason="kv share resized")
            del h.shares[b.id]
        if mib <= 0:
            if want > 0:  # no room for it yet: its want still counts in the others' targets
                h.shares[b.id] = _Share("", 0, want, until)
            return
        req = Request(
            id=f"kv-share:{holder_id}:{b.id}",
            tenant=SHARE_TENANT,
            priority=PRIORITY_MAX,
            demand=Resources(mib, 0),
            ttl_s=ttl_s,
            model=b.model,
            preemptible=False,
            labels=(("replica", h.replica),),
        )
        out = self.kv.place(req, (KV_PREFIX + b.id,))
        if out.lease is None or not out.granted:
            if cur is not None and mib <= cur.mib:  # it held at least this a moment ago
                raise InvariantViolation(f"kv share of {holder_id} on {b.id} lost: {out.reason}")
            return  # (re-adoption on an unhealthy slice: no share)
        h.shares[b.id] = _Share(out.lease.id, mib, want, until)

    # ------------------------------------------------------------------ reading
    def _live(self, h: _Holder, bid: str) -> _Share | None:
        s = h.shares.get(bid)
        if s is None:
            return None
        gone = self.kv.leases.active(s.lease_id) is None if s.lease_id else self.kv.clock.now() >= s.until
        if gone:  # expired (the replica stopped calling) or revoked (slice failed)
            del h.shares[bid]
            return None
        return s

    def _shares_on(self, bid: str, *, skip: str) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for hid, h in list(self._holders.items()):
            if hid == skip:
                continue
            s = self._live(h, bid)
            if s is not None:
                out[hid] = (s.mib, s.want_mib)
            if not h.shares:
                del self._holders[hid]
        return out

    def shares(self, backend_id: str) -> dict[str, int]:
        """holder (``replica/incarnation``) -> share MiB on one backend, live shares only."""
        out = {}
        for hid, h in list(self._holders.items()):
            s = self._live(h, backend_id)
            if s is not None and s.mib:
                out[hid] = s.mib
        return out

    def is_share(self, lease_id: str) -> bool:
        return bool(lease_id) and any(
            s.lease_id == lease_id for h in self._holders.values() for s in h.shares.values()
        )

    def check(self) -> None:
        for bid, b in self._backends().items():
            total = 0
            for hid, h in self._holders.items():
                s = h.shares.get(bid)
                if s is None or not s.lease_id:
                    continue
                lease = self.kv.leases.active(s.lease_id)
                if lease is not None and lease.total.vram_mib != s.mib:
                    raise InvariantViolation(f"kv share {hid} on {bid}: {s.mib} MiB, lease {lease.total}")
                if lease is not None:
                    total += s.mib
            if total > b.kv_budget_mib:
                raise InvariantViolation(f"kv shares on {bid}: {total} MiB > budget {b.kv_budget_mib}")


def _holder_id(replica: str, incarnation: str) -> str:
    for name, v in (("replica", replica), ("incarnation", incarnation)):
        if not isinstance(v, str) or not v or len(v) > MAX_ID_CHARS or not v.isprintable() or "/" in v:
            raise InvalidInput(name, v, f"must be 1-{MAX_ID_CHARS} printable characters without '/'")
    return f"{replica}/{incarnation}"


def _check_seq(seq: int) -> None:
    if type(seq) is not int or seq < 0:
        raise InvalidInput("seq", seq, "must be an integer >= 0")
