"""`SessionTable`: where each session's prefix KV lives, per model instance, as leases in the KV ledger.

Role: the gateway's view of the engines' prefix caches. A *session* (an agent conversation: the
``x-gpupool-session`` header, else OpenAI's ``user`` / ``prompt_cache_key``) sends turns that share a
growing prefix; the instance that served its last turn still holds that prefix's KV (on the GPU, or on
its host tier after the engine evicted it), so sending the next turn there saves the recompute.

Per instance (a KV slice id of the controller's KV allocator) the table keeps, for every session it
served, a `Residency`: MiB of the prefix on the GPU and on the host tier, last use, and how many of
its turns run there now (*pinned*). What an idle session keeps on the GPU is a *retained lease* in the
same KV allocator as the request leases: tenant `RETAINED_TENANT`, priority `RETAINED_PRIORITY` (below
every request), preemptible, labelled `RETAINED_LABEL` = the session. So the ledger counts retained
prefixes against the instance's KV budget like any lease, and they give way to requests:

- a turn that starts (`begin`) takes its own retained lease back (its request lease covers its whole
  prompt, prefix included);
- a turn that ends (`end`) leaves a retained lease of its prefix; when the ledger has no room for it,
  older retained leases on that instance are reclaimed first (the engine keeps the newest idle blocks);
- a request that needs room (`reclaim`) ends retained leases of *other* sessions on one instance,
  chosen by the preemption planner (`core.preemption.plan_slice`) in its victim order, which for
  retained leases is least recently used first; the victims end PREEMPTED and their residency moves
  to the host tier (the engine moves the blocks there when it needs their room, LRU; the view keeps
  them until the instance's host tier + KV capacity would overflow, oldest forgotten first: the
  ledger reclaims ahead of the engine, which evicts only the idle blocks it must).

Routing (`route`, used by the proxy): among the instances the request would keep below their *red
line* (MiB held by requests now + the request's MiB, i.e. prompt + growth to ``max_tokens``, at most
the instance's KV capacity in the ledger, which the controller sets to ``kv_red_line_pct`` of the
budget; retained prefixes do not count, they are reclaimed on admission), the cheapest: prompt tokens
already waiting there for their first token + 16 x the tokens of this prompt the session's prefix
there does not cover (the recompute delays this request and every later one there). So a session
returns to the instance holding its prefix unless the queue there costs more than recomputing
elsewhere. `prefer` is the simpler rule: the instance holding most of the prefix, below its red line.
A turn that starts counts as holding its request's MiB on the GPU while it runs (the engine holds its
prompt's blocks), so a next turn that arrives before it ends finds it.

Queueing (`holder`, used by the proxy when it passes ``holder`` / ``patience_s`` to the controller's
`acquire`): a turn that finds no room anywhere, or whose holder is over its red line, waits for room
on its *holder* (the instance holding most of its prefix) first, for ``RECOMPUTE_WEIGHT`` x the
tokens the holder saves it / the prefill rate measured there (`prefill_done`): the same trade as
`route`, in time; past that it takes any instance. The controller's pump grants it there
(`KvBackends._holder_grant`), reclaiming other sessions' retained prefixes LRU-first as for any
request.

Invariants (`check`): a retained lease exists exactly for the idle residencies with GPU MiB > 0 and
holds exactly ``gpu_mib``; per instance the host MiB <= its host tier + KV capacity; every lookup
is O(1) in the number of sessions; no clock reads (``now`` is injected).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpupool.core import preemption
from gpupool.core.allocator import Allocator
from gpupool.core.errors import InvalidInput, InvariantViolation
from gpupool.core.model import Lease, LeaseState, Request
from gpupool.core.preemption import RETAINED_LABEL
from gpupool.core.priority import PRIORITY_MIN
from gpupool.hardware.units import Resources

DEFAULT_RED_LINE_PCT = 90
SESSION_HEADER = "x-gpupool-session"
MAX_SESSION_ID_CHARS = 256
RETAINED_TENANT = "gpupool-sessions"
RETAINED_PRIORITY = PRIORITY_MIN
RETAIN_TTL_S = 3600.0
RECOMPUTE_WEIGHT = 16
"""`route` counts the tokens a request must recompute on an instance this many times: once for its
own wait, and more for the work they put ahead of every request that arrives there after it (and
the prefix cache space they take). In earlier runs of `gpupool bench kv` the weights 2, 3 and 8
recomputed more than 16; it also sets how long a queued turn waits for its holder (`holder`)."""
RATE_WEIGHT = 0.1
"""Weight of the newest measurement in an instance's moving-average prefill rate (`prefill_done`)."""


