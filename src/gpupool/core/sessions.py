"""`SessionTable`: where each session's prefix KV lives, per model instance, for prefix-aware routing.

Role: the gateway's view of the engines' prefix caches. A *session* (an agent conversation: the
``x-gpupool-session`` header, else OpenAI's ``user`` / ``prompt_cache_key``) sends turns that share a
growing prefix; the instance that served its last turn still holds that prefix's KV (on the GPU, or on
its host tier after the engine evicted it), so sending the next turn there saves the recompute.

Per instance (a KV slice id) the table keeps, for every session it served, a `Residency`: MiB of the
prefix on the GPU and on the host tier, last use, and whether a turn is running (*pinned*). Idle
residencies form an LRU per instance. When the residencies on an instance outgrow its GPU budget the
least recently used idle ones move to the host tier (``host_mib`` per instance; beyond it they are
dropped): the same LRU the engine applies to its idle cached blocks, so `reclaim_order` is the victim
order and what routing can still expect to hit.

Routing (`prefer`): the instance holding most of the session's prefix (GPU MiB, then host-tier MiB),
unless admitting the request there would cross its *red line*: predicted KV use after the request
(MiB in use now + the request's MiB, which covers its prompt and growth to ``max_tokens``) over
``red_line_pct`` % of the instance's budget (default 90). Then "" (no preference): the caller's own
choice (most free) decides, and the recompute is paid there.

Invariants: per instance, GPU residency (pinned included) <= budget or only pinned residencies remain;
host residency <= ``host_mib``; every lookup is O(1) in the number of sessions (a dict per session
over the few instances it touched); no clock reads: ``now`` is injected.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpupool.core.errors import InvalidInput

DEFAULT_RED_LINE_PCT = 90
SESSION_HEADER = "x-gpupool-session"
MAX_SESSION_ID_CHARS = 256


def session_of(headers: Mapping[str, str], body: Mapping[str, object]) -> str:
    """The request's session id: the header, else ``user``, else ``prompt_cache_key``; "" if none."""
    sid = headers.get(SESSION_HEADER)
    if sid is None:
        v = body.get("user")
        if not isinstance(v, str) or not v:
            v = body.get("prompt_cache_key")
        sid = v if isinstance(v, str) else ""
    return sid[:MAX_SESSION_ID_CHARS]


@dataclass(slots=True)
class Residency:
    session: str
    instance: str
    gpu_mib: int = 0
    host_mib: int = 0
    last_use_s: float = 0.0
    pinned: int = 0
    """Turns of this session running on this instance now."""


@dataclass(slots=True)
class _Instance:
    budget_mib: int
    host_cap_mib: int
    gpu_mib: int = 0
    host_mib: int = 0
    idle: OrderedDict[str, Residency] = field(default_factory=OrderedDict)
    """Idle residencies, least recently used first."""
    host_lru: OrderedDict[str, Residency] = field(default_factory=OrderedDict)
    """Residencies with host-tier MiB, oldest first."""


