"""Watermark config and reading validation at its exact boundaries (each case kills a mutant that
survived the scenario tests): the documented ranges are closed, and anything outside names its field."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.watermarks import Reading, WatermarkConfig


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
