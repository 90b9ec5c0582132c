"""Watermark machine: 88 % / 80 degC pause, 70 % + cool resume, no flapping in between."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.watermarks import (
    PressureState,
    Reading,
    Signal,
    WatermarkBank,
    WatermarkConfig,
    WatermarkMachine,
)

TOTAL = 81920  # 80 GiB


def r(used: int, temp: int | None = 60, t: float = 0.0) -> Reading:
    return Reading(gpu_id="g0", vram_used_mib=used, vram_total_mib=TOTAL, temperature_c=temp, at_s=t)


def test_pause_at_88_percent_exactly_and_resume_at_70() -> None:
    m = WatermarkMachine("g0")
    high = TOTAL * 88 // 100  # 72089.6 -> 72089 is just below 88 %
    assert m.feed(r(high)) is None
    tr = m.feed(r(high + 1))  # 72090 * 1000 >= 880 * 81920 = 72089600
    assert tr is not None and tr.signal is Signal.PAUSE and "VRAM" in tr.reason
    assert m.feed(r(TOTAL * 70 // 100 + 1)) is None  # 70 % + 1 MiB: still paused
    tr = m.feed(r(TOTAL * 70 // 100))  # 57344 = exactly 70 %
    assert tr is not None and tr.signal is Signal.RESUME


def test_no_flapping_between_thresholds() -> None:
    m = WatermarkMachine("g0")
    assert m.feed(r(int(TOTAL * 0.9))).signal is Signal.PAUSE  # type: ignore[union-attr]
    for i, frac in enumerate([0.8, 0.85, 0.87, 0.75, 0.71, 0.8, 0.89, 0.72]):
        assert m.feed(r(int(TOTAL * frac), t=i)) is None
    assert m.state is PressureState.PAUSED
    m2 = WatermarkMachine("g1")
    for frac in [0.5, 0.8, 0.87, 0.71, 0.86]:
        assert m2.feed(r(int(TOTAL * frac))) is None
    assert m2.state is PressureState.NORMAL


def test_temperature_pauses_and_must_cool_below_its_own_lower_threshold() -> None:
    m = WatermarkMachine("g0")
    tr = m.feed(r(1000, temp=80))
    assert tr is not None and tr.signal is Signal.PAUSE and "temperature" in tr.reason
    assert m.feed(r(1000, temp=76)) is None  # VRAM is low, but 76 > 75 degC
    assert m.feed(r(1000, temp=75)).signal is Signal.RESUME  # type: ignore[union-attr]


def test_vram_low_alone_does_not_resume_while_hot() -> None:
    m = WatermarkMachine("g0")
    m.feed(r(int(TOTAL * 0.95), temp=85))
    assert m.feed(r(int(TOTAL * 0.5), temp=82)) is None
    assert m.paused


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"vram_high": 0.7, "vram_low": 0.7}, "watermarks.vram_low"),
        ({"vram_high": 1.2}, "watermarks.vram_high"),
        ({"vram_low": -0.1}, "watermarks.vram_low"),
        ({"vram_high": float("nan")}, "watermarks.vram_high"),
        ({"temp_low_c": 80}, "watermarks.temp_low_c"),
        ({"early_warning": 2}, "watermarks.early_warning"),
    ],
)
def test_config_is_validated(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        WatermarkConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_custom_thresholds_and_bank() -> None:
    bank = WatermarkBank(WatermarkConfig(vram_high=0.5, vram_low=0.2))
    assert bank.feed(Reading("a", 50, 100, 0.0)).signal is Signal.PAUSE  # type: ignore[union-attr]
    assert bank.feed(Reading("b", 49, 100, 0.0)) is None
    assert bank.is_paused("a") and not bank.is_paused("b")
    bank.reconfigure(WatermarkConfig(vram_high=0.9, vram_low=0.6))
    assert bank.feed(Reading("a", 60, 100, 1.0)).signal is Signal.RESUME  # type: ignore[union-attr]


def test_early_warning_projection() -> None:
    from gpupool.core.watermarks import early_warning

    cfg = WatermarkConfig()
    assert not early_warning(80, 4, 100, cfg)
    assert early_warning(80, 5, 100, cfg)
