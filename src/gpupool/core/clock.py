"""The only way the core learns the time. The core never calls `time.*` itself.

`ManualClock` drives the simulator and unit tests; adapters and composition roots pass a real clock
(anything with ``now() -> float`` seconds, e.g. `time.monotonic` wrapped in `FunctionClock`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic time line."""
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


class FunctionClock:
    """Adapts a zero-argument function (``time.monotonic``, ``time.time``) to `Clock`."""

    def __init__(self, fn: Callable[[], float]) -> None:
        self._fn = fn

    def now(self) -> float:
        return self._fn()
