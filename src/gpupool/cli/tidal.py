"""``gpupool sim tidal``: the 7-day tidal time-sharing simulation: dedicated, static-slicing, tidal and
tidal-lending (SLO-guarded day lending), on the Alibaba arrival shape and Azure-format token sizes."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import typer

from gpupool.cli.errors import UserError, check_range, options_named, user_errors

OPTIONS = {
    "days": "--days",
    "scale": "--scale",
    "backlog_scale": "--backlog-scale",
    "main_model": "--main-model",
    "lending_target": "--lending-target",
    "first_day": "--first-day",
}
"""`RunConfig`'s fields -> the options that set them (its errors name the option)."""


@user_errors
def sim_tidal(
    *,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every metric."),
    days: int = typer.Option(
        7,
        help="Simulated days from --first-day, after one warm-up day (the arrival trace must cover them).",
    ),
    first_day: datetime = typer.Option(
        "2024-11-30",
        "--first-day",
        formats=["%Y-%m-%d"],
        help="First simulated local day (YYYY-MM-DD, after the trace's phase shift); the day before is "
        "the warm-up day. Default: a Saturday of the bundled Alibaba GenAI trace, which covers 9 days "
        "from it; another GenAI-format trace (GPUPOOL_DATA_DIR) needs days it covers.",
    ),
    scale: float = typer.Option(1.0, help="Multiplier on online load and batch backlog (CI: 0.1)."),
    backlog_scale: float = typer.Option(
        1.0, help="Multiplier on the nightly batch backlog only (20 saturates every strategy)."
    ),
    main_model: str = typer.Option("14b", help="Main LLM: 14b (Qwen2.5-14B AWQ) or 7b (Qwen2.5-7B AWQ)."),
    seed: int = typer.Option(1, help="Seed of arrivals and token sampling."),
    what_if: bool = typer.Option(
        False, "--what-if", help="Also run tidal+day-lending (P2 in idle online engines by day too)."
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="Token sizes from another Azure-format trace CSV (ContextTokens, GeneratedTokens).",
    ),
    lending_target: float = typer.Option(
        0.99,
        "--lending-target",
        help="tidal-lending: P0 TTFT attainment target among requests that can meet it.",
    ),
    out: Path | None = typer.Option(
        None, help="Write results.json, results.md and the PNG plots into this folder (e.g. docs/tidal)."
    ),
) -> None:
    """Dedicated vs static slicing vs tidal vs tidal-lending (Alibaba arrival shape, Azure token sizes)."""
    from gpupool.sim.tidal import report
    from gpupool.sim.tidal.run import MAX_DAYS, RunConfig, run

    check_range("--days", days, lo=1, hi=MAX_DAYS)
    check_range("--scale", scale, lo=0, hi=10, lo_open=True)
    check_range("--backlog-scale", backlog_scale, lo=0, hi=1000)
    try:
        with options_named(OPTIONS):
            cfg = RunConfig(
                days=days,
                scale=scale,
                seed=seed,
                main_model=main_model,
                backlog_scale=backlog_scale,
                what_if=what_if,
                trace=str(trace) if trace is not None else None,
                lending_target=lending_target,
                first_day=first_day,
            )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if trace is not None and not trace.is_file():
        raise UserError(f"--trace {trace}: no such file")
    try:
        result = run(cfg)
    except ValueError as exc:  # a trace in the wrong format
        raise UserError(str(exc)) from None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        title = (
            f"sim tidal results ({days} days from {first_day:%Y-%m-%d}, scale {scale}, "
            f"backlog x{backlog_scale}, {main_model})"
        )
        (out / "results.md").write_text(report.markdown(result, title))
        report.plot(result, out)
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(report.table(result))
    typer.echo(
        f"\n{result['p0_requests']:,} P0 requests, peak {result['peak_p0_per_s']} req/s, {result['wall_s']} s"
    )


# --------------------------------------------------------------------------- the live demand shape
TRACE_BY_HOUR = (3824, 1072, 1155, 1173, 656, 353, 336, 245, 123, 40, 36, 2, 0, 3, 3, 39, 613, 2283,
                 2662, 586, 1057, 3120, 3104, 3444)  # fmt: skip
"""Requests per (shifted) hour of day of the whole Alibaba GenAI 2026 trace (its README); `gpupool
run`'s synthetic online traffic follows this profile rotated by the simulation's +16 h phase shift,
normalised to its mean (`gpupool.cli.tidalplane.demand_shape`)."""
PHASE_SHIFT_H = 16


def live_demand(local_hour: float) -> float:
    """Online demand relative to the daytime mean at a (fractional) local hour, from the trace shape."""
    mean = sum(TRACE_BY_HOUR) / 24
    h0 = int(local_hour) % 24
    frac = local_hour - int(local_hour)
    a = TRACE_BY_HOUR[(h0 - PHASE_SHIFT_H) % 24]
    b = TRACE_BY_HOUR[(h0 + 1 - PHASE_SHIFT_H) % 24]
    return (a + (b - a) * frac) / mean
