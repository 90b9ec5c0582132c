"""The FGD experiment matrix: runs, authors' expected results, Markdown table and PNG plots.

Role: `run_experiment` is one (workload, policy, seeds) cell (the ``gpupool sim fgd`` output);
`run_matrix` fans cells x seeds out over worker processes (each job is one run; results are cached
as JSON per (workload, policy, seed) so an interrupted matrix resumes, keyed by the inputs:
`gpupool.sim.runcache`); `authors_medians` reads the
authors' per-run CSVs; `markdown_table` and `plot_*` write the report. No wall-clock timings here:
`run_experiment` only reports them when asked (benchmarks).
"""

from __future__ import annotations

import csv
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from gpupool.sim.engine import run
from gpupool.sim.metrics import RunCurves, run_curves, summary
from gpupool.sim.runcache import check_writable, inputs_key, read_entry, write_entry
from gpupool.sim.trace import load_nodes, load_pods, require_gpu_work, workload_name
from gpupool.sim.workload import require_bounded_arrivals

AUTHOR_POLICIES = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}
ALLOC_FILE = "analysis_allo_discrete.csv"
FRAG_RATE_FILE = "analysis_frag_ratio_discrete.csv"


def run_curves_for(
    nodes_path: str, pods_path: str, policy: str, seed: int, stop_arrived_pct: int | None = None
) -> RunCurves:
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    require_gpu_work(nodes, pods, nodes_path=nodes_path, pods_path=pods_path)
    require_bounded_arrivals(nodes, pods, pods_path=pods_path)
    return run_curves(run(nodes, pods, policy=policy, seed=seed, stop_arrived_pct=stop_arrived_pct))


def run_experiment(
    nodes_path: str | Path,
    pods_path: str | Path,
    *,
    policy: str,
    seeds: Sequence[int],
    timings: bool = False,
    cross_check: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
) -> dict[str, object]:
    """One run per seed; ``progress(seed, done, total)`` follows each run's pods (`engine.run`)."""
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    require_gpu_work(nodes, pods, nodes_path=nodes_path, pods_path=pods_path)
    require_bounded_arrivals(nodes, pods, pods_path=pods_path)
    curves = []
    times = []
    for s in seeds:
        t0 = time.perf_counter()
        step = None if progress is None else functools.partial(progress, s)
        record = run(nodes, pods, policy=policy, seed=s, cross_check_steps=cross_check, progress=step)
        curves.append(run_curves(record))
        times.append(time.perf_counter() - t0)
    out = summary(policy, workload_name(pods_path), curves)
    if timings:
        out["run_s"] = [round(t, 2) for t in times]
    return out


def _cache_file(cache: Path, workload: str, policy: str, seed: int) -> Path:
    return cache / f"{workload}__{policy}__{seed}.json"


