"""The only way the core learns the time. The core never calls `time.*` itself.

`ManualClock` drives the simulator and unit tests; adapters and composition roots pass a real clock
(anything with ``now() -> float`` seconds): `AnchoredClock` for anything whose times are stored or
shown (lease and ticket expiry in the gateway and the extender), `FunctionClock` over
`time.monotonic` for purely in-process deadlines, and `FunctionClock` over `time.time` where the
wall time of day itself is the point (the tidal schedule: it must follow a corrected wall clock).

Why not `time.time`: the wall clock steps (an NTP correction, ``date -s``). Lease expiry read off it
would follow every step: a step forward expires leases early, all at once; a step back lets leases
renewed during it expire as soon as the clock comes forward again. `AnchoredClock` reads the wall
clock once, when it is made, and then advances by the monotonic clock only, so inside one process a
lease of TTL T lasts T seconds whatever the wall clock does, while its readings stay close to wall
time (Unix seconds) and can be stored: a restarted process re-anchors to the wall clock, and stored
expiry times are then compared to the new wall time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic time line (never steps, whatever the wall clock does); the one
        exception is a schedule's wall clock (`TidalPlane.wall`), which follows the host's steps."""
        ...


class ManualClock:
    """A clock that moves only when told to. Never goes backwards."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"ManualClock.advance: seconds must be finite and >= 0, got {seconds!r}")
        self._now += seconds
        return self._now

    def set(self, now_s: float) -> None:
        if now_s < self._now:
            raise ValueError(f"ManualClock.set: time cannot go backwards ({now_s} < {self._now})")
        self._now = float(now_s)


class AnchoredClock:
    """Wall time read once, then advanced by a monotonic clock.

    ``now() = wall_at_start + (monotonic() - monotonic_at_start)``. Invariants: never goes
    backwards and moves exactly as ``monotonic`` does, whatever ``wall`` does after construction;
    the first reading equals ``wall()`` at construction (up to the time between the two reads).
    Both functions are injected (composition roots pass ``time.time`` and ``time.monotonic``), so
    the core stays free of ``time.*`` and tests can step the wall clock without touching the host's.
    Across processes the readings are only as consistent as the wall clocks were when each process
    made its clock: a wall step while no process runs shows up in the next process's readings.
    """

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._monotonic_at_start_s = float(monotonic())
        self._wall_at_start_s = float(wall())

    @property
    def wall_at_start_s(self) -> float:
        """The wall-clock reading the time line was anchored to."""
        return self._wall_at_start_s

    def now(self) -> float:
        return self._wall_at_start_s + (self._monotonic() - self._monotonic_at_start_s)


class FunctionClock:
    """Adapts a zero-argument function (``time.monotonic``, ``time.time``) to `Clock`."""

    def __init__(self, fn: Callable[[], float]) -> None:
        self._fn = fn

    def now(self) -> float:
        return self._fn()
