"""The variant matrix: workload variants x policies (median of seeds) next to a floor no packing beats.

Role: `build_variants` makes the variant pod lists of `gpupool.sim.variants` for one generator
seed (all of them first, so bad input writes nothing) and `write_variants` writes them into a
directory (so `gpupool.sim.report.run_matrix` runs and caches them like any workload);
`bound_matrix` runs `gpupool.sim.bound.offline_bound` (a floor no packing can beat) per
(variant, seed) in worker processes, cached as JSON; `variants_markdown` writes the table: per
variant the measured mix, each policy's median unallocated GPU % at 100 % arrived, the floor, the
default policy against the reference (FGD) and the default's distance to the floor. Relative
change = (policy - reference) / reference, in %; the summary gives the mean and the worst (largest)
relative change over the variants. No timings here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpupool.sim.bound import offline_bound
from gpupool.sim.runcache import check_writable, inputs_key, read_entry, write_entry
from gpupool.sim.trace import PodSpec, TraceFormatError, load_nodes, load_pods, require_gpu_work
from gpupool.sim.variants import VariantStats, make_variant, stats, write_pods
from gpupool.sim.workload import require_bounded_arrivals


def variant_path(directory: Path, name: str) -> Path:
    return directory / f"openb_pod_list_{name}.csv"


def build_variants(
    base_pods: Path, nodes_path: Path, names: Sequence[str], *, seed: int
) -> dict[str, tuple[PodSpec, ...]]:
    """Every variant's pods, in memory: a bad name or input raises before anything is written.
    The node list needs a GPU node (the cpu and spec knobs are sized by the GPU nodes)."""
    nodes, pods = load_nodes(nodes_path), load_pods(base_pods)
    if not any(n.gpu_count for n in nodes):
        raise TraceFormatError(f"{nodes_path}: no node has a GPU (the variants are sized by the GPU nodes)")
    out = {name: make_variant(pods, nodes, name, seed=seed) for name in names}
    for v in out.values():
        require_gpu_work(nodes, v, nodes_path=nodes_path, pods_path=base_pods)
        require_bounded_arrivals(nodes, v, pods_path=base_pods)
    return out


def write_variants(variants: dict[str, tuple[PodSpec, ...]], directory: Path) -> dict[str, VariantStats]:
    """Write each variant's pod list into ``directory``; return each one's measured mix."""
    out: dict[str, VariantStats] = {}
    for name, v in variants.items():
        write_pods(v, variant_path(directory, name))
        out[name] = stats(v)
    return out


FLOOR_VERSION = 2
"""1: the pooled-CPU relaxation alone; 2: the larger of it and the sharing pods' card floor."""


_FLOOR_FIELDS = (
    "arrived_milli",
    "capacity_milli",
    "cpu_placeable_milli",
    "cards_placeable_milli",
    "pooled_bfd_placeable_milli",
)


def _floor_entry_ok(entry: dict[str, object], seed: int) -> bool:
    """A cached floor has the fields the table reads, as numbers (else it is recomputed)."""
    if entry.get("seed") != seed or not all(type(entry.get(f)) is int for f in _FLOOR_FIELDS):
        return False
    share = entry.get("unallocated_pct")
    return entry["capacity_milli"] != 0 and type(share) in (int, float)


def _pct_left(r: dict[str, int], key: str) -> float:
    return round(100.0 - 100.0 * r[key] / r["capacity_milli"], 4)


def _bound_job(nodes_path: str, pods_path: str, seed: int) -> dict[str, object]:
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    require_gpu_work(nodes, pods, nodes_path=nodes_path, pods_path=pods_path)
    r = offline_bound(nodes, pods, seed=seed)
    return {**asdict(r), "unallocated_pct": r.unallocated_pct}


