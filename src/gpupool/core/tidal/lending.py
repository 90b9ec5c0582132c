"""`LendingGuard`: SLO-guarded day lending. How much P2 work the online engines may take by DAY,
decided by the measured P0 TTFT attainment over a sliding window.

Role: the control law behind ``day_policy: lending`` (`gpupool.core.tidal.plane`). By DAY the seed's
strict rule keeps P2 out of the online engines; lending lets a fraction ``level`` of P2 requests in
(vLLM priority scheduling serves P0 first inside the engine), and this guard moves ``level`` on
what P0 actually gets.

Control law (all times from the caller; the guard never reads a clock):
- Measure: ``A(t)`` = the fraction of P0 requests whose TTFT was <= ``slo_ttft_s`` among those that
  got their first token in ``(t - window_s, t]``. With fewer than ``min_samples`` of them the guard
  holds (no evidence, no move).
- Back off at once: if ``A(t) < target`` and ``level > 0``, then ``level := 0`` at ``t``, and the
  guard stays calm until ``t + window_s`` (the next raise is judged on a full window measured
  after the back-off).
- Return slowly: if ``A(t) >= target``, ``t >= calm_until`` and ``t >= last_raise + window_s``, then
  ``level := min(1, level + 1 / steps)``. Full lending needs ``steps`` clean windows in a row.

Why it cannot oscillate faster than its window (checked by a property test over arbitrary
measurements, `tests/unit/core/test_tidal_lending.py`):
1. two raises are at least ``window_s`` apart (the ``last_raise`` condition);
2. a raise is at least ``window_s`` after the last back-off (the ``calm_until`` condition);
3. a back-off needs ``level > 0``, i.e. a raise since the previous back-off.
So between two back-offs there is a raise, which is ``window_s`` after the first of them: back-offs,
raises and so every up-down cycle are at least ``window_s`` apart. Within any interval shorter than
``window_s`` the level changes at most twice (one raise, then one back-off).

Admission at ``level`` is deterministic (no randomness): a credit grows by ``level`` per P2 request
and a request is let in when the credit reaches 1, so over any run of requests the admitted
fraction is within one request of ``level``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput
from gpupool.core.tidal.numbers import finite_number


@dataclass(frozen=True, slots=True)
class GuardConfig:
    window_s: float = 300.0
    slo_ttft_s: float = 0.8
    target: float = 0.99
    steps: int = 4
    min_samples: int = 20

    def __post_init__(self) -> None:
        for name in ("window_s", "slo_ttft_s"):
            v = getattr(self, name)
            if not finite_number(v) or v <= 0:
                raise InvalidInput(f"tidal.lending_{name}", v, "must be a finite number > 0")
        t = self.target
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 1:
            raise InvalidInput("tidal.lending_target", t, "must be a number in (0, 1]")
        if type(self.steps) is not int or self.steps < 1:
            raise InvalidInput("tidal.lending_steps", self.steps, "must be an integer >= 1")
        if type(self.min_samples) is not int or self.min_samples < 1:
            raise InvalidInput("tidal.lending_min_samples", self.min_samples, "must be an integer >= 1")


@dataclass(frozen=True, slots=True)
class LevelChange:
    at: float
    level_from: float
    level_to: float
    attainment: float
    samples: int


class LendingGuard:
    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config or GuardConfig()
        self.level = 0.0
        self.changes: list[LevelChange] = []
        self._samples: deque[tuple[float, bool]] = deque()
        self._good = 0
        self._calm_until = -math.inf
        self._last_raise = -math.inf
        self._credit = 0.0
        self._last_at = -math.inf

    def observe(self, at_s: float, ttft_s: float) -> None:
        """One P0 request's time to first token, measured when its first token came."""
        ok = ttft_s <= self.config.slo_ttft_s
        self._samples.append((at_s, ok))
        self._good += ok

    def _trim(self, now_s: float) -> None:
        cut = now_s - self.config.window_s
        s = self._samples
        while s and s[0][0] <= cut:
            _, ok = s.popleft()
            self._good -= ok

    def attainment(self, now_s: float) -> tuple[float | None, int]:
        """(A(now) or None without samples, number of samples in the window)."""
        self._trim(now_s)
        n = len(self._samples)
        return (self._good / n if n else None), n

    def update(self, now_s: float) -> LevelChange | None:
        """Apply the control law at ``now_s`` (call it periodically); returns the change, if any."""
        if now_s < self._last_at:
            raise InvalidInput("at_s", now_s, f"must not go back in time (last {self._last_at})")
        self._last_at = now_s
        cfg = self.config
        a, n = self.attainment(now_s)
        if a is None or n < cfg.min_samples:
            return None
        old = self.level
        if a < cfg.target:
            if old == 0:
                return None
            self.level = 0.0
            self._calm_until = now_s + cfg.window_s
            self._credit = 0.0
        elif old < 1 and now_s >= self._calm_until and now_s >= self._last_raise + cfg.window_s:
            self.level = min(1.0, round(old + 1.0 / cfg.steps, 9))
            self._last_raise = now_s
        else:
            return None
        ch = LevelChange(now_s, old, self.level, round(a, 6), n)
        self.changes.append(ch)
        return ch

    def raise_possible_at(self) -> float:
        """The earliest time the level can rise: after the calm period of the last back-off and one
        window after the last raise (-inf when nothing holds it; then measurements decide, any tick)."""
        return max(self._calm_until, self._last_raise + self.config.window_s)

    def admit(self) -> bool:
        """Let one P2 request in at the current level (deterministic credit, see the docstring)."""
        if self.level <= 0:
            return False
        self._credit += self.level
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            return True
        return False


__all__ = ["GuardConfig", "LendingGuard", "LevelChange"]