def _curves_from_json(d: dict[str, object]) -> RunCurves | None:
    """The cached curves, or None when the entry does not have their shape (a damaged cache)."""

    def keyed(v: object) -> dict[int, float]:
        if not isinstance(v, dict):
            raise TypeError(v)
        return {int(k): float(x) for k, x in v.items()}

    try:
        return RunCurves(
            seed=int(d["seed"]),  # type: ignore[call-overload]
            alloc_pct=keyed(d["alloc_pct"]),
            frag_amount_pct=keyed(d["frag_amount_pct"]),
            frag_rate_pct=keyed(d["frag_rate_pct"]),
            num_pods=int(d["num_pods"]),  # type: ignore[call-overload]
            num_failed=int(d["num_failed"]),  # type: ignore[call-overload]
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def run_matrix(
    nodes_path: Path,
    pods_paths: Sequence[Path],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    cache: Path,
    workers: int,
    progress: Callable[[int, int, str], None] | None = None,
    stop_arrived_pct: int | None = None,
) -> dict[tuple[str, str], dict[str, object]]:
    """Every (workload, policy) summary over ``seeds``; missing runs go to ``workers`` processes.
    ``stop_arrived_pct``: end each run there (see `gpupool.sim.engine.run`); curves stop there too.
    A cached run is used only when made from the same node and pod lists and stop point
    (`gpupool.sim.runcache`); a damaged one is recomputed."""
    cache.mkdir(parents=True, exist_ok=True)
    settings = f"run:stop={stop_arrived_pct}"
    keys = {pp: inputs_key((nodes_path, pp), settings) for pp in pods_paths}
    got: dict[tuple[str, str, int], RunCurves] = {}
    jobs = []
    for pp in pods_paths:
        wl = workload_name(pp)
        for pol in policies:
            for s in seeds:
                entry = read_entry(_cache_file(cache, wl, pol, s), keys[pp])
                c = None if entry is None else _curves_from_json(entry)
                if c is not None and c.seed == s:
                    got[(wl, pol, s)] = c
                else:
                    check_writable(_cache_file(cache, wl, pol, s))
                    jobs.append((pp, wl, pol, s))
    total, done = len(jobs), 0
    if jobs:
        with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
            nodes_arg = str(nodes_path)
            futs = {
                pool.submit(run_curves_for, nodes_arg, str(pp), pol, s, stop_arrived_pct): (pp, wl, pol, s)
                for pp, wl, pol, s in jobs
            }
            for fut in as_completed(futs):
                pp, wl, pol, s = futs[fut]
                c = fut.result()
                write_entry(_cache_file(cache, wl, pol, s), keys[pp], asdict(c))
                got[(wl, pol, s)] = c
                done += 1
                if progress is not None:
                    progress(done, total, f"{wl}/{pol}/{s}")
    out: dict[tuple[str, str], dict[str, object]] = {}
    for pp in pods_paths:
        wl = workload_name(pp)
        for pol in policies:
            out[(wl, pol)] = summary(pol, wl, [got[(wl, pol, s)] for s in seeds])
    return out


def authors_curves(
    results_dir: Path, file: str = ALLOC_FILE
) -> dict[tuple[str, str], list[dict[int, float]]]:
    """(workload, our policy name) -> per-seed {x: value} from the authors' discrete CSV."""
    path = results_dir / file
    out: dict[tuple[str, str], list[dict[int, float]]] = {}
    if not path.is_file():
        return out
    back = {v: k for k, v in AUTHOR_POLICIES.items()}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            pol = back.get(row["sc_policy"])
            if pol is None:
                continue
            wl = workload_name(row["workload"])
            vals = {int(k): float(v) for k, v in row.items() if k.isdigit() and v not in ("", None)}
            out.setdefault((wl, pol), []).append(vals)
    return out


def authors_medians(results_dir: Path) -> dict[tuple[str, str], float]:
    """(workload, policy) -> the authors' median unallocated GPU % at arrived = 100 %."""
    out = {}
    for key, runs in authors_curves(results_dir).items():
        vals = [100.0 - r[100] for r in runs if 100 in r]
        if vals:
            out[key] = round(statistics.median(vals), 2)
    return out


def markdown_table(
    results: dict[tuple[str, str], dict[str, object]],
    authors: dict[tuple[str, str], float],
    workloads: Sequence[str],
    policies: Sequence[str],
) -> str:
    head = "| workload | " + " | ".join(policies) + " |"
    sep = "|---|" + "---|" * len(policies)
    lines = [
        "Unallocated GPU (%) at arrived workload = 100 %, median over seeds; "
        "authors' median in parentheses (lower is better).",
        "",
        head,
        sep,
    ]
    for wl in workloads:
        cells = []
        for pol in policies:
            r = results.get((wl, pol))
            v = None if r is None else r.get("unallocated_gpu_pct_at_100")
            mine = "-" if v is None else f"{float(v):.2f}"  # type: ignore[arg-type]
            a = authors.get((wl, pol))
            cells.append(mine + (f" ({a:.2f})" if a is not None else ""))
        lines.append(f"| {wl} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
