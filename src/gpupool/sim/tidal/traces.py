"""Trace inputs of the tidal simulation: the arrival shape and the token sizes.

- Arrival shape: request timestamps of ``alibaba-genai-v2026/lora_request_trace.csv`` (24 days of a
  production serving platform) as hourly counts. The trace's clock is shifted by an unknown
  constant, so we rotate it by the whole-hour phase that puts the most requests inside the
  08:30-19:30 day window (computed, reported as ``phase_shift_h``); the weekly pattern (low days) is
  kept as recorded. The simulated local days run from ``first_day`` (``--first-day``) after one
  warm-up day; the trace must cover all of them (`ValueError` naming the window and the trace's
  span otherwise: a day outside it would be simulated silently without traffic). The shape is
  normalised to peak 1.0 and linearly interpolated per minute.
- Token sizes: (ContextTokens, GeneratedTokens) pairs of ``azure-llm-2023/AzureLLMInferenceTrace_code.csv``,
  sampled with replacement from an explicit seed.

Both files are read from ``../shared/data`` relative to the repository root, or ``GPUPOOL_DATA_DIR``.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpupool.sim.trace import check_trace_file

ALIBABA = "alibaba-genai-v2026/lora_request_trace.csv"
AZURE = "azure-llm-2023/AzureLLMInferenceTrace_code.csv"
FIRST_DAY = datetime(2024, 11, 30)
"""The default first measured local day (``--first-day``): a Saturday of the GenAI trace after the
phase shift (the week runs Sat..Fri, so it holds a weekend). The day before (Fri 11-29) is the
controller's warm-up day; the trace covers up to 9 days from it."""


def data_dir() -> Path:
    env = os.environ.get("GPUPOOL_DATA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[4].parent / "shared" / "data"


@dataclass(frozen=True, slots=True)
class Traces:
    hourly_shape: npt.NDArray[np.float64]
    """Requests per hour, normalised to max 1.0, local time, starting at local midnight of day 0."""
    phase_shift_h: int
    prompt_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]


TIME_COLUMN = "gmt_create"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_CANONICAL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")
"""The zero-padded form of `TIME_FORMAT`, which `datetime.fromisoformat` reads to the same value
about 20x faster than ``strptime`` (the trace has tens of thousands of rows); other spellings that
``strptime`` accepts (unpadded fields) still go through it."""


def _parse_time(text: str) -> datetime:
    if _CANONICAL_TIME.fullmatch(text):
        return datetime.fromisoformat(text)
    return datetime.strptime(text, TIME_FORMAT)


def _hourly_counts(path: Path) -> tuple[dict[datetime, int], int]:
    """Requests per trace hour of the GenAI trace and the phase shift. Only ``gmt_create`` is read
    (any column order, extra columns, a byte-order mark, rows in any order); `ValueError` naming the
    file, the line and the column for anything else (`FileNotFoundError` when it is missing)."""
    check_trace_file(path)  # a directory or a device: says what it is
    counts: dict[datetime, int] = {}
    with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
        reader = csv.DictReader(f)
        try:
            if TIME_COLUMN not in (reader.fieldnames or ()):
                raise ValueError(f"{path}: not the Alibaba GenAI format: no column {TIME_COLUMN}")
            for row in reader:
                raw = row.get(TIME_COLUMN)
                try:
                    t = _parse_time((raw or "").strip())
                except ValueError:
                    raise ValueError(
                        f"{path}: line {reader.line_num}: column {TIME_COLUMN}={raw!r} is not a time "
                        "YYYY-MM-DD HH:MM:SS"
                    ) from None
                t = t.replace(minute=0, second=0)
                counts[t] = counts.get(t, 0) + 1
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except csv.Error as exc:
            raise ValueError(f"{path}: line {reader.line_num}: {exc}") from None
    if not counts:
        raise ValueError(f"{path}: no requests")
    by_hour = [0] * 24
    for t, c in counts.items():
        by_hour[t.hour] += c
    # phase: local = trace + shift; maximise requests in local hours 9..19 (the 08:30-19:30 window)
    best = max(range(24), key=lambda s: (sum(by_hour[(h - s) % 24] for h in range(9, 19)), -s))
    return counts, best


MAX_CONTEXT_TOKENS = 131_072
"""Prompt + output of one request at most: Qwen2.5's longest context (with YaRN), the most either
main model serves (the Azure code trace: at most 7,841 in all)."""


