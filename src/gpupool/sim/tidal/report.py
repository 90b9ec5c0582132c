"""Markdown report and PNG plots of one `gpupool sim tidal` run (docs/tidal/ by default).

Plots: GPU utilisation by hour per strategy (with the online part), P0 TTFT SLO attainment and
the guardrail p99 per strategy, batch tokens by hour per strategy. matplotlib uses the Agg backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.sim.tidal.platform import STRATEGIES

KEYS = (
    "gpu_util",
    "capacity_bound_gpu_util",
    "online_gpu_util",
    "batch_gpu_util",
    "vram_util",
    "p0_ttft_slo_attainment",
    "p0_ttft_slo_bound",
    "p0_ttft_p99_ms",
    "guardrail_p99_ms",
    "batch_tokens_per_day",
    "batch_backlog_left_tokens",
    "preemptions",
    "p2_request_holdbacks",
    "night_serve_ms_p99",
)


def plot(result: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    strategies = result["strategies"]
    names = list(strategies)
    paths = []
    fig, ax = plt.subplots(figsize=(11, 4))
    for name in names:
        ys = strategies[name]["gpu_util_by_hour"]
        ax.plot(range(len(ys)), ys, label=f"{name} (mean {strategies[name]['gpu_util']:.3f})", lw=1.2)
    ax.plot(
        range(len(ys)), strategies["tidal"]["online_util_by_hour"], "k:", lw=1, label="online part (tidal)"
    )
    for a, b in result["night_intervals_h"]:
        ax.axvspan(a, b, color="0.9", zorder=0)
    ax.axhline(0.72, color="r", ls="--", lw=0.8, label="seed claim 0.72")
    ax.set_xlabel("hour of the simulated week (grey: NIGHT mode)")
    ax.set_ylabel("useful GPU busy fraction")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    paths.append(out / "util_by_hour.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    att = [strategies[n]["p0_ttft_slo_attainment"] for n in STRATEGIES]
    bound = [strategies[n]["p0_ttft_slo_bound"] for n in STRATEGIES]
    a1.bar(STRATEGIES, att, color="tab:blue", label="attained")
    a1.plot(STRATEGIES, bound, "k_", ms=30, mew=2, label="bound (no queueing)")
    a1.axhline(0.999, color="r", ls="--", lw=0.8, label="target 0.999")
    a1.set_ylim(0.8, 1.0)
    a1.set_title("P0 TTFT <= 800 ms")
    a1.legend(fontsize=7)
    a2.bar(STRATEGIES, [strategies[n]["guardrail_p99_ms"] for n in STRATEGIES], color="tab:green")
    a2.axhline(30, color="r", ls="--", lw=0.8)
    a2.set_title("guardrail p99 (ms), target 30")
    for a in (a1, a2):
        a.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    paths.append(out / "slo.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 3.5))
    for name in names:
        ys = [t / 1e9 for t in strategies[name]["batch_tokens_by_hour"]]
        ax.plot(
            range(len(ys)), ys, label=f"{name} ({strategies[name]['batch_tokens_per_day'] / 1e9:.2f} B/day)"
        )
    ax.set_xlabel("hour of the simulated week")
    ax.set_ylabel("batch tokens per hour (billions)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "batch_throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def table(result: dict[str, Any]) -> str:
    names = list(result["strategies"])
    rows = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in KEYS:
        cells = []
        for n in names:
            v = result["strategies"][n][k]
            cells.append(f"{v:,}" if isinstance(v, int) else f"{v:.4g}" if isinstance(v, float) else str(v))
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def paths_table(result: dict[str, Any], strategy: str = "tidal") -> str:
    rows = ["| path | requests | serve p50 ms | serve p99 ms | max ms |", "|---|---|---|---|---|"]
    for name, p in result["strategies"][strategy]["night_paths"].items():
        rows.append(
            f"| {name} | {p['requests']:,} | {p['serve_ms_p50']} | {p['serve_ms_p99']} "
            f"| {p['serve_ms_max']} |"
        )
    return "\n".join(rows)


def markdown(result: dict[str, Any], title: str) -> str:
    """``results.md``: the metric table, the night arrival paths of every strategy that lends at
    night (NIGHT P0 arrival -> served, per path) and the pauser costs."""
    parts = [f"# {title}", table(result)]
    for name, st in result["strategies"].items():
        if sum(p["requests"] for p in st["night_paths"].values()):
            parts += [f"## Night arrival paths ({name})", paths_table(result, name)]
    parts += ["## Pauser costs per engine size", costs_table(result)]
    return "\n\n".join(parts) + "\n"


def costs_table(result: dict[str, Any]) -> str:
    c = result["pauser_costs"]
    rows = ["| engine | weights GiB | sleep L1 wake s | cold load s |", "|---|---|---|---|"]
    for name, r in c["engines"].items():
        rows.append(f"| {name} | {r['weights_gib']} | {r['sleep_l1_wake_s']} | {r['cold_load_s']} |")
    rows.append("")
    rows.append("| VRAM footprint | cuda-checkpoint suspend s (same for restore) |")
    rows.append("|---|---|")
    for size, s in c["cuda_checkpoint_suspend_s"].items():
        rows.append(f"| {size} | {s} |")
    return "\n".join(rows)
