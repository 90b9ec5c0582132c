"""Every benchmark driver behind `make bench` / BENCHMARKS.md runs once at tiny size in `make test`.

No timing is asserted (timings belong to BENCHMARKS.md); these prove the drivers run end to end and
report the fields BENCHMARKS.md quotes, and that the allocator benchmark's start occupancy is the
pool's state before its timed phase, not after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpupool.bench import allocator_bench

REPO = Path(__file__).resolve().parents[3]


def gpupool(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_extender_bench_runs_at_tiny_size() -> None:
    doc = gpupool("bench", "extender", "--json", "--nodes", "4", "--gpus-per-node", "2", "--samples", "5")
    assert doc["benchmark"] == "extender" and doc["nodes"] == 4 and doc["samples"] == 5
    for fill in ("nan", "-1", "1e9"):
        r = subprocess.run(
            [sys.executable, "-m", "gpupool.cli.main", "bench", "extender", "--fill", fill],
            capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        )  # fmt: skip
        assert r.returncode == 2 and f"invalid --fill={float(fill)}" in r.stderr, r.stderr
    for key in ("filter_prioritize_p50_ms", "filter_prioritize_p99_ms", "in_process_p50_ms"):
        assert isinstance(doc[key], float) and doc[key] > 0, key
    assert 0 < doc["nodes_passing_mean"] <= 4  # some nodes can hold the probe pods, none invented


def test_plan_bench_runs_at_tiny_size() -> None:
    doc = gpupool(
        "bench", "plan", "--json", "--repeats", "1", "--scale", "1", "--examples", str(REPO / "examples")
    )
    assert doc["benchmark"] == "plan" and doc["repeats"] == 1
    rows = doc["results"]
    assert isinstance(rows, list) and len(rows) == 3
    for row in rows:
        assert row["gpus"] > 0 and row["replicas"] > 0 and 0 < row["min_ms"] <= row["median_ms"]


def test_allocator_bench_start_occupancy_is_measured_before_the_timed_phase() -> None:
    (row,) = allocator_bench.run(sizes=[200], ops=200, seed_ops=30, seed=1)["results"]
    before = allocator_bench._occupancy_pct(allocator_bench._prepare(200, 1).alloc)  # same seed, same fill
    assert row["occupancy_start_pct"] == before >= 70.0  # the pre-fill stops at 70 % of pool VRAM
    assert row["occupancy_end_pct"] != row["occupancy_start_pct"]  # the timed pairs move it: 200 pairs
