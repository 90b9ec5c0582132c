"""``gpupool sim``: the trace-driven placement simulator (FGD experiment, policies, report)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import typer

from gpupool.cli import tidal
from gpupool.cli.errors import UserError, check_range, ensure_dir, user_errors

app = typer.Typer(
    help="Trace-driven placement simulator: reproduce FGD (USENIX ATC'23) on the Alibaba GPU trace.",
    no_args_is_help=True,
)
app.command("tidal")(tidal.sim_tidal)

DEFAULT_POLICIES = "random,dotprod,clustering,packing,bestfit,fgd,seed-bestfit,fgd-capacity,fgd-reserve"
VARIANT_POLICIES = "fgd,fgd-balance-mem"
VARIANT_STOP_PCT = 101  # variant runs end past 101.5 % arrived: the table needs the value at 100 %
DEFAULT_SIM_POLICY_NAME = "fgd-balance-mem"  # = gpupool.sim.policies.DEFAULT_SIM_POLICY (a test checks)
MAX_WORKERS = 1024  # each worker is a forked process: a typo like --workers 100000 must not fork that many


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"invalid --seeds={text!r}: expected comma-separated integers like 42,43") from None
    if not seeds:
        raise UserError(f"invalid --seeds={text!r}: no seed given")
    for s in seeds:
        if not 0 <= s < 2**32:
            raise UserError(f"invalid --seeds={text!r}: seed {s} is outside [0, 4294967295]")
    if len(set(seeds)) != len(seeds):  # a repeated seed would count twice in every median
        raise UserError(f"invalid --seeds={text!r}: a seed is listed twice")
    return seeds


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def _data_dir() -> Path:
    from gpupool.sim.trace import data_dir

    return data_dir(_repo_root())


@app.command("policies")
def policies() -> None:
    """List the simulator's placement policies, one per line; the default is marked '(default)'."""
    from gpupool.sim.policies import DEFAULT_SIM_POLICY, SIM_POLICIES

    for name in SIM_POLICIES:
        typer.echo(f"{name} (default)" if name == DEFAULT_SIM_POLICY else name)


@app.command("variants")
@user_errors
def variants(
    *,
    out: Path = typer.Option(
        ..., "--out", help="Directory for the variant pod lists (openb_pod_list_<name>.csv)."
    ),
    names: str = typer.Option(
        "default",
        "--variants",
        help="Comma-separated variant names (base, cpu300, share60-spec20, ...) or 'default'.",
    ),
    seed: int = typer.Option(1, "--seed", help="Generator seed: the same seed writes the same files."),
    pods: Path | None = typer.Option(
        None, "--pods", help="Base pod list (default: the trace's default list)."
    ),
    nodes: Path | None = typer.Option(None, "--nodes", help="Node list (default: the trace's GPU nodes)."),
) -> None:
    """Write workload variants of a pod list, built like the FGD authors' (see gpupool.sim.variants).

    Knobs, integer %: cpu<P> scales the CPU request of GPU pods (0..300); share<P> makes GPU-sharing
    pods carry P % of the GPU request (1..100); multi<P> makes multi-GPU pods carry at least P %
    (1..90); spec<P> pins at least P % of GPU pods to one GPU model (0..100). Join knobs with '-'.
    """
    from gpupool.sim.trace import check_trace_file
    from gpupool.sim.variant_report import build_variants, write_variants

    check_range("--seed", seed, lo=0, hi=2**32 - 1)
    seed_value = seed
    wanted = _variant_names(names)
    trace_dir = _data_dir() / "alibaba-gpu-v2023"
    base = pods if pods is not None else trace_dir / "openb_pod_list_default.csv"
    node_list = nodes if nodes is not None else trace_dir / "openb_node_list_gpu_node.csv"
    for path in (base, node_list):
        if not path.exists():
            raise UserError(f"file not found: {path} (set --pods/--nodes or GPUPOOL_DATA_DIR)")
        check_trace_file(path)  # (/dev/null, a directory: says what it is)
    ensure_dir("--out", out, create=False)  # a file there is told before the work
    built = build_variants(base, node_list, wanted, seed=seed_value)  # bad input: nothing written
    mixes = write_variants(built, ensure_dir("--out", out))
    typer.echo("variant\tpods\tgpu_request_milli\tsharing_pct\tmulti_pct\tpinned_pct\tcpu_per_gpu_milli")
    for name, m in mixes.items():
        typer.echo(
            f"{name}\t{m.pods}\t{m.gpu_request_milli}\t{m.sharing_pct}\t{m.multi_pct}\t{m.pinned_pct}"
            f"\t{m.cpu_per_gpu_milli}"
        )
    typer.echo(f"wrote {len(mixes)} pod lists to {out}")


