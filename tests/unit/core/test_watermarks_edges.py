"""Watermark config and reading validation at its exact boundaries (each case kills a mutant that
survived the scenario tests): the documented ranges are closed, and anything outside names its field;
the documented defaults, the integer early-warning boundary, value types and the resume reason."""

from __future__ import annotations

import dataclasses

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.watermarks import Reading, Signal, WatermarkConfig, WatermarkMachine, early_warning


def test_the_closed_ranges_accept_their_ends() -> None:
    WatermarkConfig(vram_high=1.0, vram_low=0.0, early_warning=1.0)
    WatermarkConfig(temp_high_c=150, temp_low_c=0)
    Reading("g", vram_used_mib=0, vram_total_mib=1, at_s=0.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"vram_high": "0.9"}, "watermarks.vram_high"),
        ({"early_warning": None}, "watermarks.early_warning"),
        ({"vram_high": 1.01}, "watermarks.vram_high"),
        ({"temp_high_c": 151}, "watermarks.temp_high_c"),
        ({"temp_low_c": -1}, "watermarks.temp_low_c"),
        ({"temp_high_c": 80.0}, "watermarks.temp_high_c"),
        ({"temp_low_c": True}, "watermarks.temp_low_c"),
    ],
)
def test_out_of_range_or_mistyped_values_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        WatermarkConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize(
    ("used", "total", "field"),
    [(0, 0, "reading.vram_total_mib"), (-1, 10, "reading.vram_used_mib")],
)
def test_readings_outside_their_range_name_the_field(used: int, total: int, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        Reading("g", vram_used_mib=used, vram_total_mib=total, at_s=0.0)
    assert err.value.field == field


def test_values_are_frozen_and_slotted() -> None:
    cfg = WatermarkConfig()
    reading = Reading("g", vram_used_mib=0, vram_total_mib=1, at_s=0.0)
    m = WatermarkMachine("g")
    tr = m.feed(Reading("g", vram_used_mib=95, vram_total_mib=100, at_s=1.0))
    assert tr is not None
    for value in (cfg, reading, tr):
        assert not hasattr(value, "__dict__"), type(value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, None)


def test_defaults_are_the_documented_thresholds() -> None:
    cfg = WatermarkConfig()
    assert (cfg.vram_high, cfg.vram_low, cfg.temp_high_c, cfg.temp_low_c, cfg.early_warning) == (
        0.88, 0.70, 80, 75, 0.85,
    )  # fmt: skip
    m = WatermarkMachine("g")
    assert m.feed(Reading("g", vram_used_mib=0, vram_total_mib=100, at_s=0.0, temperature_c=79)) is None
    hot = m.feed(Reading("g", vram_used_mib=0, vram_total_mib=100, at_s=1.0, temperature_c=80))
    assert hot is not None and hot.signal is Signal.PAUSE


def test_early_warning_boundary_is_exact_in_integers() -> None:
    cfg = WatermarkConfig()  # 85 %
    assert early_warning(84_999, 1, 100_000, cfg)
    assert not early_warning(84_930, 0, 100_000, cfg)
    assert not early_warning(849, 0, 1_000, cfg)


def test_resume_reason_names_the_temperature_only_when_known() -> None:
    m = WatermarkMachine("g")
    m.feed(Reading("g", vram_used_mib=95, vram_total_mib=100, at_s=0.0, temperature_c=70))
    warm = m.feed(Reading("g", vram_used_mib=10, vram_total_mib=100, at_s=1.0, temperature_c=70))
    assert warm is not None and warm.signal is Signal.RESUME
    assert "temperature 70 degC <= 75 degC" in warm.reason
    m.feed(Reading("g", vram_used_mib=95, vram_total_mib=100, at_s=2.0))
    unknown = m.feed(Reading("g", vram_used_mib=10, vram_total_mib=100, at_s=3.0))
    assert unknown is not None and unknown.signal is Signal.RESUME and "temperature" not in unknown.reason
