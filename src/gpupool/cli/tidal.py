"""``gpupool sim tidal``: the 7-day tidal time-sharing simulation (issue 8), three strategies."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpupool.cli.errors import UserError, user_errors


@user_errors
def sim_tidal(
    *,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every metric."),
    days: int = typer.Option(7, help="Simulated days (1-9) of the trace week, after one warm-up day."),
    scale: float = typer.Option(1.0, help="Multiplier on online load and batch backlog (CI: 0.1)."),
    backlog_scale: float = typer.Option(
        1.0, help="Multiplier on the nightly batch backlog only (20 saturates every strategy)."
    ),
    main_model: str = typer.Option("14b", help="Main LLM: 14b (Qwen2.5-14B AWQ) or 7b (Qwen2.5-7B AWQ)."),
    seed: int = typer.Option(1, help="Seed of arrivals and token sampling."),
    out: Path | None = typer.Option(
        None, help="Write results.json, results.md and the PNG plots into this folder (e.g. docs/tidal)."
    ),
) -> None:
    """Dedicated vs static slicing vs tidal on the Alibaba arrival shape and Azure token sizes."""
    from gpupool.sim.tidal import report
    from gpupool.sim.tidal.run import RunConfig, run

    try:
        cfg = RunConfig(days=days, scale=scale, seed=seed, main_model=main_model, backlog_scale=backlog_scale)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    result = run(cfg)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        body = "\n\n".join(
            [
                f"# sim tidal results ({days} days, scale {scale}, backlog x{backlog_scale}, {main_model})",
                report.table(result),
                "## Night arrival paths (tidal)",
                report.paths_table(result),
                "## Pauser costs per engine size",
                report.costs_table(result),
            ]
        )
        (out / "results.md").write_text(body + "\n")
        report.plot(result, out)
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(report.table(result))
    typer.echo(
        f"\n{result['p0_requests']:,} P0 requests, peak {result['peak_p0_per_s']} req/s, {result['wall_s']} s"
    )