def _variant_names(text: str, option: str = "--variants") -> list[str]:
    from gpupool.sim.variants import DEFAULT_MATRIX

    if text.strip() == "default" and option == "--variants":
        return list(DEFAULT_MATRIX)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UserError(f"invalid {option}={text!r}: no variant given")
    seen: dict[tuple[int | None, ...], str] = {}
    for n in names:
        knobs = _knobs(n)
        if knobs in seen:
            raise UserError(f"invalid {option}={text!r}: {n!r} is the same variant as {seen[knobs]!r}")
        seen[knobs] = n
    return names


def _knobs(name: str) -> tuple[int | None, ...]:
    """What makes a variant (cpu050 is cpu50; knob order is free); `InvalidInput` naming the
    variant and the bad token."""
    from gpupool.sim.variants import parse_variant

    v = parse_variant(name)
    return (v.cpu_pct, v.share_pct, v.multi_pct, v.spec_pct)


@app.command("fgd")
@user_errors
def fgd(
    *,
    pods: Path = typer.Option(
        ..., "--pods", help="Pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])."
    ),
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV (sn,cpu_milli,memory_mib,gpu,model)."),
    policy: str = typer.Option(
        DEFAULT_SIM_POLICY_NAME, "--policy", help="Placement policy (see `gpupool sim policies`)."
    ),
    seeds: str = typer.Option("42", "--seeds", help="Comma-separated seeds, e.g. 42,43,44."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    cross_check: bool = typer.Option(
        False,
        "--cross-check",
        help="Compare the simulator's mirror with the core ledger after every pod (slower).",
    ),
    timings: bool = typer.Option(False, "--timings", help="Add run_s (wall seconds per seed) to the output."),
) -> None:
    """Run the FGD experiment: shuffle, top up to 130 % of GPU capacity, place one by one, no departures.

    A progress bar on standard error follows each seed's pods (on a terminal; gone when done).

    JSON fields: policy, workload, seeds, unallocated_gpu_pct_at_100 (median over seeds of the
    unallocated GPU % when the arrived GPU request equals 100 % of capacity), frag_rate_pct_at_90,
    per_seed (those numbers per seed, plus pods and failed), curve (medians per integer arrived %).
    """
    from gpupool.sim.policies import SIM_POLICIES
    from gpupool.sim.report import run_experiment

    seed_list = _seeds(seeds)
    if policy not in SIM_POLICIES:
        raise UserError(f"invalid --policy={policy!r}: known policies: {', '.join(SIM_POLICIES)}")
    from rich.console import Console
    from rich.progress import Progress

    # on standard error and gone when done: standard output stays the result (and --json one object)
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("sim fgd", total=None)

        def progress(seed: int, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=f"seed {seed}: pods")

        out = run_experiment(
            nodes, pods, policy=policy, seeds=seed_list, timings=timings, cross_check=cross_check,
            progress=progress,
        )  # fmt: skip
    if as_json:
        typer.echo(json.dumps(out, sort_keys=False))
        return
    typer.echo(f"{out['workload']} / {out['policy']} / seeds {out['seeds']}")
    never = "n/a (no arrival lands within 1 point of it: the pods are large against this cluster)"
    for label, key in (
        ("unallocated GPU at 100% arrived (median)", "unallocated_gpu_pct_at_100"),
        ("fragmentation rate at 90% arrived (median)", "frag_rate_pct_at_90"),
    ):
        typer.echo(f"  {label}: {never if out[key] is None else f'{out[key]}%'}")
    if timings:
        typer.echo(f"  run time per seed (s): {out['run_s']}")


@app.command("report")
@user_errors
def report(
    *,
    workloads: str = typer.Option(
        "default", "--workloads", help="Comma-separated workload names (openb_pod_list_<name>.csv), or 'all'."
    ),
    policies: str | None = typer.Option(
        None,
        "--policies",
        help=f"Comma-separated policy names (default: {DEFAULT_POLICIES}; "
        f"with --variants: {VARIANT_POLICIES}).",
    ),
    seeds: str = typer.Option("42,43,44,45,46,47,48,49,50,51", "--seeds", help="Comma-separated seeds."),
    out: Path = typer.Option(
        Path("docs/fgd"), "--out", help="Directory for report.md, results.json and PNGs."
    ),
    cache: Path = typer.Option(
        Path(".gpupool/sim-cache"), "--cache", help="Per-run result cache (resumable)."
    ),
    workers: int = typer.Option(
        max(1, min(os.cpu_count() or 2, MAX_WORKERS)),
        "--workers",
        help=f"Parallel worker processes (1..{MAX_WORKERS}; never more than the runs to do).",
    ),
    data: Path | None = typer.Option(
        None, "--data", help="Data root (default ../shared/data or $GPUPOOL_DATA_DIR)."
    ),
    variant_names: str | None = typer.Option(
        None,
        "--variants",
        help="Run workload variants of the default list instead of --workloads: comma-separated names or "
        "'default' (the default matrix); writes variants.md and variants.json.",
    ),
    variant_seed: int = typer.Option(1, "--variant-seed", help="Generator seed of the variants."),
    bound: str = typer.Option(
        "all", "--bound", help="Variants that get the relaxation floor: comma-separated, 'all' or 'none'."
    ),
) -> None:
    """Run workloads x policies x seeds in parallel processes; write a Markdown table and PNG plots.

    With --variants: variants x policies x seeds plus a floor no packing can beat (a relaxation), as
    variants.md and variants.json."""
    from rich.progress import Progress

    from gpupool.sim.plots import plot_frag_rate, plot_unallocated
    from gpupool.sim.report import authors_curves, authors_medians, markdown_table, run_matrix
    from gpupool.sim.trace import load_nodes, load_pods, require_gpu_work
    from gpupool.sim.workload import require_bounded_arrivals

    seed_list = _seeds(seeds)
    check_range("--workers", workers, lo=1, hi=MAX_WORKERS)
    check_range("--variant-seed", variant_seed, lo=0, hi=2**32 - 1)
    root = data if data is not None else _data_dir()
    if variant_names is not None:
        pols = _policy_list(VARIANT_POLICIES if policies is None else policies)
        _variant_report(
            root, _variant_names(variant_names), pols, seed_list,
            variant_seed=variant_seed, bound=bound, out=out, cache=cache,
            workers=workers,
        )  # fmt: skip
        return
    trace_dir = root / "alibaba-gpu-v2023"
    authors_dir = root / "fgd-atc23-expected-results"
    nodes_path = trace_dir / "openb_node_list_gpu_node.csv"
    if not nodes_path.is_file():
        raise UserError(f"node list not found: {nodes_path} (set --data or GPUPOOL_DATA_DIR)")
    if workloads == "all":
        found = sorted(p.stem.removeprefix("openb_pod_list_") for p in trace_dir.glob("openb_pod_list_*.csv"))
        wls = sorted(found, key=lambda w: (w != "default", w))  # the paper's main trace first
    else:
        wls = [w.strip() for w in workloads.split(",") if w.strip()]
        if not wls:
            raise UserError(f"invalid --workloads={workloads!r}: no workload given")
        if len(set(wls)) != len(wls):  # a repeated workload would be a repeated row
            raise UserError(f"invalid --workloads={workloads!r}: a workload is listed twice")
    pols = _policy_list(DEFAULT_POLICIES if policies is None else policies)
    pods_paths = [trace_dir / f"openb_pod_list_{w}.csv" for w in wls]
    for pp in pods_paths:
        if not pp.is_file():
            raise UserError(f"workload file not found: {pp}")
    nodes = load_nodes(nodes_path)  # read every list now: a malformed one is told before anything is written
    for pp in pods_paths:
        listed = load_pods(pp)
        require_gpu_work(nodes, listed, nodes_path=nodes_path, pods_path=pp)
        require_bounded_arrivals(nodes, listed, pods_path=pp)
    ensure_dir("--out", out)  # before the runs: an unusable --out is told now, not after them
    ensure_dir("--cache", cache)
    with Progress() as bar:
        task = bar.add_task("sim runs", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"sim runs ({what})")

        results = run_matrix(
            nodes_path, pods_paths, pols, seed_list, cache=cache, workers=workers, progress=progress
        )
    authors = authors_medians(authors_dir)
    table = markdown_table(results, authors, wls, pols)
    (out / "report.md").write_text(
        "# FGD reproduction: unallocated GPU at 100 % arrived\n\n"
        f"Seeds {seed_list[0]}..{seed_list[-1]} ({len(seed_list)}), tune ratio 1.3, "
        "1,213 GPU nodes. Command: `gpupool sim report --workloads "
        f"{','.join(wls)} --policies {','.join(pols)}`.\n\n" + table
    )
    compact = {
        f"{wl}/{pol}": {k: v for k, v in r.items() if k != "curve"} for (wl, pol), r in results.items()
    }
    (out / "results.json").write_text(json.dumps(compact, indent=1, sort_keys=True) + "\n")
    alloc_authors = authors_curves(authors_dir)
    from gpupool.sim.report import FRAG_RATE_FILE

    rate_authors = authors_curves(authors_dir, FRAG_RATE_FILE)
    for wl in wls:
        plot_unallocated(results, alloc_authors, wl, pols, out / f"unallocated_{wl}.png")
        plot_frag_rate(results, rate_authors, wl, pols, out / f"frag_rate_{wl}.png")
    typer.echo(table)
    typer.echo(f"wrote {out / 'report.md'}, {out / 'results.json'} and plots")


def _policy_list(text: str) -> list[str]:
    from gpupool.sim.policies import SIM_POLICIES

    pols = [p.strip() for p in text.split(",") if p.strip()]
    if not pols:
        raise UserError(f"invalid --policies={text!r}: no policy given")
    for p in pols:
        if p not in SIM_POLICIES:
            raise UserError(f"invalid --policies entry {p!r}: known policies: {', '.join(SIM_POLICIES)}")
    if len(set(pols)) != len(pols):
        raise UserError(f"invalid --policies={text!r}: a policy is listed twice")
    return pols


def _variant_report(
    root: Path,
    names: list[str],
    pols: list[str],
    seed_list: list[int],
    *,
    variant_seed: int,
    bound: str,
    out: Path,
    cache: Path,
    workers: int,
) -> None:
    from gpupool.sim.policies import DEFAULT_SIM_POLICY
    from gpupool.sim.report import run_matrix
    from gpupool.sim.variant_report import (
        bound_matrix,
        build_variants,
        variant_path,
        variants_markdown,
        write_variants,
    )

    text = bound.strip()
    if text in ("none", "all"):
        bound_names = [] if text == "none" else list(names)
    else:
        by_knobs = {_knobs(n): n for n in names}
        bound_names = []
        for b in _variant_names(bound, "--bound"):
            if _knobs(b) not in by_knobs:
                raise UserError(f"invalid --bound entry {b!r}: not among --variants")
            bound_names.append(by_knobs[_knobs(b)])  # as --variants spells it (cpu050 -> cpu50)
    trace_dir = root / "alibaba-gpu-v2023"
    nodes_path = trace_dir / "openb_node_list_gpu_node.csv"
    base = trace_dir / "openb_pod_list_default.csv"
    for path in (nodes_path, base):
        if not path.is_file():
            raise UserError(f"file not found: {path} (set --data or GPUPOOL_DATA_DIR)")
    ensure_dir("--out", out, create=False)
    ensure_dir("--cache", cache, create=False)
    built = build_variants(base, nodes_path, names, seed=variant_seed)  # bad input: nothing written
    ensure_dir("--out", out)  # before the runs: an unusable --out is told now, not after them
    directory = ensure_dir("--cache", cache) / f"variants-seed{variant_seed}"
    mixes = write_variants(built, directory)
    results = run_matrix(
        nodes_path, [variant_path(directory, n) for n in names], pols, seed_list,
        cache=directory / "runs", workers=workers, stop_arrived_pct=VARIANT_STOP_PCT,
    )  # fmt: skip
    bounds = bound_matrix(
        nodes_path, directory, bound_names, seed_list, cache=directory / "runs", workers=workers,
    )  # fmt: skip
    table = variants_markdown(results, bounds, mixes, names, pols, default=DEFAULT_SIM_POLICY)
    command = (
        f"gpupool sim report --variants {','.join(names)} --variant-seed {variant_seed} "
        f"--policies {','.join(pols)}"
        + ("" if bound_names == names else f" --bound {','.join(bound_names) or 'none'}")
    )
    (out / "variants.md").write_text(
        "# Workload variants: unallocated GPU at 100 % arrived\n\n"
        f"Variants of the default pod list (generator seed {variant_seed}, `gpupool sim variants`); "
        f"seeds {seed_list[0]}..{seed_list[-1]} ({len(seed_list)}), tune ratio 1.3, 1,213 GPU nodes; "
        f"default policy `{DEFAULT_SIM_POLICY}`. Command: `{command}`.\n\n" + table
    )
    compact = {
        "variant_seed": variant_seed,
        "seeds": seed_list,
        "default_policy": DEFAULT_SIM_POLICY,
        "mix": {n: asdict(m) for n, m in mixes.items()},
        "cells": {
            f"{n}/{p}": {k: v for k, v in results[(n, p)].items() if k != "curve"}
            for n in names
            for p in pols
        },
        "bound": bounds,
    }
    (out / "variants.json").write_text(json.dumps(compact, indent=1, sort_keys=True) + "\n")
    typer.echo(table)
    typer.echo(f"wrote {out / 'variants.md'} and {out / 'variants.json'}")
