"""`TidalPlane`: the tidal mode machine running in the control plane on measured online demand.

Role: the core half of ``gpupool serve``'s day/night time-sharing. It composes the pure
`TidalController` (modes.py) with what the gateway measures and decides per request:

- **Demand** (`DemandMeter`): every admission (`before_admit`) of a P0 or P1 request, from the
  OpenAI proxy and the lease API alike, counts as one arrival of its model (``lease-api`` for a
  placement lease without a model). `tick` feeds the controller the total P0+P1 arrivals per minute
  over the last ``demand_window_s``; `view` shows them per model.
- **DAY reservation** (admission): a P2 *placement* lease (not a request lease inside an online
  engine's KV budget) is refused when P2 would then hold more than ``p2_share`` of the pool's VRAM
  (DAY: ``1 - day_reserved_fraction``, 20 % by default; NIGHT: ``1 - night_reserved_fraction``).
  The controller turns the refusal into SHED (HTTP 429 + reason). A lease larger than the whole DAY
  share waits for NIGHT: its Retry-After is the wait until NIGHT can begin (`night_opens_in_s`);
  one that only the P2 leases already held keep out can pass at any release (load: the short
  Retry-After of the controller). Back in
  DAY, `reclaim` names the P2 placement leases (newest first) that take P2 back under its share.
- **P2 requests to online engines** (request leases in their KV budgets): by DAY refused under
  ``day_policy: strict`` (the seed), lent at the `LendingGuard`'s level under ``lending`` (the guard
  is fed P0 TTFTs through `observe_ttft` and updated by `tick`): with ``lending_scope: requests`` a
  fraction ``level`` of them is let in; with ``kv-budget`` (slice level) one is let in while the P2
  request leases of its model then hold at most ``level`` x the model's spare KV budget (per instance:
  its budget above ``lending_kv_reserve`` less what its online requests hold; `kv_usage_of`). A
  lending refusal at level 0 retries when the guard may rise again or NIGHT can begin, whichever is
  first; above level 0 (or with nothing holding the guard) the next request may pass: short. By
  NIGHT let in (but for the holdback). A ``strict`` refusal is a `Refusal` whose Retry-After is the
  wait until NIGHT can begin at the earliest (`night_opens_in_s`), a holdback's the rest of the
  holdback, in real seconds and at most `MAX_RETRY_AFTER_S`.
- **NIGHT holdback**: a P0 arrival in NIGHT arms a holdback of ``holdback_s``: new P2 placement
  leases are refused until it passes, so capacity that P2 work gives back goes to online work
  first (the fastest path: no process is touched). `after_admit` classifies how that P0 request
  got its capacity (``free`` | ``preempt`` | ``queued`` | ``refused``) and times arrival -> outcome
  with the injected stopwatch; executors add ``pause`` and ``requeue`` timings (`record_path`), and
  the standby sleeper the ``sleep`` path (a P0 burst woke a sleeping standby instance: arrival ->
  the agent confirmed it awake; `gpupool.core.tidal.standby`), fed by every NIGHT P0 arrival.
- **Schedule**: `next_switch` names the next mode boundary in the configured time zone (DAY: the
  night window's start, where the traffic trigger may fire; NIGHT: the night window's end, and the
  restore deadline planned back from the measured re-partition time: `restore_due`).

Two injected clocks: ``clock``, a time line that never steps (the gateway's lease clock: demand
window, holds, holdback, lending guard), and ``wall`` (default: ``clock``), the wall clock the
schedule reads its local time of day from (the gateway: ``time.time``), so that a wall-clock step
moves DAY and NIGHT to the corrected hours at the next `tick` while every duration keeps running.

Invariants: the plane never reads a clock (both are injected); `before_admit` never changes
the ledger (it only counts and answers); with ``enabled=False`` it counts demand but never refuses
(the off switch); a transition is reported once, by the `tick` that caused it.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import time as dtime
from typing import TYPE_CHECKING

from gpupool.core.allocator import Allocator
from gpupool.core.clock import Clock
from gpupool.core.errors import InvalidInput
from gpupool.core.kvbackends import KV_PREFIX
from gpupool.core.model import Lease, Request
from gpupool.core.outcome import Outcome, OutcomeCode, Refusal
from gpupool.core.priority import P0
from gpupool.core.tidal.lending import LendingGuard, LevelChange
from gpupool.core.tidal.modes import CompressedClock, Mode, TidalController, TidalTransition
from gpupool.core.tidal.settings import PlaneConfig, plane_config
from gpupool.core.tidal.standby import StandbySleeper

if TYPE_CHECKING:
    from gpupool.core.controller import LeaseController

LEASE_API_MODEL = "lease-api"
"""The demand key of an online placement lease that names no model."""
PATHS = ("free", "preempt", "queued", "refused", "pause", "requeue", "sleep")
"""How a night P0 arrival got its capacity, and what the displaced P2 work went through."""
PATH_SAMPLES = 512
"""Timings kept per path (the newest; quantiles are over these)."""
MAX_RETRY_AFTER_S = 3600
"""The longest Retry-After of a refusal that waits for NIGHT, the holdback's end or the lending guard
(the wait for NIGHT can be most of a day: a client still asks at least hourly, so it sees a changed
schedule or policy)."""


class DemandMeter:
    """P0+P1 arrivals per model over a sliding window (one timestamp per arrival, trimmed on read)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._arrivals: deque[tuple[float, str]] = deque()
        self.total = 0

    def record(self, model: str, at_s: float) -> None:
        self._arrivals.append((at_s, model))
        self.total += 1

    def _trim(self, now_s: float) -> None:
        cut = now_s - self.window_s
        a = self._arrivals
        while a and a[0][0] <= cut:
            a.popleft()

    def per_minute(self, now_s: float) -> float:
        self._trim(now_s)
        return len(self._arrivals) * 60.0 / self.window_s

    def per_model_per_minute(self, now_s: float) -> dict[str, float]:
        self._trim(now_s)
        counts = Counter(m for _, m in self._arrivals)
        return {m: round(n * 60.0 / self.window_s, 3) for m, n in sorted(counts.items())}


