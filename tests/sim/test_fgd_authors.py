"""The simulator's baselines against the FGD authors' published results, checked independently.

The golden files under ``tests/sim/golden`` are regenerated from the code, so they cannot tell a
simulator that drifted from the paper. These tests read the authors' own per-run results
(``fgd-atc23-expected-results/analysis_allo_discrete.csv`` in the data root) with the ``csv`` module
alone, take medians themselves, and compare with:
- the committed matrix ``docs/fgd/results.json`` (what BENCHMARKS.md reports): every baseline's
  median within the spread BENCHMARKS.md claims (fgd and bestfit within 0.18 pp of the authors',
  random / dotprod / clustering / packing within 0.45 pp, both medians rounded to the 2 decimals
  BENCHMARKS.md prints), on all 9 workloads;
- the table in BENCHMARKS.md itself: each cell ``ours (authors')`` equals those two medians;
- the code: a fresh run of one cell (default trace, seed 42) reproduces the committed per-seed
  number, so the committed matrix is what the simulator computes today.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest

from gpupool.sim import engine
from gpupool.sim.metrics import run_curves, unallocated_at
from gpupool.sim.trace import data_dir, load_nodes, load_pods

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "fgd" / "results.json"
WORKLOADS = (
    "default", "cpu050", "cpu100", "gpushare40", "gpushare60", "gpuspec10", "gpuspec20", "multigpu20",
    "multigpu30",
)  # fmt: skip
AUTHOR_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}
# BENCHMARKS.md, section "sim fgd", "Fidelity": the spread the project claims
CLAIMED_PP = {
    "fgd": 0.18,
    "bestfit": 0.18,
    "random": 0.45,
    "dotprod": 0.45,
    "clustering": 0.45,
    "packing": 0.45,
}


def _authors_file() -> Path:
    path = data_dir(REPO) / "fgd-atc23-expected-results" / "analysis_allo_discrete.csv"
    if not path.is_file():
        pytest.skip(f"the FGD authors' results are not under {path.parent}")
    return path


def _authors_medians() -> dict[tuple[str, str], float]:
    """(workload, policy) -> median over the authors' seeds of unallocated GPU % at 100 % arrived."""
    runs: dict[tuple[str, str], list[float]] = {}
    with _authors_file().open(newline="") as fh:
        for row in csv.DictReader(fh):
            policy = AUTHOR_NAMES.get(row["sc_policy"])
            workload = row["workload"].removeprefix("openb_pod_list_")
            if policy is None or row["tune"] != "1.3" or not row["100"]:
                continue
            runs.setdefault((workload, policy), []).append(100.0 - float(row["100"]))
    return {k: statistics.median(v) for k, v in runs.items()}


def _ours() -> dict[str, dict[str, object]]:
    return json.loads(RESULTS.read_text())  # type: ignore[no-any-return]


def _our_median(cell: dict[str, object]) -> float:
    per_seed = cell["per_seed"]
    assert isinstance(per_seed, list) and len(per_seed) == 10
    return statistics.median(float(r["unallocated_gpu_pct_at_100"]) for r in per_seed)


def test_the_authors_file_holds_ten_seeds_per_cell() -> None:
    with _authors_file().open(newline="") as fh:
        seeds: dict[tuple[str, str], set[str]] = {}
        for row in csv.DictReader(fh):
            seeds.setdefault((row["workload"], row["sc_policy"]), set()).add(row["seed"])
    assert len(seeds) == 9 * 6
    assert all(s == {str(x) for x in range(42, 52)} for s in seeds.values())


@pytest.mark.parametrize("policy", sorted(CLAIMED_PP))
def test_committed_medians_are_within_the_claimed_spread_of_the_authors(policy: str) -> None:
    authors = _authors_medians()
    ours = _ours()
    off = {}
    for wl in WORKLOADS:
        cell = ours[f"{wl}/{policy}"]
        mine = _our_median(cell)
        assert mine == pytest.approx(float(cell["unallocated_gpu_pct_at_100"]), abs=1e-3)  # type: ignore[arg-type]
        off[wl] = round(round(mine, 2) - round(authors[(wl, policy)], 2), 2)  # as BENCHMARKS.md prints
    worst = max(abs(d) for d in off.values())
    assert worst <= CLAIMED_PP[policy] + 1e-9, f"{policy}: ours - authors' (pp) per workload: {off}"


def test_the_benchmarks_table_prints_those_medians() -> None:
    authors = _authors_medians()
    ours = _ours()
    text = (REPO / "BENCHMARKS.md").read_text()
    section = text[text.index("## sim fgd") :]
    header = next(line for line in section.splitlines() if line.startswith("| workload |"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:7]
    assert columns == ["random", "dotprod", "clustering", "packing", "bestfit", "fgd"]
    for wl in WORKLOADS:
        row = next(line for line in section.splitlines() if line.startswith(f"| {wl} |"))
        cells = [c.strip() for c in row.strip("|").split("|")][1:7]
        for policy, cell in zip(columns, cells, strict=True):
            m = re.fullmatch(r"([\d.]+) \(([\d.]+)\)", cell)
            assert m, (wl, policy, cell)
            assert float(m.group(1)) == pytest.approx(_our_median(ours[f"{wl}/{policy}"]), abs=0.006)
            assert float(m.group(2)) == pytest.approx(authors[(wl, policy)], abs=0.006), (wl, policy)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["bestfit", "fgd"])
def test_a_fresh_run_reproduces_the_committed_per_seed_number(policy: str) -> None:
    root = data_dir(REPO) / "alibaba-gpu-v2023"
    if not (root / "openb_pod_list_default.csv").is_file():
        pytest.skip(f"trace data not found under {root}")
    rec = engine.run(
        load_nodes(root / "openb_node_list_gpu_node.csv"),
        load_pods(root / "openb_pod_list_default.csv"),
        policy=policy,
        seed=42,
    )
    un = unallocated_at(run_curves(rec), 100)
    committed = next(r for r in _ours()[f"default/{policy}"]["per_seed"] if r["seed"] == 42)  # type: ignore[attr-defined]
    assert un == pytest.approx(committed["unallocated_gpu_pct_at_100"], abs=1e-3)
