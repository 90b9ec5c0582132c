"""`gpupool plan`: partition a cluster for a set of workloads and print the layout.

Formats: ``table`` (rich tables: per-GPU layout with reasons, placements, unplaced), ``json`` (the
``plan_to_dict`` object), ``mig-parted`` (a mig-parted v1 YAML document, one config per node) and ``mps``
(control-daemon commands and client environments per MPS GPU) and ``vllm`` (the ``vllm serve`` arguments of
each placed model instance: memory share, context, prefix caching, and with ``--host-ram-gib`` the KV
host tier, `gpupool.hardware.vllmargs`). Bad input exits 2 with one line.
``--actuator`` shows (and with ``--apply`` makes) the MIG changes on the nodes (`gpupool.cli.planapply`).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table

from gpupool.cli.errors import UserError, check_range, user_errors
from gpupool.cli.planapply import ActuatorKind, run_apply
from gpupool.cli.specfiles import load_specs
from gpupool.hardware.migparted import to_mig_parted
from gpupool.hardware.mps import mps_commands
from gpupool.hardware.planner import plan as make_plan
from gpupool.hardware.plantypes import Plan, plan_to_dict
from gpupool.hardware.spec import WorkloadSet
from gpupool.hardware.vllmargs import OFFLOAD_BACKENDS, host_tier_gib, vllm_args

MAX_HOST_RAM_GIB = 1 << 20
"""1 PiB of host RAM per node: far above any machine, so a typo of digits is an error, not a plan."""


class PlanFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    MIG_PARTED = "mig-parted"
    MPS = "mps"
    VLLM = "vllm"


def render_table(p: Plan, console: Console) -> None:
    t = Table(title="GPU layout", title_justify="left")
    for col in ("gpu", "model", "mode", "slices", "reason"):
        t.add_column(col, overflow="fold")
    for g in p.gpus:
        parts = []
        for s in g.slices:
            what = s.profile if s.kind.value == "mig" else s.kind.value
            if s.kind.value == "mig":
                what = f"{s.profile}@{s.start}"
            owner = "pool" if s.pool else f"{s.workload}#{s.replica}"
            extra = f" {s.thread_pct}%" if s.thread_pct else ""
            parts.append(f"{what} {s.vram_mib}MiB{extra} -> {owner}")
        mode = g.mode.value + (" (!)" if g.flagged else "")
        t.add_row(g.gpu_id, g.model.name, mode, "\n".join(parts), g.reason)
    console.print(t)
    pt = Table(title="Placements", title_justify="left")
    for col in ("workload", "replica", "gpu", "slice", "need MiB", "slice MiB"):
        pt.add_column(col, justify="right" if "MiB" in col or col == "replica" else "left")
    for pl in p.placements:
        pt.add_row(pl.workload, str(pl.replica), pl.gpu_id, pl.slice, str(pl.need_mib), str(pl.vram_mib))
    console.print(pt)
    if p.unplaced:
        ut = Table(title="Unplaced (P2, waits for pool capacity)", title_justify="left")
        for col in ("workload", "replica", "need MiB", "reason"):
            ut.add_column(col)
        for u in p.unplaced:
            ut.add_row(u.workload, str(u.replica), str(u.need_mib), u.reason)
        console.print(ut)
    console.print(
        f"{p.gpus_used} of {len(p.gpus)} GPUs hold online work; P2 pool: {len(p.pool_slices())} slices, "
        f"{p.pool_vram_mib} MiB"
    )


def vllm_lines(p: Plan, wset: WorkloadSet, host_ram_gib: int, host_tier_pct: int, offload: str) -> list[str]:
    """One ``# node gpu slice`` comment + ``vllm serve`` line per placed model instance."""
    import shlex

    def decoder(name: str) -> bool:
        arch = wset.by_name(name).arch
        return arch is None or arch.is_decoder

    per_node: dict[str, int] = {}  # decoder instances per node share its host tier
    for pl in p.placements:
        if wset.by_name(pl.workload).model and decoder(pl.workload):
            per_node[pl.node] = per_node.get(pl.node, 0) + 1
    out: list[str] = []
    for pl in p.placements:
        w = wset.by_name(pl.workload)
        if not w.model:
            continue
        args = vllm_args(
            model=w.model,
            kind=pl.kind,
            slice_vram_mib=pl.vram_mib,
            gpu_memory_mib=p.gpu(pl.gpu_id).model.memory_mib,
            max_context=w.max_context,
            decoder=decoder(pl.workload),
            offload_backend=offload,
            offload_gib=host_tier_gib(host_ram_gib, per_node.get(pl.node, 1), host_tier_pct),
        )
        out.append(f"# {pl.workload}#{pl.replica} on {pl.gpu_id} {pl.slice} ({pl.vram_mib} MiB)")
        out.append(shlex.join(args))
    return out or ["# no model instances in this plan"]