def bound_matrix(
    nodes_path: Path,
    directory: Path,
    names: Sequence[str],
    seeds: Sequence[int],
    *,
    cache: Path,
    workers: int,
) -> dict[str, dict[str, object]]:
    """Per variant: the per-seed floor and its median (cached per (variant, seed); the file name
    carries `FLOOR_VERSION`, so a cache written by an older floor is not read; an entry is used only
    when made from the same node and pod lists, and a damaged one is recomputed, see
    `gpupool.sim.runcache`)."""
    cache.mkdir(parents=True, exist_ok=True)

    def file(name: str, seed: int) -> Path:
        return cache / f"{name}__floor{FLOOR_VERSION}__{seed}.json"

    keys = {n: inputs_key((nodes_path, variant_path(directory, n)), "floor") for n in names}
    got: dict[tuple[str, int], dict[str, object]] = {}
    for n in names:
        for s in seeds:
            entry = read_entry(file(n, s), keys[n])
            if entry is not None and _floor_entry_ok(entry, s):
                got[(n, s)] = entry
    jobs = [(n, s) for n in names for s in seeds if (n, s) not in got]
    for n, s in jobs:
        check_writable(file(n, s))
    if jobs:
        with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
            futs = {
                (n, s): pool.submit(_bound_job, str(nodes_path), str(variant_path(directory, n)), s)
                for n, s in jobs
            }
            for (n, s), fut in futs.items():
                got[(n, s)] = fut.result()
                write_entry(file(n, s), keys[n], got[(n, s)])
    out: dict[str, dict[str, object]] = {}
    for n in names:
        per_seed: list[dict[str, Any]] = [got[(n, s)] for s in seeds]
        cpu_binds = any(r["cpu_placeable_milli"] < r["cards_placeable_milli"] for r in per_seed)
        bfd = statistics.median(_pct_left(r, "pooled_bfd_placeable_milli") for r in per_seed)
        out[n] = {
            "unallocated_gpu_pct_at_100": round(statistics.median(r["unallocated_pct"] for r in per_seed), 4),
            "pooled_bfd_pct_at_100": None if cpu_binds else round(bfd, 4),
            "per_seed": [
                {
                    "seed": r["seed"],
                    "unallocated_pct": r["unallocated_pct"],
                    "arrived_milli": r["arrived_milli"],
                    "cpu_floor_pct": _pct_left(r, "cpu_placeable_milli"),
                    "cards_floor_pct": _pct_left(r, "cards_placeable_milli"),
                    "pooled_bfd_pct": _pct_left(r, "pooled_bfd_placeable_milli"),
                }
                for r in per_seed
            ],
        }
    return out


def relative_pct(value: float, reference: float) -> float:
    return 100.0 * (value - reference) / reference if reference else 0.0


def variants_markdown(
    results: dict[tuple[str, str], dict[str, object]],
    bounds: dict[str, dict[str, object]],
    mixes: dict[str, VariantStats],
    names: Sequence[str],
    policies: Sequence[str],
    *,
    default: str,
    reference: str = "fgd",
) -> str:
    def cell(name: str, pol: str) -> float | None:
        r = results.get((name, pol))
        v = None if r is None else r.get("unallocated_gpu_pct_at_100")
        return None if v is None else float(v)  # type: ignore[arg-type]

    head = ["variant", "sharing % of GPU", "multi-GPU % of GPU", "pinned % of pods", "CPU cores per GPU"]
    head += [*policies, "floor", "offline BFD", f"{default} vs {reference}", f"{default} - floor"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    rels: list[float] = []
    for n in names:
        m = mixes[n]
        row = [
            n,
            f"{m.sharing_pct:.1f}",
            f"{m.multi_pct:.1f}",
            f"{m.pinned_pct:.1f}",
            f"{m.cpu_per_gpu_milli / 1000:.1f}",
        ]
        vals = {p: cell(n, p) for p in policies}
        best = min((v for v in vals.values() if v is not None), default=None)
        for p in policies:
            v = vals[p]
            row.append("-" if v is None else (f"**{v:.2f}**" if v == best else f"{v:.2f}"))
        b = bounds.get(n)
        bv = None if b is None else float(b["unallocated_gpu_pct_at_100"])  # type: ignore[arg-type]
        row.append("-" if bv is None else f"{bv:.2f}")
        bfd = None if b is None else b.get("pooled_bfd_pct_at_100")
        row.append("-" if bfd is None else f"{float(bfd):.2f}")  # type: ignore[arg-type]
        d, ref = vals.get(default), vals.get(reference)
        if d is not None and ref is not None:
            rels.append(relative_pct(d, ref))
            row.append(f"{rels[-1]:+.1f} %")
        else:
            row.append("-")
        row.append("-" if bv is None or d is None else f"{d - bv:+.2f}")
        lines.append("| " + " | ".join(row) + " |")
    summary = ""
    if rels:
        worse = sum(1 for r in rels if r > 0)
        summary = (
            f"\n{default} vs {reference} over {len(rels)} variants: mean {statistics.fmean(rels):+.1f} %, "
            f"worst {max(rels):+.1f} %, best {min(rels):+.1f} %; worse than {reference} on {worse}.\n"
        )
    intro = (
        "Unallocated GPU (%) at arrived workload = 100 %, median over seeds (lower is better; best "
        "policy in bold). floor = the larger of two relaxations of the same arrivals, the pooled "
        "cluster's CPU and the cards GPU-sharing pods must strand: no packing, online or offline, can "
        "leave less unallocated (`gpupool.sim.bound`, `gpupool.sim.cardfloor`). offline BFD = an "
        "offline packer on the pooled cluster (best-fit decreasing, CPU ignored; not a bound), shown "
        "where CPU does not bind. '-' = not run.\n\n"
    )
    return intro + "\n".join(lines) + "\n" + summary