@dataclass(slots=True)
class PathStats:
    count: int = 0
    ms: deque[float] = field(default_factory=lambda: deque(maxlen=PATH_SAMPLES))

    def add(self, ms: float) -> None:
        self.count += 1
        self.ms.append(ms)

    def quantile(self, q: float) -> float | None:
        if not self.ms:
            return None
        xs = sorted(self.ms)
        return round(xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)], 3)


KvUsage = Callable[[str], list[tuple[int, int, int]]]
"""model -> per instance (KV capacity MiB, MiB held by online request leases, MiB held by P2 ones)."""
P2Usage = Callable[[], tuple[int, int]]
"""() -> (VRAM MiB held by P2 placement leases, pool VRAM capacity in MiB)."""


class TidalPlane:
    """See the module docstring. Wire `before_admit` / `after_admit` into admission, call `tick`."""

    def __init__(
        self,
        config: PlaneConfig,
        *,
        clock: Clock,
        p2_usage: P2Usage,
        stopwatch: Callable[[], float] | None = None,
        wall: Clock | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall = wall or clock
        """The schedule's clock (local time of day); see the module docstring."""
        self.stopwatch = stopwatch or clock.now
        """Seconds for path timings (the CLI: a monotonic counter; the schedule clock may be compressed)."""
        self._arrived = 0.0
        self.controller = TidalController(config.tidal)
        self.meter = DemandMeter(config.demand_window_s)
        self._p2_usage = p2_usage
        self.holdback_until = -math.inf
        self.paths: dict[str, PathStats] = {p: PathStats() for p in PATHS}
        self.path_log: list[tuple[str, float]] = []
        """Night paths other than ``free`` (and executors' pause/requeue) not yet reported as events."""
        self.refusals: Counter[str] = Counter()
        """``day-reservation`` | ``night-share`` | ``holdback`` -> P2 placement leases refused."""
        self.mode_since: float | None = None
        """Wall-clock reading of the last mode change (shown as local time)."""
        self.repartition_s: float | None = None
        """The last measured re-partition duration (merge or restore), seconds."""
        self.guard = LendingGuard(config.lending)
        self.lending_changes: list[LevelChange] = []
        """Guard level changes not yet reported (the runtime turns them into events and clears it)."""
        self.notes: dict[str, object] = {}
        """Extra state for `view` (the re-partition driver's per-GPU status)."""
        self.kv_usage: KvUsage | None = None
        """The online instances' KV use per model (``lending_scope: kv-budget``; `kv_usage_of`)."""
        self.standby: StandbySleeper | None = None
        """NIGHT sleep of standby instances (set by the composition root when backends are named)."""

    # ------------------------------------------------------------------ admission hooks
    @property
    def mode(self) -> Mode:
        return self.controller.mode

    def p2_share(self) -> float:
        return self.controller.p2_share()

    def p2_share_mib(self, capacity_mib: int) -> int:
        """The P2 share in MiB (rounded to 1e-6 first: 1 - 0.8 is 0.19999999999999996 in floats)."""
        return int(round(self.p2_share() * capacity_mib, 6))

    def p2_usage(self) -> tuple[int, int]:
        """(VRAM MiB held by P2 placement leases, pool VRAM capacity in MiB)."""
        return self._p2_usage()

    def before_admit(self, request: Request, *, kv: bool) -> str | Refusal | None:
        """Count an online arrival; for P2 placement leases, the reason to refuse it (or None)."""
        now = self.clock.now()
        prio = request.priority
        self._arrived = self.stopwatch()
        if prio >= 0:
            self.meter.record(request.model or LEASE_API_MODEL, now)
            if prio >= P0 and self.mode is Mode.NIGHT:
                self.holdback_until = max(self.holdback_until, now + self.config.holdback_s)
                if self.standby is not None:
                    self.standby.p0(request.model or LEASE_API_MODEL, now, self._arrived)
            return None
        if not self.config.enabled:
            return None
        if kv:
            return self._p2_request(now, request)
        if self.mode is Mode.NIGHT and now < self.holdback_until:
            self.refusals["holdback"] += 1
            wait_s = self.holdback_until - now
            return self._refusal(
                f"tidal: NIGHT holdback: online P0 work arrived; new P2 work waits {wait_s:.1f} s more",
                wait_s,
            )
        held, cap = self._p2_usage()
        want = request.demand.vram_mib * max(1, request.gpu_count)
        share_mib = self.p2_share_mib(cap)
        if held + want > share_mib:
            key = "day-reservation" if self.mode is Mode.DAY else "night-share"
            self.refusals[key] += 1
            reserved = 1.0 - self.p2_share()
            reason = (
                f"tidal: {self.mode.value.upper()} reservation: P2 holds {held} MiB of its {share_mib} MiB "
                f"share ({100 * self.p2_share():.0f} % of {cap} MiB); {want} MiB more would cut into the "
                f"{100 * reserved:.0f} % kept for P0/P1"
            )
            if self.mode is Mode.DAY and want > share_mib:
                return self._until_night(now, f"{reason}; larger than the whole DAY share", math.inf)
            return reason
        return None

    def _p2_request(self, now: float, request: Request) -> str | Refusal | None:
        """A P2 request to an online engine (a request lease in its KV budget)."""
        if self.mode is Mode.NIGHT:
            if now < self.holdback_until:
                self.refusals["holdback"] += 1
                wait_s = self.holdback_until - now
                return self._refusal(
                    f"tidal: NIGHT holdback: online P0 work arrived; P2 requests wait {wait_s:.1f} s more",
                    wait_s,
                )
            return None
        if self.config.day_policy == "strict":
            self.refusals["day-strict"] += 1
            return self._strict_refusal(now)
        if self.config.lending_scope == "kv-budget":
            return self._kv_lend(now, request)
        if self.guard.admit():
            return None
        self.refusals["day-lending"] += 1
        return self._lending_refusal(
            now,
            f"tidal: DAY lending at level {self.guard.level:g} (P0 TTFT attainment guard): "
            "this P2 request is not lent now",
        )

    def _lending_refusal(self, now: float, reason: str) -> str | Refusal:
        """A day-lending refusal and when retrying can help. Above level 0 the next request may be lent
        (the guard's credit, or KV that online or P2 requests give back): that depends on load and can
        change at any moment, so a plain reason (the controller's short Retry-After). At level 0
        nothing is lent until the guard may rise again (`LendingGuard.raise_possible_at`) or NIGHT
        begins, whichever comes first; when neither holds it (no calm period left, the low stretch
        already due) the next tick's measurements decide, again any moment."""
        if self.guard.level > 0:
            return reason
        return self._until_night(now, reason, self.guard.raise_possible_at() - now)

    def _until_night(self, now: float, reason: str, other_wait_s: float) -> str | Refusal:
        """``reason`` with a Retry-After of the wait until NIGHT can begin or ``other_wait_s`` passes,
        whichever is first (a plain reason when that is now: retrying can help any moment)."""
        wait_s = min(self.night_opens_in_s(now), other_wait_s)
        if wait_s <= 0:
            return reason
        return self._refusal(f"{reason}; retry in {self._real_s(wait_s)} s", wait_s)

    def night_opens_in_s(self, now: float) -> float:
        """Schedule seconds until NIGHT can begin at the earliest: the night window's start (on the
        wall clock); inside the window (still DAY), what is left of the low-demand stretch NIGHT
        needs (all of it if none runs), from ``now`` on the time line."""
        c = self.controller
        wall = self.wall.now()
        if not c.in_night_window(wall):
            return self._next_local(wall, c.config.windows()[2]) - wall
        low = c.snapshot(wall).low_since
        return max(0.0, (now if low is None else low) + c.config.enter_hold_s - now)

    def _real_s(self, schedule_s: float) -> int:
        """Schedule seconds as whole real seconds (>= 1; the demo's schedule clock is compressed)."""
        real = schedule_s / self.clock.speed if isinstance(self.clock, CompressedClock) else schedule_s
        return max(1, math.ceil(real))

    def _refusal(self, reason: str, wait_s: float) -> Refusal:
        """``reason`` with a Retry-After of the wait (schedule seconds), bounded by `MAX_RETRY_AFTER_S`."""
        return Refusal(reason, retry_after_s=float(min(MAX_RETRY_AFTER_S, self._real_s(wait_s))))

    def _strict_refusal(self, now: float) -> Refusal:
        wait_s = self.night_opens_in_s(now)
        wall = self.wall.now()
        if self.controller.in_night_window(wall):
            left = self._real_s(wait_s)
            when = f"once online demand has stayed low for {left} s more (the night window is open)"
        else:
            opens = self.controller.local_time(wall + wait_s).isoformat(timespec="minutes")
            when = f"when the night window opens at {opens}, in {self._real_s(wait_s)} s"
        return self._refusal(
            f"tidal: DAY (strict): P2 requests stay out of the online engines until NIGHT: at the "
            f"earliest {when}",
            wait_s,
        )

    def kv_lending(self, model: str) -> tuple[int, int, int]:
        """(MiB lent to P2 now = level x spare, spare KV budget MiB, MiB P2 holds) of ``model``."""
        rows = self.kv_usage(model) if self.kv_usage is not None else []
        keep = 1.0 - self.config.lending_kv_reserve
        spare = sum(max(0, int(cap * keep) - online) for cap, online, _ in rows)
        held = sum(p2 for _, _, p2 in rows)
        return int(self.guard.level * spare), spare, held

    def _kv_lend(self, now: float, request: Request) -> str | Refusal | None:
        """``kv-budget`` lending: the P2 request fits in the lent share of its model's spare KV."""
        model = request.model or ""
        lent, spare, held = self.kv_lending(model)
        want = request.demand.vram_mib
        if self.guard.level > 0 and held + want <= lent:
            return None
        self.refusals["day-lending"] += 1
        return self._lending_refusal(
            now,
            f"tidal: DAY KV lending at level {self.guard.level:g} (P0 TTFT attainment guard): P2 holds "
            f"{held} MiB of the {lent} MiB lent from {model}'s spare KV budget ({spare} MiB above the "
            f"{100 * self.config.lending_kv_reserve:.0f} % kept for online work); {want} MiB more "
            "does not fit",
        )

    def observe_ttft(self, ttft_s: float) -> None:
        """A P0 request's time to first token (the lending guard's measurement)."""
        self.guard.observe(self.clock.now(), ttft_s)

    def after_admit(self, request: Request, out: Outcome) -> None:
        """Classify and time a night P0 arrival (arrival -> outcome, on the injected stopwatch)."""
        if request.priority < P0 or self.mode is not Mode.NIGHT:
            return
        ms = max(0.0, (self.stopwatch() - self._arrived) * 1000.0)
        if out.granted:
            path = "preempt" if out.victims else "free"
        elif out.code is OutcomeCode.QUEUED:
            path = "queued"
        else:
            path = "refused"
        self.paths[path].add(ms)
        if path != "free":
            self.path_log.append((path, round(ms, 3)))

    def record_path(self, path: str, ms: float) -> None:
        """An executor's part of a night path (``pause`` / ``requeue`` of displaced P2 work)."""
        if path not in self.paths:
            raise InvalidInput("path", path, f"must be one of {', '.join(PATHS)}")
        self.paths[path].add(max(0.0, float(ms)))
        self.path_log.append((path, round(max(0.0, float(ms)), 3)))

    # ------------------------------------------------------------------ the clock's side
    def tick(self) -> TidalTransition | None:
        """Feed the controller the measured demand now; returns the transition it caused, if any."""
        now, wall = self.clock.now(), self.wall.now()
        if self.mode_since is None:
            self.mode_since = wall
        tr = self.controller.observe(now, self.meter.per_minute(now), wall_s=wall)
        if self.config.day_policy == "lending":
            ch = self.guard.update(now)
            if ch is not None:
                self.lending_changes.append(ch)
        if tr is not None:
            self.mode_since = wall
            if tr.mode_to is Mode.DAY:
                self.holdback_until = -math.inf
        return tr

    def reclaim(self, leases: Iterable[Lease]) -> list[str]:
        """DAY: the preemptible P2 placement leases to take back, newest grant first, until P2 holds no
        more than its share again (work granted at NIGHT under the larger share). NIGHT or off: none.
        Non-preemptible P2 leases (a P2 engine's instance) count in the share but are never taken."""
        if self.mode is not Mode.DAY or not self.config.enabled:
            return []
        held, cap = self._p2_usage()
        over = held - self.p2_share_mib(cap)
        out: list[str] = []
        if over <= 0:
            return out
        p2 = sorted(
            (x for x in leases if x.priority < 0 and x.request.preemptible is not False),
            key=lambda x: (-x.granted_at, x.id),
        )
        for lease in p2:
            if over <= 0:
                break
            out.append(lease.id)
            over -= lease.total.vram_mib
        return out

    def max_batch_running(self) -> int | None:
        """How many batch jobs may run at once now (None: as many as capacity allows)."""
        return self.config.day_batch_concurrency if self.mode is Mode.DAY else None

    def restore_lead_s(self) -> float:
        measured = 2.0 * self.repartition_s if self.repartition_s is not None else 0.0
        return max(self.config.restore_lead_min_s, measured)

    def day_starts_in_s(self) -> float:
        """Seconds until the next day window start (the schedule's ``day_start``)."""
        now = self.wall.now()
        return self._next_local(now, self.controller.config.windows()[0]) - now

    def standby_wake_due(self) -> bool:
        """NIGHT within the standby sleeper's wake lead of the day window (or DAY): wake them now."""
        if self.mode is Mode.DAY or self.standby is None:
            return True
        return self.day_starts_in_s() <= self.standby.wake_lead_s()

    def restore_due(self) -> bool:
        """True when re-partitioned GPUs must go back now: DAY, or NIGHT within the lead of the day."""
        if self.mode is Mode.DAY:
            return True
        now = self.wall.now()
        day_start = self._next_local(now, self.controller.config.windows()[0])
        return day_start - now <= self.restore_lead_s()

    def _next_local(self, now: float, at: dtime) -> float:
        local = self.controller.local_time(now)
        for days in range(3):
            d = (local + timedelta(days=days)).date()
            cand = datetime.combine(d, at, tzinfo=local.tzinfo).timestamp()
            if cand > now:
                return cand
        raise AssertionError("a daily boundary is always within two days")  # pragma: no cover

    def next_switch(self) -> dict[str, object]:
        """The next boundary: what it is, when (wall-clock Unix s and local time) and what gates it."""
        now = self.wall.now()
        d0, _, n0, n1 = self.controller.config.windows()
        if self.mode is Mode.DAY:
            night = self.controller.in_night_window(now)
            at = now if night else self._next_local(now, n0)
            cfg = self.controller.config
            cond = (
                f"smoothed P0+P1 demand below {100 * cfg.enter_ratio:g} % of the day baseline for "
                f"{cfg.enter_hold_s / 60:g} min inside the night window"
            )
            to = Mode.NIGHT
        else:
            at = self._next_local(now, n1)
            cond = "the night window ends (or demand above the exit ratio for the exit hold)"
            to = Mode.DAY
        out: dict[str, object] = {
            "to": to.value,
            "earliest_at_s": round(at, 3),
            "earliest_local": self.controller.local_time(at).isoformat(timespec="minutes"),
            "condition": cond,
        }
        if self.mode is Mode.NIGHT:
            out["restore_by_local"] = self.controller.local_time(
                self._next_local(now, d0) - self.restore_lead_s()
            ).isoformat(timespec="minutes")
        return out

    def _lending_view(self, now: float) -> dict[str, object] | None:
        if self.config.day_policy != "lending":
            return None
        a, n = self.guard.attainment(now)
        return {
            "scope": self.config.lending_scope,
            "level": self.guard.level,
            "p0_ttft_attainment": None if a is None else round(a, 4),
            "samples": n,
            "target": self.config.lending.target,
            "window_s": self.config.lending.window_s,
            "changes": len(self.guard.changes),
        }

    def view(self) -> dict[str, object]:
        """The JSON-ready tidal state for ``GET /v1/pool`` (key ``tidal``)."""
        now, wall = self.clock.now(), self.wall.now()
        snap = self.controller.snapshot(wall)
        held, cap = self._p2_usage()
        base = snap.baseline
        return {
            "enabled": self.config.enabled,
            "mode": snap.mode.value,
            "since_local": None
            if self.mode_since is None
            else self.controller.local_time(self.mode_since).isoformat(timespec="minutes"),
            "local_time": self.controller.local_time(wall).isoformat(timespec="seconds"),
            "timezone": self.controller.config.timezone,
            "next_switch": self.next_switch(),
            "demand_per_min": round(self.meter.per_minute(now), 3),
            "demand_per_min_by_model": self.meter.per_model_per_minute(now),
            "smoothed_demand_per_min": round(snap.smoothed_demand, 3),
            "baseline_per_min": None if base is None else round(base, 3),
            "p2_share": round(self.p2_share(), 4),
            "p2_held_mib": held,
            "p2_share_mib": self.p2_share_mib(cap),
            "holdback_active": now < self.holdback_until,
            "refused": dict(self.refusals),
            "night_paths": {
                p: {"count": s.count, "p50_ms": s.quantile(0.5), "p99_ms": s.quantile(0.99)}
                for p, s in self.paths.items()
            },
            "day_policy": self.config.day_policy,
            "lending": self._lending_view(now),
            "transitions": len(self.controller.transitions),
            "repartition_s": None if self.repartition_s is None else round(self.repartition_s, 3),
            **self.notes,
        }


def kv_usage_of(controller: LeaseController) -> KvUsage:
    """A `KvUsage` over a controller's backends and request leases (a scan: P2 requests only)."""

    def usage(model: str) -> list[tuple[int, int, int]]:
        rows: dict[str, list[int]] = {}
        for b in controller.models().get(model, ()):
            cap = controller.kv.ledger.slice(KV_PREFIX + b.id).capacity.vram_mib
            rows[b.id] = [cap, 0, 0]
        if not rows:
            return []
        for lease in controller.request_leases():
            on = controller.backend_of(lease)
            if on is not None and on.id in rows:
                rows[on.id][1 if lease.priority >= 0 else 2] += lease.total.vram_mib
        return [(cap, online, p2) for cap, online, p2 in rows.values()]

    return usage


def p2_usage_of(allocator: Allocator) -> P2Usage:
    """A `P2Usage` over an allocator's slices and active leases (a scan: run for P2 admissions only)."""

    def usage() -> tuple[int, int]:
        cap = sum(st.slice.capacity.vram_mib for st in allocator.states())
        held = sum(lease.total.vram_mib for lease in allocator.leases if lease.priority < 0)
        return held, cap

    return usage


__all__ = [
    "LEASE_API_MODEL",
    "MAX_RETRY_AFTER_S",
    "PATHS",
    "DemandMeter",
    "PlaneConfig",
    "TidalPlane",
    "kv_usage_of",
    "p2_usage_of",
    "plane_config",
]
