"""Watermark machine: per physical GPU, a pure state machine over readings that says when batch
(P2) work on that GPU must PAUSE and when it may RESUME.

Rules (defaults from the seed; all configurable, validated ``0 <= low < high <= 1``):
- PAUSE when VRAM used >= ``vram_high`` (88 %) of total OR temperature >= ``temp_high_c`` (80 degC);
- RESUME only when VRAM used <= ``vram_low`` (70 %) AND temperature <= ``temp_low_c`` (75 degC);
- between the thresholds the state does not change (hysteresis: no flapping);
- early warning (separate flag): projected use after a grant >= ``early_warning`` (85 %).

Comparisons are done in integers (per-mille of MiB) so that 88 % of 81920 MiB is exact.
The machine never reads a clock: each `Reading` carries its own timestamp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from gpupool.core.errors import InvalidInput


class PressureState(StrEnum):
    NORMAL = "normal"
    PAUSED = "paused"


class Signal(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class WatermarkConfig:
    vram_high: float = 0.88
    vram_low: float = 0.70
    temp_high_c: int = 80
    temp_low_c: int = 75
    early_warning: float = 0.85

    def __post_init__(self) -> None:
        for name in ("vram_high", "vram_low", "early_warning"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or not 0 <= v <= 1
            ):
                raise InvalidInput(f"watermarks.{name}", v, "must be a number in [0, 1]")
        if not self.vram_low < self.vram_high:
            raise InvalidInput(
                "watermarks.vram_low", self.vram_low, f"must be < vram_high ({self.vram_high})"
            )
        for name in ("temp_high_c", "temp_low_c"):
            v = getattr(self, name)
            if type(v) is not int or not 0 <= v <= 150:
                raise InvalidInput(f"watermarks.{name}", v, "must be an integer in [0, 150] degC")
        if not self.temp_low_c < self.temp_high_c:
            raise InvalidInput(
                "watermarks.temp_low_c", self.temp_low_c, f"must be < temp_high_c ({self.temp_high_c})"
            )

    @property
    def high_permille(self) -> int:
        return round(self.vram_high * 1000)

    @property
    def low_permille(self) -> int:
        return round(self.vram_low * 1000)

    @property
    def warn_permille(self) -> int:
        return round(self.early_warning * 1000)


@dataclass(frozen=True, slots=True)
class Reading:
    """One sample of one GPU. ``temperature_c`` None = unknown (treated as cool)."""

    gpu_id: str
    vram_used_mib: int
    vram_total_mib: int
    at_s: float
    temperature_c: int | None = None
    util_pct: int | None = None

    def __post_init__(self) -> None:
        if self.vram_total_mib <= 0:
            raise InvalidInput("reading.vram_total_mib", self.vram_total_mib, "must be > 0")
        if self.vram_used_mib < 0:
            raise InvalidInput("reading.vram_used_mib", self.vram_used_mib, "must be >= 0")


@dataclass(frozen=True, slots=True)
class Transition:
    gpu_id: str
    signal: Signal
    at_s: float
    reason: str


class WatermarkMachine:
    """State of one GPU. `feed` returns a `Transition` exactly when the state changes."""

    __slots__ = ("config", "gpu_id", "last", "state")

    def __init__(self, gpu_id: str, config: WatermarkConfig | None = None) -> None:
        self.gpu_id = gpu_id
        self.config = config or WatermarkConfig()
        self.state = PressureState.NORMAL
        self.last: Reading | None = None

    def feed(self, r: Reading) -> Transition | None:
        cfg = self.config
        self.last = r
        used_pm = r.vram_used_mib * 1000
        total = r.vram_total_mib
        temp = r.temperature_c
        if self.state is PressureState.NORMAL:
            reasons = []
            if used_pm >= cfg.high_permille * total:
                reasons.append(f"VRAM {r.vram_used_mib}/{total} MiB >= {cfg.vram_high:.0%}")
            if temp is not None and temp >= cfg.temp_high_c:
                reasons.append(f"temperature {temp} degC >= {cfg.temp_high_c} degC")
            if reasons:
                self.state = PressureState.PAUSED
                return Transition(self.gpu_id, Signal.PAUSE, r.at_s, "; ".join(reasons))
            return None
        cool = temp is None or temp <= cfg.temp_low_c
        if used_pm <= cfg.low_permille * total and cool:
            self.state = PressureState.NORMAL
            return Transition(
                self.gpu_id,
                Signal.RESUME,
                r.at_s,
                f"VRAM {r.vram_used_mib}/{total} MiB <= {cfg.vram_low:.0%}"
                + (f", temperature {temp} degC <= {cfg.temp_low_c} degC" if temp is not None else ""),
            )
        return None

    @property
    def paused(self) -> bool:
        return self.state is PressureState.PAUSED


def early_warning(used_mib: int, demand_mib: int, total_mib: int, config: WatermarkConfig) -> bool:
    """True when ``used + demand`` would reach the early-warning ratio of ``total``."""
    return (used_mib + demand_mib) * 1000 >= config.warn_permille * total_mib


class WatermarkBank:
    """One machine per GPU, created on first reading. The only mutable owner of pressure state."""

    def __init__(self, config: WatermarkConfig | None = None) -> None:
        self.config = config or WatermarkConfig()
        self._machines: dict[str, WatermarkMachine] = {}

    def feed(self, r: Reading) -> Transition | None:
        m = self._machines.get(r.gpu_id)
        if m is None:
            m = self._machines[r.gpu_id] = WatermarkMachine(r.gpu_id, self.config)
        return m.feed(r)

    def reconfigure(self, config: WatermarkConfig) -> None:
        """New thresholds apply from the next reading; current states are kept."""
        self.config = config
        for m in self._machines.values():
            m.config = config

    def is_paused(self, gpu_id: str) -> bool:
        m = self._machines.get(gpu_id)
        return m is not None and m.paused

    def machines(self) -> dict[str, WatermarkMachine]:
        return dict(self._machines)
