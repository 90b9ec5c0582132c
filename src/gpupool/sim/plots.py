"""PNG plots of the FGD experiment (matplotlib, Agg backend, imported lazily by the CLI only).

- `plot_unallocated`: like the paper's Fig. 9a, unallocated GPU % vs arrived workload % (x 75..120),
  our medians with the 25-75 % band, the authors' medians dashed, and the ideal line 100 - x.
- `plot_frag_rate`: like Fig. 7, fragmentation rate % of idle GPU vs arrived workload (x 0..100).
Figures are small (6 x 3.8 in at 64 dpi) to keep the committed PNGs small.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _authors_median(runs: list[dict[int, float]], xs: Sequence[int], *, invert: bool) -> list[float]:
    out = []
    for x in xs:
        vals = [r[x] for r in runs if x in r]
        v = statistics.median(vals) if vals else float("nan")
        out.append(100.0 - v if invert else v)
    return out


def _series(result: dict[str, object], key: str) -> tuple[list[float], list[float]]:
    curve = result["curve"]
    assert isinstance(curve, dict)
    xs = [float(x) for x in curve["arrived_pct"]]
    ys = [float("nan") if v is None else float(v) for v in curve[key]]
    return xs, ys


def plot_unallocated(
    results: dict[tuple[str, str], dict[str, object]],
    authors: dict[tuple[str, str], list[dict[int, float]]],
    workload: str,
    policies: Sequence[str],
    path: Path,
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8), dpi=64)
    lo, hi = 75, 120
    for i, pol in enumerate(policies):
        r = results.get((workload, pol))
        if r is None:
            continue
        color = f"C{i % 10}"
        xs, ys = _series(r, "unallocated_gpu_pct")
        _, p25 = _series(r, "unallocated_gpu_pct_p25")
        _, p75 = _series(r, "unallocated_gpu_pct_p75")
        ax.plot(xs, ys, color=color, label=pol, linewidth=1.4)
        ax.fill_between(xs, p25, p75, color=color, alpha=0.2, linewidth=0)
        runs = authors.get((workload, pol))
        if runs:
            axs = list(range(lo, hi + 1))
            ax.plot(axs, _authors_median(runs, axs, invert=True), color=color, linestyle="--", linewidth=1.0)
    ideal = list(range(lo, hi + 1))
    ax.plot(ideal, [max(0.0, 100.0 - x) for x in ideal], color="grey", linestyle=":", label="ideal")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, 30)
    ax.set_xlabel("arrived workload (% of GPU capacity)")
    ax.set_ylabel("unallocated GPU (%)")
    ax.set_title(f"{workload}: ours solid (25-75% band), authors dashed")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_frag_rate(
    results: dict[tuple[str, str], dict[str, object]],
    authors: dict[tuple[str, str], list[dict[int, float]]],
    workload: str,
    policies: Sequence[str],
    path: Path,
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8), dpi=64)
    for i, pol in enumerate(policies):
        r = results.get((workload, pol))
        if r is None:
            continue
        color = f"C{i % 10}"
        xs, ys = _series(r, "frag_rate_pct")
        ax.plot(xs, ys, color=color, label=pol, linewidth=1.4)
        runs = authors.get((workload, pol))
        if runs:
            axs = list(range(0, 101))
            ax.plot(axs, _authors_median(runs, axs, invert=False), color=color, linestyle="--", linewidth=1.0)
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.set_xlabel("arrived workload (% of GPU capacity)")
    ax.set_ylabel("fragmentation rate (% of idle GPU)")
    ax.set_title(f"{workload}: ours solid, authors dashed")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
