"""Per-run curves and across-seed summaries, bucketed the way the FGD authors' analysis scripts do.

Per pod event: arrived % = cumulative GPU request of arrived pods / GPU capacity x 100, rounded to
an integer (half to even, like pandas ``round``); allocated % (rounded to 2 decimals, as theirs);
fragmentation amount % of capacity; fragmentation rate % of idle GPU. The curve value at integer x
is the mean over events whose arrived % is x, or over x-1..x+1 when none is (absent if neither).

Summaries: medians over seeds (``statistics.median``), and the 25-75 % band, per x. Every float that
leaves this module is rounded to `DECIMALS` so that JSON output is byte-stable.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.sim.engine import RunRecord

X_MAX = 130
DECIMALS = 4


@dataclass(frozen=True, slots=True)
class RunCurves:
    seed: int
    alloc_pct: dict[int, float]
    frag_amount_pct: dict[int, float]
    frag_rate_pct: dict[int, float]
    num_pods: int
    num_failed: int


def _bucket(x_pct: np.ndarray, values: np.ndarray) -> dict[int, float]:
    out: dict[int, float] = {}
    for x in range(X_MAX + 1):
        sel = x_pct == x
        if not sel.any():
            sel = (x_pct >= x - 1) & (x_pct <= x + 1)
            if not sel.any():
                continue
        out[x] = round(float(values[sel].mean()), DECIMALS)
    return out


def run_curves(rec: RunRecord) -> RunCurves:
    cap = float(rec.capacity_milli)
    x = np.round(rec.arrived_milli / cap * 100.0)
    alloc = np.round(rec.allocated_milli / cap * 100.0, 2)
    amount = rec.frag_milli / cap * 100.0
    idle = rec.idle_milli.astype(np.float64)
    rate = np.where(idle > 0, rec.frag_milli / np.where(idle > 0, idle, 1.0) * 100.0, 0.0)
    return RunCurves(
        seed=rec.seed,
        alloc_pct=_bucket(x, alloc),
        frag_amount_pct=_bucket(x, amount),
        frag_rate_pct=_bucket(x, rate),
        num_pods=rec.num_pods,
        num_failed=rec.num_failed,
    )


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, DECIMALS)


def unallocated_at(c: RunCurves, x: int) -> float | None:
    a = c.alloc_pct.get(x)
    return None if a is None else _r(100.0 - a)


def median_of(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return _r(statistics.median(vs)) if vs else None


def quantile(values: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=np.float64), q))


def summary(policy: str, workload: str, curves: Sequence[RunCurves]) -> dict[str, object]:
    """The ``gpupool sim fgd --json`` object (see the CLI help for the fields)."""
    per_seed = [
        {
            "seed": c.seed,
            "unallocated_gpu_pct_at_100": unallocated_at(c, 100),
            "frag_rate_pct_at_90": c.frag_rate_pct.get(90),
            "frag_amount_pct_at_100": c.frag_amount_pct.get(100),
            "pods": c.num_pods,
            "failed": c.num_failed,
        }
        for c in curves
    ]
    xs = sorted(set().union(*(c.alloc_pct.keys() for c in curves))) if curves else []
    curve: dict[str, list[float | None]] = {
        "arrived_pct": [float(x) for x in xs],
        "unallocated_gpu_pct": [],
        "unallocated_gpu_pct_p25": [],
        "unallocated_gpu_pct_p75": [],
        "frag_amount_pct": [],
        "frag_rate_pct": [],
    }
    for x in xs:
        un = [100.0 - c.alloc_pct[x] for c in curves if x in c.alloc_pct]
        curve["unallocated_gpu_pct"].append(median_of(un))
        curve["unallocated_gpu_pct_p25"].append(_r(quantile(un, 0.25)))
        curve["unallocated_gpu_pct_p75"].append(_r(quantile(un, 0.75)))
        curve["frag_amount_pct"].append(median_of([c.frag_amount_pct.get(x) for c in curves]))
        curve["frag_rate_pct"].append(median_of([c.frag_rate_pct.get(x) for c in curves]))
    return {
        "policy": policy,
        "workload": workload,
        "seeds": [c.seed for c in curves],
        "unallocated_gpu_pct_at_100": median_of([unallocated_at(c, 100) for c in curves]),
        "frag_rate_pct_at_90": median_of([c.frag_rate_pct.get(90) for c in curves]),
        "per_seed": per_seed,
        "curve": curve,
    }