def _count(path: Path, line: int, row: dict[str, str], col: str) -> int:
    raw = row.get(col)
    try:
        return int((raw or "").strip())
    except ValueError:
        raise ValueError(
            f"--trace {path}: line {line}: column {col}={raw!r}: token counts must be integers"
        ) from None


def load(
    days: int,
    *,
    base: Path | None = None,
    token_trace: Path | None = None,
    first_day: datetime = FIRST_DAY,
) -> Traces:
    """``days`` local days from ``first_day`` (midnight), after one warm-up day. ``token_trace``:
    another request trace in the Azure LLM format (CSV with ``ContextTokens`` and
    ``GeneratedTokens`` columns) instead of the code trace; `ValueError` names a missing column."""
    root = base or data_dir()
    alibaba, azure = root / ALIBABA, token_trace or root / AZURE
    for p in (alibaba, azure):
        if not p.exists():
            raise FileNotFoundError(f"trace file {p} not found (set GPUPOOL_DATA_DIR)")
        check_trace_file(p)  # a directory or a device: says what it is
    counts, shift = _hourly_counts(alibaba)
    # +1 day in front: the warm-up day that teaches the mode controller its baseline
    hours = (days + 1) * 24
    start = first_day - timedelta(days=1) - timedelta(hours=shift)
    first, end = min(counts), max(counts) + timedelta(hours=1)
    if start < first or start + timedelta(hours=hours) > end:
        local = timedelta(hours=shift)
        raise ValueError(
            f"{alibaba}: no requests in the simulated window: --first-day {first_day:%Y-%m-%d} --days "
            f"{days} needs local {start + local:%Y-%m-%d %H:%M} (the warm-up day) .. "
            f"{start + local + timedelta(hours=hours):%Y-%m-%d %H:%M}; the trace covers local "
            f"{first + local:%Y-%m-%d %H:%M} .. {end + local:%Y-%m-%d %H:%M} (phase shift +{shift} h)"
        )
    shape = np.array([counts.get(start + timedelta(hours=h), 0) for h in range(hours)], dtype=np.float64)
    if shape.max() <= 0:
        raise ValueError(f"{alibaba}: no requests in the simulated window from {start} ({hours} h)")
    shape /= shape.max()
    ctx, gen = [], []
    with azure.open(newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
        try:
            reader = csv.DictReader(f)
            missing = {"ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"--trace {azure}: not the Azure LLM format: no column {sorted(missing)[0]}")
            for row in reader:
                i = reader.line_num  # blank lines and quoted line breaks count too
                c, g = (_count(azure, i, row, col) for col in ("ContextTokens", "GeneratedTokens"))
                if c < 0 or g < 0:
                    raise ValueError(f"--trace {azure}: line {i}: token counts must be >= 0, got {c}, {g}")
                if c + g > MAX_CONTEXT_TOKENS:
                    raise ValueError(
                        f"--trace {azure}: line {i}: {c} + {g} tokens exceed the main models' context "
                        f"of {MAX_CONTEXT_TOKENS}"
                    )
                ctx.append(c)
                gen.append(g)
        except UnicodeDecodeError as exc:
            raise ValueError(f"--trace {azure}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except csv.Error as exc:
            raise ValueError(f"--trace {azure}: line {reader.line_num}: {exc}") from None
    if not ctx:
        raise ValueError(f"--trace {azure}: no requests")
    if not any(ctx):  # the load is sized by the prompts' prefill work (`run._sized_peak`)
        raise ValueError(f"--trace {azure}: every request has 0 ContextTokens: nothing sizes the load")
    return Traces(shape, shift, np.array(ctx, dtype=np.int64), np.array(gen, dtype=np.int64))


def minute_rates(shape: npt.NDArray[np.float64], peak_per_s: float) -> npt.NDArray[np.float64]:
    """Arrival rate (requests/s) per minute, linear between hour midpoints."""
    minutes = np.arange(len(shape) * 60, dtype=np.float64)
    mids = np.arange(len(shape), dtype=np.float64) * 60 + 30
    return np.interp(minutes, mids, shape) * peak_per_s


def poisson_arrivals(
    rates_per_min: npt.NDArray[np.float64], *, rng: np.random.Generator, t0_s: float = 0.0
) -> npt.NDArray[np.float64]:
    """A non-homogeneous Poisson process, piecewise constant per minute; sorted seconds from t0."""
    n = rng.poisson(rates_per_min * 60.0)
    minute = np.repeat(np.arange(len(rates_per_min)), n)
    t = t0_s + (minute + rng.random(len(minute))) * 60.0
    return np.sort(t)