@user_errors
def plan(  # noqa: PLR0917 (typer options)
    cluster: Path = typer.Option(..., "--cluster", "-c", help="Cluster spec YAML (nodes and their GPUs)."),
    workloads: Path = typer.Option(..., "--workloads", "-w", help="Workload spec YAML (models, replicas)."),
    fmt: PlanFormat = typer.Option(
        PlanFormat.TABLE,
        "--format",
        "-f",
        help="table | json | mig-parted (nvidia-mig-parted config) | mps (MPS daemon and client "
        "settings per GPU) | vllm (`vllm serve` flags per model instance).",
        case_sensitive=False,
    ),
    actuator: ActuatorKind | None = typer.Option(
        None,
        "--actuator",
        help="Show the MIG changes per node: simulated | nvml | mig-manager.",
        case_sensitive=False,
    ),
    apply: bool = typer.Option(
        False, "--apply", help="Make the MIG changes (default: dry run, show the diff)."
    ),
    node: list[str] = typer.Option(
        [], "--node", help="Only this node (repeatable; nvml: this machine's node)."
    ),
    kube_api: str = typer.Option(
        "", "--kube-api", help="API server URL for mig-manager (default: in-cluster)."
    ),
    host_ram_gib: int = typer.Option(
        0, "--host-ram-gib", help="Host RAM per node (GiB), for the vllm format's KV host tier (0: none)."
    ),
    host_tier_pct: int = typer.Option(
        50, "--host-tier-pct", help="Share of that RAM for KV host tiers, split over the node's instances."
    ),
    kv_offload: str = typer.Option("native", "--kv-offload", help="vllm format: native | lmcache."),
    mig_namespace: str = typer.Option("gpu-operator", "--mig-namespace", help="GPU Operator namespace."),
    mig_config_map: str = typer.Option(
        "custom-mig-config",
        "--mig-config-map",
        help="ConfigMap the ClusterPolicy's migManager.config.name names.",
    ),
) -> None:
    """Plan MIG instances, MPS shares and whole cards for the workloads; print the layout.

    Example: gpupool plan --cluster examples/cluster-a100-l40s.yaml
    --workloads examples/workloads-agent-platform.yaml --format mig-parted
    """
    check_range("--host-ram-gib", host_ram_gib, lo=0, hi=MAX_HOST_RAM_GIB)
    check_range("--host-tier-pct", host_tier_pct, lo=0, hi=100)
    for flag, given in (("--node", node), ("--kube-api", kube_api)):
        if given and actuator is None:
            raise UserError(f"{flag} needs --actuator (it chooses where the MIG changes are shown or made)")
    if kv_offload not in OFFLOAD_BACKENDS:
        raise UserError(f"--kv-offload: {kv_offload!r} must be native or lmcache")
    cluster_spec, workload_set = load_specs(cluster, workloads)
    p = make_plan(cluster_spec, workload_set)
    if apply and actuator is None:
        raise UserError("--apply: needs --actuator simulated|nvml|mig-manager")
    if actuator is not None:
        code = run_apply(
            p,
            cluster_spec,
            kind=actuator,
            nodes=node,
            apply=apply,
            kube_api=kube_api,
            namespace=mig_namespace,
            config_map=mig_config_map,
        )
        raise typer.Exit(code)
    if fmt is PlanFormat.JSON:
        typer.echo(json.dumps(plan_to_dict(p), indent=2))
    elif fmt is PlanFormat.MIG_PARTED:
        typer.echo(yaml.safe_dump(to_mig_parted(p), sort_keys=False, default_flow_style=False).rstrip())
    elif fmt is PlanFormat.VLLM:
        typer.echo("\n".join(vllm_lines(p, workload_set, host_ram_gib, host_tier_pct, kv_offload)))
    elif fmt is PlanFormat.MPS:
        typer.echo("\n".join(mps_commands(p)).rstrip() or "# no MPS GPUs in this plan")
    else:
        render_table(p, Console(width=160))