class SessionTable:
    def __init__(
        self,
        *,
        now: Callable[[], float],
        red_line_pct: int = DEFAULT_RED_LINE_PCT,
        host_mib: int = 0,
        max_sessions: int = 100_000,
    ) -> None:
        if type(red_line_pct) is not int or not 1 <= red_line_pct <= 100:
            raise InvalidInput("red_line_pct", red_line_pct, "must be an integer in [1, 100]")
        if type(host_mib) is not int or host_mib < 0:
            raise InvalidInput("host_mib", host_mib, "must be an integer >= 0")
        self._now = now
        self.red_line_pct = red_line_pct
        self.host_mib = host_mib
        self.max_sessions = max_sessions
        self._instances: dict[str, _Instance] = {}
        self._sessions: OrderedDict[str, dict[str, Residency]] = OrderedDict()
        self.red_line_hits = 0
        """Requests whose best instance was over its red line (routed elsewhere)."""
        self.prefix_routed = 0
        """Requests sent to the instance holding their session's prefix."""

    # ------------------------------------------------------------------ instances
    def add_instance(self, instance: str, *, budget_mib: int, host_mib: int | None = None) -> None:
        if type(budget_mib) is not int or budget_mib < 1:
            raise InvalidInput("budget_mib", budget_mib, "must be an integer >= 1")
        inst = self._instances.get(instance)
        cap = self.host_mib if host_mib is None else host_mib
        if inst is None:
            self._instances[instance] = _Instance(budget_mib, cap)
        else:
            inst.budget_mib, inst.host_cap_mib = budget_mib, cap

    def over_red_line(self, used_mib: int, need_mib: int, budget_mib: int) -> bool:
        """Would ``used_mib + need_mib`` cross ``red_line_pct`` % of ``budget_mib``?"""
        return (used_mib + need_mib) * 100 > self.red_line_pct * budget_mib

    # ------------------------------------------------------------------ routing
    def prefer(self, session: str, need_mib: int, load: Callable[[str], tuple[int, int]]) -> str:
        """The instance to send ``session``'s next turn to, or "" for no preference.

        ``load(instance)`` gives (MiB in use now, budget MiB) of an instance; only the instances
        holding the session's prefix are asked."""
        held = self._sessions.get(session)
        if not held:
            return ""
        best, best_key = "", (0, 0)
        crossed = False
        for r in held.values():
            key = (r.gpu_mib, r.host_mib)
            if key <= best_key:
                continue
            used, budget = load(r.instance)
            if budget <= 0:
                continue
            if self.over_red_line(used, need_mib, budget):
                crossed = True
                continue
            best, best_key = r.instance, key
        if crossed and not best:
            self.red_line_hits += 1
        if best:
            self.prefix_routed += 1
        return best

    # ------------------------------------------------------------------ turns
    def begin(self, session: str, instance: str, *, budget_mib: int) -> None:
        """A turn of ``session`` starts on ``instance`` (of ``budget_mib`` KV, registered on first
        sight): its residency there is pinned (not a victim)."""
        if not session:
            return
        inst = self._instances.get(instance)
        if inst is None:
            self.add_instance(instance, budget_mib=max(1, budget_mib))
            inst = self._instances[instance]
        r = self._residency(session, instance)
        r.pinned += 1
        r.last_use_s = self._now()
        inst.idle.pop(session, None)

    def end(self, session: str, instance: str, prefix_mib: int) -> None:
        """The turn ended: the instance now holds ``prefix_mib`` of the session's prefix on the GPU."""
        inst = self._instances.get(instance)
        if inst is None or not session:
            return
        r = self._residency(session, instance)
        r.pinned = max(0, r.pinned - 1)
        r.last_use_s = self._now()
        self._set_host(inst, r, 0)
        inst.gpu_mib += max(0, prefix_mib) - r.gpu_mib
        r.gpu_mib = max(0, prefix_mib)
        if not r.pinned:
            inst.idle[session] = r
            inst.idle.move_to_end(session)
        self._fit(inst)

    def reclaim_order(self, instance: str) -> list[str]:
        """Idle sessions on ``instance`` holding GPU MiB, first victim first (least recently used)."""
        inst = self._instances.get(instance)
        return [] if inst is None else [s for s, r in inst.idle.items() if r.gpu_mib]

    def residency(self, session: str, instance: str) -> Residency | None:
        held = self._sessions.get(session)
        return None if held is None else held.get(instance)

    def usage(self, instance: str) -> tuple[int, int]:
        """(GPU MiB, host-tier MiB) of session prefixes on ``instance``."""
        inst = self._instances.get(instance)
        return (0, 0) if inst is None else (inst.gpu_mib, inst.host_mib)

    def __len__(self) -> int:
        return len(self._sessions)

    def check(self) -> None:
        for name, inst in self._instances.items():
            rs = [r for held in self._sessions.values() for r in held.values() if r.instance == name]
            assert inst.gpu_mib == sum(r.gpu_mib for r in rs), name
            assert inst.host_mib == sum(r.host_mib for r in rs) <= inst.host_cap_mib, name
            if inst.gpu_mib > inst.budget_mib:  # only pinned prefixes may keep it over
                assert not any(r.gpu_mib for r in inst.idle.values()), name

    # ------------------------------------------------------------------ internals
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
            inst.gpu_mib -= r.gpu_mib
            self._set_host(inst, r, 0)
            inst.idle.pop(session, None)

    def _set_host(self, inst: _Instance, r: Residency, mib: int) -> None:
        inst.host_mib += mib - r.host_mib
        r.host_mib = mib
        if mib:
            inst.host_lru[r.session] = r
            inst.host_lru.move_to_end(r.session)
        else:
            inst.host_lru.pop(r.session, None)

    def _fit(self, inst: _Instance) -> None:
        """Move LRU idle prefixes to the host tier until the GPU residency fits the budget."""
        for session in list(inst.idle):
            if inst.gpu_mib <= inst.budget_mib:
                break
            r = inst.idle[session]
            if not r.gpu_mib:
                continue
            moved, r.gpu_mib = r.gpu_mib, 0
            inst.gpu_mib -= moved
            keep = min(moved + r.host_mib, inst.host_cap_mib)
            while inst.host_mib - r.host_mib + keep > inst.host_cap_mib and inst.host_lru:
                old = next(iter(inst.host_lru.values()))
                if old is r:
                    break
                self._set_host(inst, old, 0)
            self._set_host(inst, r, min(keep, inst.host_cap_mib - (inst.host_mib - r.host_mib)))
