"""``gpupool sim tidal``: the 7-day tidal time-sharing simulation: dedicated, static-slicing, tidal and
tidal-lending (SLO-guarded day lending), on the Alibaba arrival shape and Azure-format token sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.console import say
from gpupool.cli.errors import UserError, check_range, user_errors


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
    from gpupool.sim.tidal.run import RunConfig, run

    check_range("--days", days, lo=1, hi=9)
    check_range("--scale", scale, lo=0, hi=10, lo_open=True)
    check_range("--backlog-scale", backlog_scale, lo=0, hi=1000)
    try:
        cfg = RunConfig(
            days=days,
            scale=scale,
            seed=seed,
            main_model=main_model,
            backlog_scale=backlog_scale,
            what_if=what_if,
            trace=str(trace) if trace is not None else None,
            lending_target=lending_target,
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


# --------------------------------------------------------------------------- live (issue 8, section 6)
TRACE_BY_HOUR = (3824, 1072, 1155, 1173, 656, 353, 336, 245, 123, 40, 36, 2, 0, 3, 3, 39, 613, 2283,
                 2662, 586, 1057, 3120, 3104, 3444)  # fmt: skip
"""Requests per (shifted) hour of day of the whole Alibaba GenAI 2026 trace (its README); the live
demand signal is this profile rotated by the simulation's +16 h phase shift, normalised to its mean."""
PHASE_SHIFT_H = 16
LIVE_LEASE_MIB = 8 * 1024
LIVE_FILL = 0.80


def live_demand(local_hour: float) -> float:
    """Online demand relative to the daytime mean at a (fractional) local hour, from the trace shape."""
    mean = sum(TRACE_BY_HOUR) / 24
    h0 = int(local_hour) % 24
    frac = local_hour - int(local_hour)
    a = TRACE_BY_HOUR[(h0 - PHASE_SHIFT_H) % 24]
    b = TRACE_BY_HOUR[(h0 + 1 - PHASE_SHIFT_H) % 24]
    return (a + (b - a) * frac) / mean


async def tidal_live(
    bundle: Any, *, speed: float = 144.0, start_hour: int = 18, period_s: float = 1.0
) -> None:
    """Run the core tidal controller on a compressed clock inside ``gpupool run``.

    One simulated day passes in 86400 / ``speed`` real seconds (144: ten minutes). Every real
    ``period_s`` the controller observes the trace-shaped demand; at NIGHT it lends spare capacity to
    P2 (tenant ``tidal-batch`` leases of 8 GiB through the gateway's own controller, so they show in
    ``/v1/pool`` and ``/v1/events`` and in the lease gauges of ``/metrics``); the synthetic P0 traffic
    preempts them when it needs room; before DAY they are handed back. Mode changes are sent to the
    event hub as ``tidal`` events (admin subscribers see them).
    """
    import asyncio
    import time
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from gpupool.core import P2, LeaseState, Request, Resources
    from gpupool.core.clock import FunctionClock
    from gpupool.core.ports import GatewayEvent
    from gpupool.core.tidal import CompressedClock, Mode, TidalConfig, TidalController

    cfg = TidalConfig(initial_baseline=1.0)
    zone = ZoneInfo(cfg.timezone)
    today = datetime.now(zone).replace(hour=start_hour, minute=0, second=0, microsecond=0)
    clock = CompressedClock(FunctionClock(time.monotonic), origin_s=today.timestamp(), speed=speed)
    ctl = TidalController(cfg)
    c = bundle.controller
    lent: list[str] = []
    seq = 0
    say(f"tidal: compressed clock x{speed:g} from {today:%H:%M} {cfg.timezone}; day {cfg.day_start}-"
               f"{cfg.day_end}, night {cfg.night_start}-{cfg.night_end}")  # fmt: skip
    while True:
        now = clock.now()
        local = datetime.fromtimestamp(now, zone)
        tr = ctl.observe(now, live_demand(local.hour + local.minute / 60))
        if tr is not None:
            msg = f"{tr.mode_from.value} -> {tr.mode_to.value} ({tr.reason}) at {local:%a %H:%M}"
            say(f"tidal: {msg}")
            if c.sink is not None:
                c.sink(GatewayEvent(kind="tidal", at=c.clock.now(), reason=msg, tenant="tidal-batch"))
        still = []
        for lid in lent:
            lease = c.get(lid)
            if lease.state.ended:
                if lease.state.value == "preempted":
                    say(f"tidal: P2 lease {lid[:8]} preempted by online work ({lease.reason})")
            else:
                still.append(lid)
        lent = still
        if ctl.mode is Mode.NIGHT:
            per_gpu: dict[str, list[int]] = {}
            for st in c.allocator.states():
                g = per_gpu.setdefault(st.slice.gpu_id, [0, 0])
                g[0] += st.slice.capacity.vram_mib
                g[1] += st.granted.vram_mib
            budget = ctl.p2_share() * sum(g[0] for g in per_gpu.values()) - len(lent) * LIVE_LEASE_MIB
            for gpu_id, (cap_mib, granted_mib) in sorted(per_gpu.items()):
                # stay under the 85 % early warning, below the 88 % pause watermark of the gateway
                room = int(LIVE_FILL * cap_mib) - granted_mib
                while room >= LIVE_LEASE_MIB and budget >= LIVE_LEASE_MIB:
                    seq += 1
                    req = Request(id=f"tidal-{seq}", tenant="tidal-batch", priority=P2,
                                  demand=Resources(LIVE_LEASE_MIB, 0), ttl_s=3600.0)  # fmt: skip
                    out = c.acquire(req, wait_s=1.0, gpu_id=gpu_id)
                    if out.ticket:
                        c.cancel(out.ticket)
                    if not out.granted or out.lease is None:
                        break
                    lent.append(out.lease.id)
                    room -= LIVE_LEASE_MIB
                    budget -= LIVE_LEASE_MIB
        elif lent:  # DAY: the online engines take their slices back, the lent P2 leases are preempted
            for lid in lent:
                if not c.get(lid).state.ended:
                    c.allocator.revoke(
                        lid, state=LeaseState.PREEMPTED, reason="tidal: DAY, online takes it back"
                    )
            say(f"tidal: DAY took back {len(lent)} lent P2 leases at {local:%a %H:%M}")
            lent = []
        for lid in lent:
            c.renew(lid)
        await asyncio.sleep(period_s)