def session_of(headers: Mapping[str, str], body: Mapping[str, object]) -> str:
    """The request's session id: the header, else ``user``, else ``prompt_cache_key``; "" if none."""
    sid = headers.get(SESSION_HEADER)
    if sid is None:
        v = body.get("user")
        if not isinstance(v, str) or not v:
            v = body.get("prompt_cache_key")
        sid = v if isinstance(v, str) else ""
    return sid[:MAX_SESSION_ID_CHARS]


def is_retained(lease: Lease) -> bool:
    return lease.request.tenant == RETAINED_TENANT and lease.request.priority == RETAINED_PRIORITY


@dataclass(slots=True)
class Residency:
    session: str
    instance: str
    gpu_mib: int = 0
    host_mib: int = 0
    last_use_s: float = 0.0
    pinned: int = 0
    """Turns of this session running on this instance now."""
    lease_id: str = ""
    """Its retained lease while idle with GPU MiB ("" otherwise)."""


@dataclass(slots=True)
class _Instance:
    host_cap_mib: int
    host_mib: int = 0
    retained_mib: int = 0
    idle: OrderedDict[str, Residency] = field(default_factory=OrderedDict)
    """Idle residencies with a retained lease, least recently used first."""
    host_lru: OrderedDict[str, Residency] = field(default_factory=OrderedDict)
    """Residencies with host-tier MiB, oldest first."""