EXAMPLE_PAIRS = (
    ("cluster-a100-l40s.yaml", "workloads-agent-platform.yaml"),
    ("cluster-h100-h200.yaml", "workloads-hopper.yaml"),
)


def run_plan_bench(examples_dir: Path, *, repeats: int = 20, scale: int = 8) -> dict[str, object]:
    """Wall time of load + parse + plan for each example pair, and for the first pair scaled up
    ``scale`` x (nodes and replicas). Reports min and median milliseconds over ``repeats`` runs."""
    import statistics
    import time

    from gpupool.cli.specfiles import load_yaml
    from gpupool.hardware.spec import load_cluster_spec, load_workload_spec

    def timed(fn: object) -> tuple[float, float, Plan]:
        samples: list[float] = []
        result: Plan | None = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = fn()  # type: ignore[operator]
            samples.append((time.perf_counter() - t0) * 1000)
        assert result is not None
        return min(samples), statistics.median(samples), result

    rows: list[dict[str, object]] = []
    for c, w in EXAMPLE_PAIRS:
        cp, wp = examples_dir / c, examples_dir / w
        best, med, p = timed(lambda cp=cp, wp=wp: make_plan(*load_specs(cp, wp)))
        rows.append(
            {
                "case": f"{c} + {w}",
                "gpus": len(p.gpus),
                "replicas": len(p.placements) + len(p.unplaced),
                "min_ms": round(best, 3),
                "median_ms": round(med, 3),
                "gpus_used": p.gpus_used,
            }
        )
    cdoc = load_yaml(examples_dir / EXAMPLE_PAIRS[0][0])
    wdoc = load_yaml(examples_dir / EXAMPLE_PAIRS[0][1])
    assert isinstance(cdoc, dict) and isinstance(wdoc, dict)
    big_c = {"nodes": [{**n, "name": f"{n['name']}-{k}"} for k in range(scale) for n in cdoc["nodes"]]}
    big_w = {"workloads": [{**x, "replicas": int(x.get("replicas", 1)) * scale} for x in wdoc["workloads"]]}
    cluster = load_cluster_spec(big_c, source="scaled")
    workloads = load_workload_spec(big_w, source="scaled")
    best, med, p = timed(lambda: make_plan(cluster, workloads))
    rows.append(
        {
            "case": f"{EXAMPLE_PAIRS[0][0]} x{scale} (nodes and replicas)",
            "gpus": len(p.gpus),
            "replicas": len(p.placements) + len(p.unplaced),
            "min_ms": round(best, 3),
            "median_ms": round(med, 3),
            "gpus_used": p.gpus_used,
        }
    )
    return {"benchmark": "plan", "repeats": repeats, "results": rows}


@user_errors
def bench_plan(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    repeats: int = typer.Option(20, min=1, help="Runs per case (min and median are reported)."),
    scale: int = typer.Option(8, min=1, max=64, help="Scale factor of the synthetic large case."),
    examples: Path = typer.Option(Path("examples"), help="Directory holding the example YAML files."),
) -> None:
    """Planning time of the example specs (load + parse + plan), plus a scaled-up case."""
    result = run_plan_bench(examples, repeats=repeats, scale=scale)
    if as_json:
        typer.echo(json.dumps(result))
        return
    for row in result["results"]:  # type: ignore[attr-defined]
        typer.echo(
            f"{row['case']}: {row['gpus']} GPUs, {row['replicas']} replicas, "
            f"min {row['min_ms']} ms, median {row['median_ms']} ms"
        )
