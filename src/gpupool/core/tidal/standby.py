"""`StandbySleeper`: NIGHT sleep of the standby online instances (vLLM sleep level 1) and their wake-up.

Role: the control plane's half of "lend the spare online instances at night". For every backend named
in ``standby_backends`` it decides whether the engine should be awake or asleep, takes it out of
routing while it sleeps, and hands the decision to the node agent of the backend's node as a
*directive* (`directives`; served on ``GET /v1/nodes/{node}/engines``). The agent applies it with its
``vllm-sleep`` pauser (``POST /sleep?level=1`` / ``POST /wake_up`` on the engine) and reports the
outcome back as ``engine_asleep`` / ``engine_awake`` events (`report`).

Rules (all times from the caller; no clock reads):
- **Asleep at NIGHT**: when the mode is NIGHT and the wake before DAY is not due, a standby backend
  is wanted asleep unless its model would keep no other routable backend (the last awake instance of
  a model is never slept) or a burst wake still holds it (below). Routing stops at once (`routable`
  is False); the sleep directive is given once the backend holds no request lease (drained), so no
  request is frozen inside a sleeping engine.
- **Awake for DAY**: in DAY, and from ``day_start - wake_lead_s`` in NIGHT, every standby is wanted
  awake. ``wake_lead_s = max(wake_lead_min_s, 2 x the longest wake measured so far)``: the wake is
  planned back from the measured wake time, so the instances are serving when the day window opens.
- **Awake at once on a P0 burst**: `p0` counts P0 arrivals per model; when ``wake_burst`` of them fall
  within ``burst_window_s`` while a standby of that model is asleep (or being put to sleep), it is
  wanted awake at once and stays awake until ``sleep_after_s`` pass without a burst. The time from
  the arrival that tripped the burst to the agent's confirmed wake is the night path ``sleep``.
- **Routable** only when wanted awake and reported awake: a waking engine gets no request before it
  can serve it. A backend never reported on counts as awake (engines start awake).
- **The slice is lent while it sleeps**: once the agent confirms it asleep the caller gives the
  instance's placement lease back (`lendable`), so P2 work can be granted the slice; before the
  engine is woken the caller takes the slice back (revoking the P2 leases on it, whose holders the
  agents free) and says so with `set_held`. Until then the directive stays ``asleep``: an engine is
  never woken onto memory that batch work still holds.

Invariants: a backend is in exactly one of the states awake/asleep for `desired` and for `actual`;
a directive ``asleep`` is only given for a backend that is wanted asleep and was drained; every
change is logged once in `log` (the runtime turns it into events and clears it).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.tidal.numbers import finite_number

AWAKE = "awake"
ASLEEP = "asleep"
STATES = (AWAKE, ASLEEP)
PAUSER = "vllm-sleep"


@dataclass(frozen=True, slots=True)
class StandbyConfig:
    backends: tuple[str, ...] = ()
    level: int = 1
    """vLLM sleep level: 1 offloads the weights to host memory (fast wake), 2 drops them."""
    wake_burst: int = 4
    """P0 arrivals of a model within ``burst_window_s`` that wake its sleeping standby at once."""
    burst_window_s: float = 10.0
    sleep_after_s: float = 300.0
    """After a burst wake, the standby sleeps again only after this long without a burst."""
    wake_lead_min_s: float = 120.0

    def __post_init__(self) -> None:
        if self.level not in (1, 2) or type(self.level) is not int:
            raise InvalidInput("tidal.standby_sleep_level", self.level, "must be 1 or 2")
        if type(self.wake_burst) is not int or self.wake_burst < 1:
            raise InvalidInput("tidal.standby_wake_burst", self.wake_burst, "must be an integer >= 1")
        for name in ("burst_window_s", "sleep_after_s", "wake_lead_min_s"):
            v = getattr(self, name)
            if not finite_number(v) or v < 0:
                raise InvalidInput(f"tidal.standby_{name}", v, "must be a finite number >= 0")
        for i, b in enumerate(self.backends):
            if not isinstance(b, str) or not b:
                raise InvalidInput(f"tidal.standby_backends[{i}]", b, "must be a backend id")
        if len(set(self.backends)) != len(self.backends):
            raise InvalidInput("tidal.standby_backends", list(self.backends), "must not repeat an id")


@dataclass(frozen=True, slots=True)
class Instance:
    """What the sleeper needs of a backend (`gpupool.core.ports.Backend` has these fields)."""

    id: str
    model: str
    url: str
    node: str
    gpu_id: str


@dataclass(slots=True)
class _Standby:
    inst: Instance
    desired: str = AWAKE
    actual: str = AWAKE
    directive: str = AWAKE
    burst_at: float | None = None
    """When the burst that woke it began (the ``sleep`` path's start); None when not burst-woken."""
    hold_until: float = -math.inf
    last_wake_ms: float | None = None
    since: float = 0.0
    routed: bool = True
    """Routability as last handed to the caller by `step`."""
    held: bool = True
    """The instance holds its slice (its placement lease); False while the slice is lent to P2."""


@dataclass(slots=True)
class StandbySleeper:
    config: StandbyConfig
    instances: dict[str, Instance]
    """Every backend of the pool by id (standbys and the rest: a model's other instances count)."""
    log: list[tuple[str, str]] = field(default_factory=list)
    """(backend id, what happened) not yet reported."""
    paths: list[float] = field(default_factory=list)
    """Burst wakes' arrival -> confirmed-awake times (ms) not yet recorded as the ``sleep`` path."""
    _s: dict[str, _Standby] = field(default_factory=dict)
    _arrivals: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    """Model -> (schedule time, stopwatch time) of its recent P0 arrivals."""
    wake_s_max: float = 0.0
    """The longest wake measured (the agent's ``/wake_up`` call), seconds."""

    def __post_init__(self) -> None:
        for bid in self.config.backends:
            inst = self.instances.get(bid)
            if inst is None:
                known = ", ".join(sorted(self.instances)) or "none"
                raise InvalidInput("tidal.standby_backends", bid, f"is not a registered backend ({known})")
            self._s[bid] = _Standby(inst)

    # ------------------------------------------------------------------ queries
    def wake_lead_s(self) -> float:
        return max(self.config.wake_lead_min_s, 2.0 * self.wake_s_max)

    def routable(self, bid: str) -> bool:
        st = self._s.get(bid)
        return st is None or (st.desired == AWAKE and st.actual == AWAKE)

    def lendable(self, bid: str) -> bool:
        """The slice can go to P2 now: wanted and confirmed asleep, still held."""
        st = self._s[bid]
        return st.held and st.desired == ASLEEP and st.directive == ASLEEP and st.actual == ASLEEP

    def wants_slice(self, bid: str) -> bool:
        """The slice must come back now (it is lent and the engine is wanted awake)."""
        st = self._s[bid]
        return not st.held and st.desired == AWAKE

    def set_held(self, bid: str, held: bool) -> None:
        st = self._s[bid]
        if st.held != held:
            st.held = held
            self.log.append((bid, "slice lent to P2 work" if not held else "slice taken back for the wake"))

    def state(self, bid: str) -> tuple[str, str, str]:
        """(desired, directive, actual) of a standby backend."""
        st = self._s[bid]
        return st.desired, st.directive, st.actual

    def directives(self, node: str) -> list[dict[str, object]]:
        """What the agent of ``node`` must apply: one entry per standby backend there."""
        return [
            {
                "id": st.inst.id,
                "gpu_id": st.inst.gpu_id,
                "endpoint": st.inst.url,
                "pauser": PAUSER,
                "level": self.config.level,
                "state": st.directive if st.held else ASLEEP,
            }
            for bid, st in sorted(self._s.items())
            if st.inst.node == node
        ]

    def view(self) -> dict[str, object]:
        return {
            bid: {
                "desired": st.desired,
                "directive": st.directive,
                "actual": st.actual,
                "slice_held": st.held,
                "wake_ms": st.last_wake_ms,
            }
            for bid, st in sorted(self._s.items())
        } | {"wake_lead_s": round(self.wake_lead_s(), 3)}

    # ------------------------------------------------------------------ inputs
    def p0(self, model: str, now: float, stamp: float | None = None) -> None:
        """A P0 arrival of ``model`` (at NIGHT: may wake its sleeping standby at once). ``now`` is the
        schedule's clock; ``stamp`` the stopwatch the ``sleep`` path is timed on (default ``now``)."""
        if not self._s or not any(st.inst.model == model for st in self._s.values()):
            return
        q = self._arrivals.setdefault(model, deque())
        q.append((now, now if stamp is None else stamp))
        while q and q[0][0] <= now - self.config.burst_window_s:
            q.popleft()
        if len(q) < self.config.wake_burst:
            return
        for st in self._s.values():
            if st.inst.model != model:
                continue
            st.hold_until = now + self.config.sleep_after_s
            if st.desired == ASLEEP:
                st.desired = AWAKE
                st.directive = AWAKE
                st.burst_at = q[0][1]
                st.since = now
                self.log.append(
                    (
                        st.inst.id,
                        f"wake for a P0 burst ({len(q)} P0 requests in {self.config.burst_window_s:g} s)",
                    )
                )

    def report(
        self, bid: str, state: str, *, latency_ms: float, now: float, ok: bool = True, why: str = ""
    ) -> None:
        """The agent's outcome for a directive (``engine_asleep`` / ``engine_awake`` / a failure);
        ``now`` on the stopwatch `p0` was given (the ``sleep`` path's end)."""
        st = self._s.get(bid)
        if st is None:
            raise UnknownId("standby backend", bid)
        if state not in STATES:
            raise InvalidInput("state", state, f"must be one of {', '.join(STATES)}")
        if not ok:
            self.log.append((bid, f"{'sleep' if state == ASLEEP else 'wake'} failed: {why}"))
            return
        st.actual = state
        if state == AWAKE:
            st.last_wake_ms = round(latency_ms, 3)
            self.wake_s_max = max(self.wake_s_max, latency_ms / 1000.0)
            if st.burst_at is not None:
                self.paths.append(max(0.0, (now - st.burst_at) * 1000.0))
                st.burst_at = None
        self.log.append((bid, f"{state} ({'sleep' if state == ASLEEP else 'wake'} {latency_ms:.1f} ms)"))

    # ------------------------------------------------------------------ the clock's side
    def step(self, now: float, *, night: bool, wake_due: bool, busy: Callable[[str], bool]) -> list[str]:
        """Apply the rules; ``busy(bid)``: the backend still holds request leases. Returns the ids
        whose routability changed since the last step (the caller turns routing on or off for them:
        reports and bursts between steps take effect here)."""
        for bid, st in sorted(self._s.items()):
            want = ASLEEP if night and not wake_due and now >= st.hold_until else AWAKE
            if want == ASLEEP and st.desired == AWAKE and not self._others_awake(st.inst):
                want = AWAKE
            if want != st.desired:
                st.desired, st.since = want, now
                if want == AWAKE:
                    st.directive = AWAKE
                    why = "the day window starts within the wake lead" if wake_due else "DAY"
                    self.log.append((bid, f"wake: {why} ({self.wake_lead_s():.0f} s lead)"))
                else:
                    self.log.append((bid, "NIGHT: out of routing, to sleep once drained"))
            if st.desired == ASLEEP and st.directive == AWAKE and not busy(bid):
                st.directive = ASLEEP
                self.log.append((bid, f"drained: sleep level {self.config.level}"))
        changed = []
        for bid, st in sorted(self._s.items()):
            if self.routable(bid) != st.routed:
                st.routed = not st.routed
                changed.append(bid)
        return changed

    def _others_awake(self, inst: Instance) -> bool:
        for other in self.instances.values():
            if other.id != inst.id and other.model == inst.model:
                st = self._s.get(other.id)
                if st is None or st.desired == AWAKE:
                    return True
        return False


def instances_of(backends: Iterable[object]) -> dict[str, Instance]:
    """`Instance` per backend id from objects with ``id, model, url, node, gpu_id`` (`Backend`)."""
    out = {}
    for b in backends:
        out[str(b.id)] = Instance(str(b.id), str(b.model), str(b.url), str(b.node), str(b.gpu_id))  # type: ignore[attr-defined]
    return out


__all__ = ["ASLEEP", "AWAKE", "PAUSER", "Instance", "StandbyConfig", "StandbySleeper", "instances_of"]