class SessionTable:
    def __init__(
        self,
        kv: Allocator,
        *,
        now: Callable[[], float],
        host_mib: int = 0,
        max_sessions: int = 100_000,
        retain_ttl_s: float = RETAIN_TTL_S,
    ) -> None:
        if type(host_mib) is not int or host_mib < 0:
            raise InvalidInput("host_mib", host_mib, "must be an integer >= 0")
        self.kv = kv
        self._now = now
        self.host_mib = host_mib
        self.max_sessions = max_sessions
        self.retain_ttl_s = retain_ttl_s
        self._instances: dict[str, _Instance] = {}
        self._sessions: OrderedDict[str, dict[str, Residency]] = OrderedDict()
        self._by_lease: dict[str, Residency] = {}
        self._seq = 0
        self._pending: dict[str, int] = {}
        """Instance -> prompt tokens admitted there still waiting for their first token."""
        self._rate: dict[str, float] = {}
        """Instance -> measured prompt tokens a second until a first token (`prefill_done`)."""
        self.red_line_hits = 0
        """Requests whose best instance was over its red line (routed elsewhere or queued for it)."""
        self.prefix_routed = 0
        """Requests granted on an instance holding part of their session's prefix (counted by the
        caller, which sees the grant)."""
        self.reclaimed = 0
        """Retained leases ended to make room (their prefixes moved to the host tier)."""

    # ------------------------------------------------------------------ instances
    def set_host_tier(self, instance: str, host_mib: int) -> None:
        """The host tier of one instance (default: ``host_mib`` of the table)."""
        if type(host_mib) is not int or host_mib < 0:
            raise InvalidInput("host_mib", host_mib, "must be an integer >= 0")
        self._inst(instance).host_cap_mib = host_mib

    def _inst(self, instance: str) -> _Instance:
        inst = self._instances.get(instance)
        if inst is None:
            inst = self._instances[instance] = _Instance(self.host_mib)
        return inst

    def _idle_cap(self, instance: str, inst: _Instance) -> int:
        """What reclaimed prefixes on ``instance`` may hold before the oldest is forgotten: its host
        tier + its KV capacity in the ledger. The engine evicts idle blocks only when it needs their
        room, least recently used first, GPU to host tier, host tier to nothing; a prefix reclaimed
        in the ledger (which counts every request's growth to ``max_tokens`` ahead of time) may
        still sit idle on the GPU, so the engine's idle blocks can fill both before it drops one."""
        ledger = self.kv.ledger
        return inst.host_cap_mib + (ledger.slice(instance).capacity.vram_mib if instance in ledger else 0)

    # ------------------------------------------------------------------ routing
    def prefer(self, session: str, need_mib: int, load: Callable[[str], tuple[int, int]]) -> str:
        """The instance holding most of ``session``'s prefix (GPU MiB, then host-tier MiB) whose red
        line the request would not cross, or "" for no preference.

        ``load(instance)`` gives (MiB held by requests now, capacity MiB = the red line) of an
        instance; only the instances holding the session's prefix are asked."""
        held = self._sessions.get(session)
        if not held:
            return ""
        best, best_key = "", (0, 0)
        crossed = False
        for r in held.values():
            key = (r.gpu_mib, r.host_mib)
            if key <= best_key:
                continue
            used, cap = load(r.instance)
            if cap <= 0:
                continue
            if used + need_mib > cap:
                crossed = True
                continue
            best, best_key = r.instance, key
        if crossed and not best:
            self.red_line_hits += 1
        return best

    def route(
        self,
        session: str,
        need_mib: int,
        prompt_tokens: int,
        instances: Iterable[str],
        load: Callable[[str], tuple[int, int]],
    ) -> tuple[str, int]:
        """(the instance where ``session``'s turn should see its first token soonest, the prompt
        tokens it will compute there), or ("", prompt) when every instance is over its red line, or
        when the instance holding most of the session's prefix is and the turn may wait for it
        there (a prefill rate is measured there: `holder` gives it a patience).

        Cost on an instance = prompt tokens waiting there for their first token (`prefill_begin` /
        `prefill_done`) + `RECOMPUTE_WEIGHT` x this prompt's tokens not covered by the session's
        prefix there (GPU or host tier: a host-tier hit costs a PCIe copy, not a recompute). Only
        instances the request would keep below their red line (``load``: held MiB, capacity MiB)
        qualify; ties go to the one with the most room, then by name."""
        held = self._sessions.get(session) if session else None
        best: tuple[int, int, str] | None = None
        best_new = prompt_tokens
        crossed = False
        top = max(held.values(), key=lambda r: (r.gpu_mib, r.host_mib), default=None) if held else None
        if top is not None and not top.gpu_mib + top.host_mib:
            top = None  # it holds nothing any more
        for inst in instances:
            used, cap = load(inst)
            if cap <= 0:
                continue
            if used + need_mib > cap:
                crossed = crossed or (top is not None and inst == top.instance)
                continue
            r = held.get(inst) if held else None
            cached = 0
            if r is not None and need_mib > 0:
                cached = prompt_tokens * min(need_mib, r.gpu_mib + r.host_mib) // need_mib
            new = prompt_tokens - cached
            key = (self._pending.get(inst, 0) + RECOMPUTE_WEIGHT * new, used - cap, inst)
            if best is None or key < best:
                best, best_new = key, new
        if crossed:
            self.red_line_hits += 1
        if best is None or (crossed and top is not None and self._rate.get(top.instance, 0.0) > 0):
            return "", prompt_tokens
        return best[2], best_new

    def holder(self, session: str, prompt_tokens: int, need_mib: int) -> tuple[str, int, float]:
        """Where a turn that must wait (every instance, or its holder, over its red line) waits first:
        (the instance holding most of ``session``'s prefix, on the GPU, in a turn running there, or
        on its host tier; the prompt tokens it would compute there; how long it may wait for room
        there before it takes any instance), or ("", prompt, 0.0) for none.

        The wait is the same trade as `route`'s, in time: `RECOMPUTE_WEIGHT` x the tokens the
        holder saves (the prefix it holds), at the prefill rate measured on the holder
        (`prefill_done`): waiting longer than that costs more than recomputing elsewhere. Without a
        measured rate the turn waits for no instance in particular (0.0)."""
        held = self._sessions.get(session) if session else None
        top = max(held.values(), key=lambda r: (r.gpu_mib, r.host_mib), default=None) if held else None
        if top is None or not top.gpu_mib + top.host_mib or need_mib <= 0:
            return "", prompt_tokens, 0.0
        cached = prompt_tokens * min(need_mib, top.gpu_mib + top.host_mib) // need_mib
        rate = self._rate.get(top.instance, 0.0)
        patience_s = RECOMPUTE_WEIGHT * cached / rate if rate > 0 and cached > 0 else 0.0
        return top.instance, prompt_tokens - cached, patience_s

    def prefill_rate(self, instance: str) -> float:
        """Prompt tokens a second a request computes on ``instance`` until its first token (moving
        average of the requests measured there; 0.0 before the first)."""
        return self._rate.get(instance, 0.0)

    def note_routed(self, session: str, instance: str) -> None:
        """A turn of ``session`` was granted on ``instance`` (before `begin`): count it in
        ``prefix_routed`` when the instance holds part of the session's prefix."""
        held = self._sessions.get(session)
        r = held.get(instance) if held else None
        if r is not None and r.gpu_mib + r.host_mib > 0:
            self.prefix_routed += 1

    def prefill_begin(self, instance: str, tokens: int) -> None:
        """``tokens`` of a prompt start waiting for their first token on ``instance``."""
        self._pending[instance] = self._pending.get(instance, 0) + max(0, tokens)

    def prefill_done(self, instance: str, tokens: int, elapsed_s: float = 0.0) -> None:
        """The first token came (or the request ended): its prompt no longer waits there. With
        ``elapsed_s`` (from its admission to its first token) it is a measurement of the
        instance's prefill rate: ``tokens`` / ``elapsed_s``, averaged with weight `RATE_WEIGHT`."""
        self._pending[instance] = max(0, self._pending.get(instance, 0) - max(0, tokens))
        if tokens > 0 and elapsed_s > 0:
            x = tokens / elapsed_s
            old = self._rate.get(instance)
            self._rate[instance] = x if old is None else old + RATE_WEIGHT * (x - old)

    # ------------------------------------------------------------------ turns
    def begin(self, session: str, instance: str, mib: int = 0) -> None:
        """A turn of ``session`` starts on ``instance`` with a request lease of ``mib``: its residency
        there is pinned (not a victim), its retained lease there, if any, is released (the turn's
        request lease holds it now), and it counts as holding ``mib`` on the GPU while the turn runs
        (the engine holds the turn's prompt blocks: a next turn arriving meanwhile finds them)."""
        if not session:
            return
        inst = self._inst(instance)
        r = self._residency(session, instance)
        r.pinned += 1
        r.last_use_s = self._now()
        self._drop_lease(inst, r)
        r.gpu_mib = max(r.gpu_mib, mib)

    def end(
        self, session: str, instance: str, prefix_mib: int, *, make_room: Callable[[], None] | None = None
    ) -> None:
        """The turn ended: the instance now holds ``prefix_mib`` of the session's prefix on the GPU,
        kept as a retained lease (older retained prefixes there are reclaimed for it when needed;
        ``make_room`` is asked first, e.g. to shrink request-lease shares). Without room it goes to
        the host tier."""
        if not session or instance not in self._instances:
            return
        inst = self._instances[instance]
        r = self._residency(session, instance)
        r.pinned = max(0, r.pinned - 1)
        r.last_use_s = self._now()
        self._set_host(inst, r, 0)
        mib = max(0, prefix_mib)
        self._drop_lease(inst, r)
        r.gpu_mib = 0
        if r.pinned or not mib:
            r.gpu_mib = mib if r.pinned else 0
            return
        lease = self._grant(r, mib)
        if lease is None and make_room is not None:
            make_room()
            lease = self._grant(r, mib)
        if lease is None and self._reclaim(instance, mib, exclude=session):
            lease = self._grant(r, mib)
        if lease is None:
            self._to_host(inst, r, mib)
            return
        r.gpu_mib, r.lease_id = mib, lease.id
        self._by_lease[lease.id] = r
        inst.retained_mib += mib
        inst.idle[session] = r
        inst.idle.move_to_end(session)

    def reclaim(self, instance: str, need_mib: int, *, keep: str = "") -> bool:
        """End retained leases on ``instance`` (not ``keep``'s), chosen by the preemption planner (LRU
        first), until ``need_mib`` fits its free room in the ledger; False, ending nothing, when even
        all of them would not make it fit."""
        return self._reclaim(instance, need_mib, exclude=keep)

    def reclaimable_mib(self, instance: str, *, keep: str = "") -> int:
        inst = self._instances.get(instance)
        if inst is None:
            return 0
        own = inst.idle.get(keep)
        return inst.retained_mib - (own.gpu_mib if own is not None else 0)

    def on_ended(self, lease: Lease) -> None:
        """A retained lease ended outside `begin`/`end` (reclaimed, expired, slice revoked): its prefix
        leaves the GPU; preempted, it moves to the host tier."""
        r = self._by_lease.pop(lease.id, None)
        if r is None:
            return
        inst = self._instances[r.instance]
        mib = r.gpu_mib
        inst.retained_mib -= mib
        inst.idle.pop(r.session, None)
        r.gpu_mib, r.lease_id = 0, ""
        if lease.state is LeaseState.PREEMPTED:
            self.reclaimed += 1
            self._to_host(inst, r, mib)

    # ------------------------------------------------------------------ reading
    def owns(self, lease_id: str) -> bool:
        return lease_id in self._by_lease

    def leases(self) -> int:
        """Retained leases active now."""
        return len(self._by_lease)

    def reclaim_order(self, instance: str) -> list[str]:
        """Idle sessions on ``instance`` holding GPU MiB, first victim first (least recently used)."""
        inst = self._instances.get(instance)
        if inst is None:
            return []
        leases = [self.kv.leases.require(r.lease_id) for r in inst.idle.values()]
        return [lease.request.labels[0][1] for lease in sorted(leases, key=preemption.victim_order)]

    def residency(self, session: str, instance: str) -> Residency | None:
        held = self._sessions.get(session)
        return None if held is None else held.get(instance)

    def usage(self, instance: str) -> tuple[int, int]:
        """(retained GPU MiB, host-tier MiB) of session prefixes on ``instance``."""
        inst = self._instances.get(instance)
        return (0, 0) if inst is None else (inst.retained_mib, inst.host_mib)

    def __len__(self) -> int:
        return len(self._sessions)

    def check(self) -> None:
        for name, inst in self._instances.items():
            rs = [r for held in self._sessions.values() for r in held.values() if r.instance == name]
            if inst.host_mib != sum(r.host_mib for r in rs) or inst.host_mib > self._idle_cap(name, inst):
                raise InvariantViolation(f"sessions on {name}: host tier {inst.host_mib} MiB")
            if inst.retained_mib != sum(r.gpu_mib for r in inst.idle.values()):
                raise InvariantViolation(f"sessions on {name}: retained {inst.retained_mib} MiB")
            for r in rs:
                has = bool(r.lease_id)
                if has != (not r.pinned and r.gpu_mib > 0) or has != (r.session in inst.idle):
                    raise InvariantViolation(f"session {r.session} on {name}: lease {r.lease_id!r}")
                if has:
                    lease = self.kv.leases.active(r.lease_id)
                    if lease is None or lease.total.vram_mib != r.gpu_mib or lease.slice_ids != (name,):
                        raise InvariantViolation(f"session {r.session} on {name}: retained lease lost")

    # ------------------------------------------------------------------ internals
    def _grant(self, r: Residency, mib: int) -> Lease | None:
        self._seq += 1
        req = Request(
            id=f"retained:{self._seq}",
            tenant=RETAINED_TENANT,
            priority=RETAINED_PRIORITY,
            demand=Resources(mib, 0),
            ttl_s=self.retain_ttl_s,
            preemptible=True,
            labels=((RETAINED_LABEL, r.session),),
        )
        st = self.kv.ledger.state(r.instance)
        if not st.healthy or not req.demand.fits_in(st.free):
            return None
        out = self.kv.place(req, (r.instance,))
        return out.lease if out.granted else None

    def _drop_lease(self, inst: _Instance, r: Residency) -> None:
        if not r.lease_id:
            return
        lid = r.lease_id
        self._by_lease.pop(lid, None)
        inst.retained_mib -= r.gpu_mib
        inst.idle.pop(r.session, None)
        r.lease_id = ""
        if self.kv.leases.active(lid) is not None:
            self.kv.release(lid, reason="session turn started" if r.pinned else "session prefix replaced")

    def _reclaim(self, instance: str, need_mib: int, *, exclude: str) -> bool:
        inst = self._instances.get(instance)
        if inst is None or not inst.idle:
            return False
        st = self.kv.ledger.state(instance)
        if st.free.vram_mib >= need_mib:
            return True
        victims_pool = [self.kv.leases.require(r.lease_id) for s, r in inst.idle.items() if s != exclude]
        probe = Request(
            id="reclaim-probe",
            tenant=RETAINED_TENANT,
            priority=RETAINED_PRIORITY + 1,
            demand=Resources(need_mib, 0),
            ttl_s=1.0,
        )
        plan = preemption.plan_slice(st, victims_pool, probe)
        if plan is None:
            return False
        for v in plan.victims:
            self.kv.revoke(v.id, state=LeaseState.PREEMPTED, reason="retained prefix reclaimed for a request")
        return True

    def _to_host(self, inst: _Instance, r: Residency, mib: int) -> None:
        cap = self._idle_cap(r.instance, inst)
        keep = min(mib, cap)
        while inst.host_mib - r.host_mib + keep > cap and inst.host_lru:
            old = next(iter(inst.host_lru.values()))
            if old is r:
                break
            self._set_host(inst, old, 0)
        self._set_host(inst, r, min(keep, cap - (inst.host_mib - r.host_mib)))

    def _residency(self, session: str, instance: str) -> Residency:
        held = self._sessions.get(session)
        if held is None:
            held = self._sessions[session] = {}
            while len(self._sessions) > self.max_sessions:
                self._forget(next(iter(self._sessions)))
        else:
            self._sessions.move_to_end(session)
        r = held.get(instance)
        if r is None:
            r = held[instance] = Residency(session, instance)
        return r

    def _forget(self, session: str) -> None:
        for r in self._sessions.pop(session, {}).values():
            inst = self._instances[r.instance]
            self._drop_lease(inst, r)
            self._set_host(inst, r, 0)

    def _set_host(self, inst: _Instance, r: Residency, mib: int) -> None:
        inst.host_mib += mib - r.host_mib
        r.host_mib = mib
        if mib:
            inst.host_lru[r.session] = r
            inst.host_lru.move_to_end(r.session)
        else:
            inst.host_lru.pop(r.session, None)
