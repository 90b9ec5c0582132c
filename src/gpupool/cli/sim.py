"""``gpupool sim``: the trace-driven placement simulator (FGD experiment, policies, report)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from gpupool.cli import tidal
from gpupool.cli.errors import UserError, check_range, user_errors

app = typer.Typer(
    help="Trace-driven placement simulator: reproduce FGD (USENIX ATC'23) on the Alibaba GPU trace.",
    no_args_is_help=True,
)
app.command("tidal")(tidal.sim_tidal)

DEFAULT_POLICIES = "random,dotprod,clustering,packing,bestfit,fgd,seed-bestfit,fgd-capacity,fgd-reserve"


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
    return seeds


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def _data_dir() -> Path:
    from gpupool.sim.trace import data_dir

    return data_dir(_repo_root())


@app.command("policies")
def policies() -> None:
    """List the simulator's placement policies, one per line."""
    from gpupool.sim.policies import SIM_POLICIES

    for name in SIM_POLICIES:
        typer.echo(name)


@app.command("fgd")
@user_errors
def fgd(
    *,
    pods: Path = typer.Option(
        ..., "--pods", help="Pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])."
    ),
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV (sn,cpu_milli,memory_mib,gpu,model)."),
    policy: str = typer.Option("fgd", "--policy", help="Placement policy (see `gpupool sim policies`)."),
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

    JSON fields: policy, workload, seeds, unallocated_gpu_pct_at_100 (median over seeds of the
    unallocated GPU % when the arrived GPU request equals 100 % of capacity), frag_rate_pct_at_90,
    per_seed (those numbers per seed, plus pods and failed), curve (medians per integer arrived %).
    """
    from gpupool.sim.policies import SIM_POLICIES
    from gpupool.sim.report import run_experiment

    seed_list = _seeds(seeds)
    if policy not in SIM_POLICIES:
        raise UserError(f"invalid --policy={policy!r}: known policies: {', '.join(SIM_POLICIES)}")
    out = run_experiment(
        nodes, pods, policy=policy, seeds=seed_list, timings=timings, cross_check=cross_check
    )
    if as_json:
        typer.echo(json.dumps(out, sort_keys=False))
        return
    typer.echo(f"{out['workload']} / {out['policy']} / seeds {out['seeds']}")
    typer.echo(f"  unallocated GPU at 100% arrived (median): {out['unallocated_gpu_pct_at_100']}%")
    typer.echo(f"  fragmentation rate at 90% arrived (median): {out['frag_rate_pct_at_90']}%")
    if timings:
        typer.echo(f"  run time per seed (s): {out['run_s']}")


@app.command("report")
@user_errors
def report(
    *,
    workloads: str = typer.Option(
        "default", "--workloads", help="Comma-separated workload names (openb_pod_list_<name>.csv), or 'all'."
    ),
    policies: str = typer.Option(DEFAULT_POLICIES, "--policies", help="Comma-separated policy names."),
    seeds: str = typer.Option("42,43,44,45,46,47,48,49,50,51", "--seeds", help="Comma-separated seeds."),
    out: Path = typer.Option(
        Path("docs/fgd"), "--out", help="Directory for report.md, results.json and PNGs."
    ),
    cache: Path = typer.Option(
        Path(".gpupool/sim-cache"), "--cache", help="Per-run result cache (resumable)."
    ),
    workers: int = typer.Option(
        max(1, (os.cpu_count() or 2)), "--workers", help="Parallel worker processes."
    ),
    data: Path | None = typer.Option(
        None, "--data", help="Data root (default ../shared/data or $GPUPOOL_DATA_DIR)."
    ),
) -> None:
    """Run workloads x policies x seeds in parallel processes; write a Markdown table and PNG plots."""
    from rich.progress import Progress

    from gpupool.sim.plots import plot_frag_rate, plot_unallocated
    from gpupool.sim.policies import SIM_POLICIES
    from gpupool.sim.report import authors_curves, authors_medians, markdown_table, run_matrix

    seed_list = _seeds(seeds)
    check_range("--workers", workers, lo=1)
    root = data if data is not None else _data_dir()
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
    pols = [p.strip() for p in policies.split(",") if p.strip()]
    for p in pols:
        if p not in SIM_POLICIES:
            raise UserError(f"invalid --policies entry {p!r}: known policies: {', '.join(SIM_POLICIES)}")
    pods_paths = [trace_dir / f"openb_pod_list_{w}.csv" for w in wls]
    for pp in pods_paths:
        if not pp.is_file():
            raise UserError(f"workload file not found: {pp}")
    with Progress() as bar:
        task = bar.add_task("sim runs", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"sim runs ({what})")

        results = run_matrix(
            nodes_path, pods_paths, pols, seed_list, cache=cache, workers=workers, progress=progress
        )
    authors = authors_medians(authors_dir)
    out.mkdir(parents=True, exist_ok=True)
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
