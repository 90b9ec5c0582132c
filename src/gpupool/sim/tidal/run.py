"""`gpupool sim tidal`: one run of the three strategies on the same arrivals; the JSON result.

Pipeline per run (all seeded; the same arrivals for every strategy):
1. Arrival rate per minute = trace shape x ``peak_p0_per_s``; P0 agent requests are a Poisson
   process; each also sends one guardrail check (P0), one embedding query and one rerank (P1).
2. The core `TidalController` (gpupool.core.tidal) observes online demand per minute (warm-up day
   on the expected rate, then the realised counts) and yields the NIGHT intervals.
3. `serve.serve` routes each model group's requests over the strategy's instances.
4. `batch.drain` feeds the batch backlog into the capacity each strategy lends, minute by minute,
   and replays the engine placements as leases on the real core `Allocator`.
5. Metrics. ``gpu_util`` = useful busy GPU-seconds (slice SM fraction x seconds executing online
   or batch work) over GPUs x seconds; ``vram_util`` = VRAM-seconds holding tensors (weights of
   loaded engines, live KV, batch engines' KV) over total VRAM-seconds. Idle reserved capacity
   (an awake engine with nothing to do, a leased but idle slice) counts in neither.

Peak load sizing (documented in the report): ``peak_p0_per_s`` defaults to the rate at which the
dedicated main-LLM fleet runs at ``PEAK_RHO`` = 0.6 of its prefill capacity in the peak hour.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import time as dtime
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.core.tidal import Mode, TidalConfig, TidalController
from gpupool.sim.tidal import batch, perf, traces
from gpupool.sim.tidal.platform import LENDING, STRATEGIES, WHAT_IF, Platform, build
from gpupool.sim.tidal.serve import PATHS, Availability, Served, coverage, serve

TTFT_SLO_S = 0.8
PEAK_RHO = 0.6
GUARD_MAX_TOKENS = 512
EMBED_TOKENS = 64
RERANK_TOKENS = 8 * 160 + 32
TZ = "Asia/Shanghai"
MAX_DAYS = 366
"""Simulated days at most (the arrival trace must cover them too: the bundled one, 9 from the
default first day)."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    days: int = 7
    scale: float = 1.0
    """Multiplies the online load and the batch backlog (CI uses a small scale for speed)."""
    seed: int = 1
    main_model: str = "14b"
    backlog_scale: float = 1.0
    peak_p0_per_s: float | None = None
    what_if: bool = False
    """Also run `WHAT_IF` (request-level lending by day), reported apart from the three strategies."""
    trace: str | None = None
    """Token sizes from this Azure-format request trace (default: the Azure 2023 code trace)."""
    lending_target: float = 0.99
    """`tidal-lending`'s guard target: P0 TTFT attainment among requests that can meet the SLO."""
    first_day: datetime = traces.FIRST_DAY
    """The first simulated local day (midnight, no time zone); the day before is the warm-up day.
    The arrival trace must cover them all (`traces.load`)."""

    def __post_init__(self) -> None:
        if type(self.days) is not int or not 1 <= self.days <= MAX_DAYS:
            raise InvalidInput("days", self.days, f"must be an integer in [1, {MAX_DAYS}]")
        day = self.first_day
        if not isinstance(day, datetime) or day.tzinfo is not None or day.time() != dtime(0):
            raise InvalidInput("first_day", day, "must be a local date (midnight, no time zone)")
        if not 0 < self.scale <= 10:
            raise InvalidInput("scale", self.scale, "must be in (0, 10]")
        if self.main_model not in MAIN_MODELS:
            raise InvalidInput("main_model", self.main_model, f"expected one of {sorted(MAIN_MODELS)}")
        if not 0 < self.lending_target <= 1:
            raise InvalidInput("lending_target", self.lending_target, "must be in (0, 1]")
        if not 0 <= self.backlog_scale <= 1000:
            raise InvalidInput("backlog_scale", self.backlog_scale, "must be in [0, 1000]")


MAIN_MODELS = {"14b": perf.QWEN25_14B_AWQ, "7b": perf.QWEN25_7B_AWQ}
ROLE_MODELS = {"guard": perf.QWEN25_05B, "embed": perf.BGE_M3, "rerank": perf.BGE_RERANK}


def _sized_peak(main: perf.ModelSpec, tr: traces.Traces) -> float:
    """P0 req/s at which dedicated's main fleet runs at PEAK_RHO of its prefill capacity."""
    plat = build("dedicated")
    mean_flops = float(np.mean(perf.forward_flops(main, tr.prompt_tokens.astype(np.float64))))
    cap = sum(i.spec.flops for i in plat.by_role("main"))
    return PEAK_RHO * cap / mean_flops


def _mode_timeline(
    rates: np.ndarray, counts: np.ndarray, *, t0_epoch: float
) -> tuple[list[tuple[float, float]], list[dict[str, Any]]]:
    """NIGHT intervals (sim seconds) from the core controller over per-minute online demand."""
    ctl = TidalController(TidalConfig(timezone=TZ))
    demand = np.concatenate([rates[:1440], counts[1440:] / 60.0])
    nights: list[tuple[float, float]] = []
    opened: float | None = None
    for m, d in enumerate(demand):
        tr = ctl.observe(t0_epoch + m * 60.0, float(d))
        if tr is None or m < 1440:
            if tr is not None and tr.mode_to is Mode.NIGHT:
                opened = None  # warm-up nights are not simulated
            continue
        if tr.mode_to is Mode.NIGHT:
            opened = m * 60.0
        elif opened is not None:
            nights.append((opened, m * 60.0))
            opened = None
    if opened is not None:
        nights.append((opened, len(demand) * 60.0))
    log = [
        {
            "at": datetime.fromtimestamp(t.at, ZoneInfo(TZ)).isoformat(),
            "to": t.mode_to.value,
            "reason": t.reason,
        }
        for t in ctl.transitions
        if t.at >= t0_epoch + 86400
    ]
    return nights, log


def run(cfg: RunConfig) -> dict[str, Any]:
    t_begin = time.perf_counter()
    from pathlib import Path

    tr = traces.load(cfg.days, token_trace=Path(cfg.trace) if cfg.trace else None, first_day=cfg.first_day)
    main = MAIN_MODELS[cfg.main_model]
    peak = (cfg.peak_p0_per_s or _sized_peak(main, tr)) * cfg.scale
    rng = np.random.default_rng(cfg.seed)
    rates = traces.minute_rates(tr.hourly_shape, peak)
    arrivals = traces.poisson_arrivals(rates[1440:], rng=rng, t0_s=86400.0)
    n = len(arrivals)
    pick = rng.integers(0, len(tr.prompt_tokens), n)
    prompt = tr.prompt_tokens[pick].astype(np.float64)
    output = tr.output_tokens[pick].astype(np.float64)
    n_min = len(rates) - 1440
    per_min = np.bincount(((arrivals - 86400) // 60).astype(np.int64), minlength=n_min)[:n_min]
    counts = np.concatenate([np.zeros(1440), per_min.astype(np.float64)])
    # online demand = P0 agent requests + their two P1 calls
    t0_epoch = (cfg.first_day - timedelta(days=1)).replace(tzinfo=ZoneInfo(TZ)).timestamp()
    nights, mode_log = _mode_timeline(rates * 3, counts * 3, t0_epoch=t0_epoch)
    inputs = {
        "main": (main, prompt, output),
        "guard": (ROLE_MODELS["guard"], np.minimum(prompt, GUARD_MAX_TOKENS), np.ones(n)),
        "embed": (ROLE_MODELS["embed"], np.full(n, float(EMBED_TOKENS)), np.zeros(n)),
        "rerank": (ROLE_MODELS["rerank"], np.full(n, float(RERANK_TOKENS)), np.zeros(n)),
    }
    t_end = 86400.0 * (cfg.days + 1)
    out: dict[str, Any] = {
        "days": cfg.days,
        "first_day": f"{cfg.first_day:%Y-%m-%d}",
        "scale": cfg.scale,
        "seed": cfg.seed,
        "main_model": main.name,
        "peak_p0_per_s": round(peak, 4),
        "p0_requests": n,
        "token_trace": Path(cfg.trace).name if cfg.trace else traces.AZURE.split("/")[-1],
        "phase_shift_h": tr.phase_shift_h,
        "night_intervals_h": [
            [round((a - 86400) / 3600, 3), round((b - 86400) / 3600, 3)] for a, b in nights
        ],
        "mode_transitions": mode_log,
        "strategies": {},
    }
    for strategy in STRATEGIES + ((WHAT_IF,) if cfg.what_if else ()):
        plat = build(strategy)
        out["strategies"][strategy] = _run_strategy(
            plat, inputs, nights, arrivals=arrivals, cfg=cfg, t_end=t_end, seed=cfg.seed, main=main
        )
    out["wall_s"] = round(time.perf_counter() - t_begin, 2)
    out["pauser_costs"] = pauser_costs(main)
    return out


def _run_strategy(
    plat: Platform,
    inputs: dict[str, tuple[perf.ModelSpec, np.ndarray, np.ndarray]],
    nights: list[tuple[float, float]],
    *,
    arrivals: np.ndarray,
    cfg: RunConfig,
    t_end: float,
    seed: int,
    main: perf.ModelSpec,
) -> dict[str, Any]:
    tidal = plat.strategy.startswith("tidal")
    lent = {i.name: i.lend for i in plat.instances}
    wake_cost = {}
    for i in plat.instances:
        m = inputs[i.role][0] if i.role in inputs else main
        if i.lend == "partition":
            wake_cost[i.name] = perf.cold_load_s(m) + perf.sleep_l1_s(main)
        else:  # put the batch engine on the slice to sleep, then wake the online engine
            wake_cost[i.name] = perf.sleep_l1_s(main) + perf.sleep_l1_s(m)

    def make_avail(
        p2_active: dict[str, np.ndarray] | None,
        *,
        lend_by_day: bool = True,
        day_level: np.ndarray | None = None,
    ) -> Availability | None:
        if not tidal:
            return None
        return Availability(
            night=nights,
            lent=lent,
            wake_cost_s=wake_cost,
            repartition_s=perf.RECONFIG_S,
            day_lending=frozenset(
                i.name
                for i in plat.instances
                if plat.strategy in (WHAT_IF, LENDING) and lend_by_day and i.role in ("main", "embed")
            ),
            p2_active=p2_active,
            day_level=day_level,
        )

    edges = np.arange(86400.0, t_end + 1.0, 60.0)

    def one_pass(
        avail: Availability | None,
    ) -> tuple[dict[str, Served], dict[str, np.ndarray], dict[str, np.ndarray], batch.BatchResult]:
        rng = np.random.default_rng(seed + 7)
        served: dict[str, Served] = {}
        busy: dict[str, np.ndarray] = {}
        kv_s: dict[str, np.ndarray] = {}
        for role, (model, prompt, output) in inputs.items():
            insts = plat.by_role(role)
            s = serve(insts, model, arrivals, prompt, output, avail=avail, rng=rng,
                      allow_surge=tidal and role == "main")  # fmt: skip
            served[role] = s
            for j, inst in enumerate(insts):
                sel = s.instance == j
                busy[inst.name] = coverage(s.start[sel], s.end[sel], edges)
                kv_s[inst.name] = np.bincount(
                    np.clip(((s.start[sel] - 86400) // 60).astype(np.int64), 0, len(edges) - 2),
                    weights=s.kv_bytes[sel] * (s.end[sel] - s.start[sel]),
                    minlength=len(edges) - 1,
                )
        res = batch.drain(
            plat, nights, avail, busy, edges=edges, main=main, backlog_scale=cfg.backlog_scale * cfg.scale
        )
        return served, busy, kv_s, res

    if plat.strategy == LENDING:
        return _run_lending(plat, one_pass, make_avail, nights, edges=edges, main=main, cfg=cfg)
    # pass 1 assumes lent P2 work is always present; pass 2 holds P0 back only where the drain ran P2
    served, busy, kv_s, res = one_pass(make_avail(None))
    if tidal:
        served, busy, kv_s, res = one_pass(make_avail({k: v > 0 for k, v in res.p2_used_s.items()}))
    return _metrics(plat, served, busy, kv_s, res, nights, edges=edges, main=main)


def _run_lending(
    plat: Platform,
    one_pass: Any,
    make_avail: Any,
    nights: list[tuple[float, float]],
    *,
    edges: np.ndarray,
    main: perf.ModelSpec,
    cfg: RunConfig,
) -> dict[str, Any]:
    """``tidal-lending``: the core `LendingGuard` closes the loop minute by minute.

    Pass "off" serves with no day lending, pass "on" with lending everywhere by day (where the drain
    ran P2). The guard then walks the minutes in order: a P0 request arriving at level L meets lent
    P2 work with probability L (P2 fills that share of the engine's idle time) and then gets its
    TTFT from pass "on", else from pass "off" (the two worlds differ only in the holdbacks lent P2
    work causes); the guard observes each TTFT when its first token comes and
    updates at each minute's end. Only requests that could meet the SLO at all (prefill alone within
    it: the physical bound) are measured. A last pass serves and drains at the guard's level."""
    served_off, _, _, _ = one_pass(make_avail(None, lend_by_day=False))
    served_on, _, _, res_on = one_pass(make_avail(None))
    served_on, _, _, res_on = one_pass(make_avail({k: v > 0 for k, v in res_on.p2_used_s.items()}))
    level, changes = _guard_levels(served_off["main"], served_on["main"], edges, cfg)
    day_on = level > 0
    p2_active = {k: (v > 0) & day_on[: len(v)] for k, v in res_on.p2_used_s.items()}
    served, busy, kv_s, res = one_pass(make_avail(p2_active, day_level=level))
    out = _metrics(plat, served, busy, kv_s, res, nights, edges=edges, main=main)
    out["lending"] = {
        "target": cfg.lending_target,
        "window_s": LENDING_WINDOW_S,
        "level_changes": len(changes),
        "mean_day_level": round(float(level[_day_minutes(edges, nights)].mean()), 4),
        "minutes_lending": int(day_on.sum()),
    }
    return out


LENDING_WINDOW_S = 300.0


def _day_minutes(edges: np.ndarray, nights: list[tuple[float, float]]) -> np.ndarray:
    mids = edges[:-1] + 30.0
    night = np.zeros(len(mids), dtype=bool)
    for a, b in nights:
        night |= (mids >= a) & (mids < b)
    return ~night


def _guard_levels(off: Served, on: Served, edges: np.ndarray, cfg: RunConfig) -> tuple[np.ndarray, list[Any]]:
    """Per-minute lending level from the core guard (see `_run_lending`)."""
    import heapq

    from gpupool.core.tidal.lending import GuardConfig, LendingGuard

    guard = LendingGuard(
        GuardConfig(window_s=LENDING_WINDOW_S, slo_ttft_s=TTFT_SLO_S, target=cfg.lending_target)
    )
    minutes = len(edges) - 1
    level = np.zeros(minutes)
    t0 = float(edges[0])
    by_min = np.clip(((off.arrival - t0) // 60).astype(np.int64), 0, minutes - 1)
    order = np.argsort(by_min, kind="stable")
    bounds = np.searchsorted(by_min[order], np.arange(minutes + 1))
    ttft_off, ttft_on = off.first_token - off.arrival, on.first_token - on.arrival
    feasible = (off.first_token - off.start) <= TTFT_SLO_S
    pending: list[tuple[float, float]] = []
    rng = np.random.default_rng(cfg.seed + 11)
    for m in range(minutes):
        level[m] = guard.level
        for r in order[bounds[m] : bounds[m + 1]]:
            if not feasible[r]:
                continue
            lent = guard.level > 0 and float(rng.random()) < guard.level  # meets lent P2 with prob. L
            ttft = float(ttft_on[r] if lent else ttft_off[r])
            heapq.heappush(pending, (float(off.arrival[r]) + ttft, ttft))
        end = t0 + 60.0 * (m + 1)
        while pending and pending[0][0] <= end:
            at, ttft = heapq.heappop(pending)
            guard.observe(at, ttft)
        guard.update(end)
    return level, guard.changes


def pauser_costs(main: perf.ModelSpec) -> dict[str, Any]:
    """Arrival-to-service cost of each night path per engine size (the model, not the run)."""
    rows = {}
    for m in (perf.QWEN25_05B, perf.BGE_M3, perf.QWEN25_7B_AWQ, perf.QWEN25_14B_AWQ, perf.QWEN25_32B_AWQ):
        rows[m.name] = {
            "weights_gib": round(m.weight_bytes / perf.GIB, 2),
            "sleep_l1_wake_s": round(perf.sleep_l1_s(m), 3),
            "cold_load_s": round(perf.cold_load_s(m), 2),
        }
    ck = {f"{gb}GB": round(perf.cuda_checkpoint_s(gb * 1e9), 2) for gb in (10, 20, 40, 72, 80, 141)}
    return {
        "holdback_s": perf.HOLDBACK_S,
        "p2_iteration_s_main_a100": round(
            float(perf.prefill_s(main, perf.whole(perf.A100_80GB), np.array([512.0]))[0]), 4
        ),
        "engines": rows,
        "cuda_checkpoint_suspend_s": ck,
        "mig_reconfigure_s": perf.RECONFIG_S,
        "notes": "sleep L1 ~21 GiB/s (llm-d FMA: 3 s / 64 GiB); cuda-checkpoint ~5.3 GB/s (15 s per 80 GB, "
        "cuda-checkpoint #29) and not supported on MIG; MIG reconfigure time is an assumption",
    }


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


def _metrics(  # noqa: PLR0917 - internal, called once with the run's parts
    plat: Platform,
    served: dict[str, Served],
    busy: dict[str, np.ndarray],
    kv_s: dict[str, np.ndarray],
    res: batch.BatchResult,
    nights: list[tuple[float, float]],
    *,
    edges: np.ndarray,
    main: perf.ModelSpec,
) -> dict[str, Any]:
    minutes = len(edges) - 1
    total_s = minutes * 60.0
    n_gpus = len(plat.gpus)
    vram_total = sum(g.memory_mib for _, g in plat.gpus) * 1024 * 1024
    busy_gpu = np.zeros(minutes)
    for inst in plat.instances:
        if inst.name in busy:
            busy_gpu += busy[inst.name] * inst.spec.sm_fraction
    online_gpu = busy_gpu.copy()
    busy_gpu += res.busy_gpu_s
    vram = np.zeros(minutes)
    for inst in plat.instances:
        if inst.name in kv_s:
            mdl = main if inst.role == "main" else ROLE_MODELS[inst.role]
            vram += kv_s[inst.name] + mdl.weight_bytes * 60.0 * res.online_awake[inst.name]
    vram += res.vram_bytes_s
    hours = minutes // 60
    util_by_hour = (busy_gpu[: hours * 60].reshape(hours, 60).sum(1) / (3600.0 * n_gpus)).tolist()
    online_by_hour = (online_gpu[: hours * 60].reshape(hours, 60).sum(1) / (3600.0 * n_gpus)).tolist()
    m = served["main"]
    ttft = m.first_token - m.arrival
    g = served["guard"]
    guard_ms = (g.end - g.arrival) * 1000
    bound = (m.first_token - m.start) <= TTFT_SLO_S
    night = m.night_path >= 0
    wait_ms = (m.start - m.arrival) * 1000
    paths = {}
    for p, name in enumerate(PATHS):
        sel = m.night_path == p
        paths[name] = {
            "requests": int(sel.sum()),
            "serve_ms_p50": round(_pct(wait_ms[sel], 50), 2),
            "serve_ms_p99": round(_pct(wait_ms[sel], 99), 2),
            "serve_ms_max": round(float(wait_ms[sel].max()) if sel.any() else 0.0, 2),
        }
    in_night = np.zeros(len(m.arrival), dtype=bool)
    for a, b in nights:
        in_night |= (m.arrival >= a) & (m.arrival < b)
    days = minutes / 1440
    return {
        "gpu_util": round(float(busy_gpu.sum() / (n_gpus * total_s)), 4),
        "vram_util": round(float(vram.sum() / (vram_total * total_s)), 4),
        "p0_ttft_slo_attainment": round(float(np.mean(ttft <= TTFT_SLO_S)), 5),
        "guardrail_p99_ms": round(_pct(guard_ms, 99), 2),
        "batch_tokens_per_day": round(res.tokens / days),
        "preemptions": res.preemptions,
        "night_serve_ms_p99": round(_pct(wait_ms[in_night], 99), 2),
        "online_gpu_util": round(float(online_gpu.sum() / (n_gpus * total_s)), 4),
        "batch_gpu_util": round(float(res.busy_gpu_s.sum() / (n_gpus * total_s)), 4),
        "p0_ttft_p50_ms": round(_pct(ttft * 1000, 50), 1),
        "p0_ttft_p99_ms": round(_pct(ttft * 1000, 99), 1),
        "p0_ttft_slo_bound": round(float(np.mean(bound)), 5),
        "p1_rerank_p99_ms": round(_pct((served["rerank"].end - served["rerank"].arrival) * 1000, 99), 2),
        "p1_embed_p99_ms": round(_pct((served["embed"].end - served["embed"].arrival) * 1000, 99), 2),
        "p2_request_holdbacks": int(np.sum(m.night_path == 1)),
        "night_paths": paths,
        "night_p0_requests": int(night.sum()),
        "batch_backlog_left_tokens": round(res.backlog_left),
        "batch_tokens_by_kind": {k: round(v) for k, v in res.tokens_by_kind.items()},
        "gpu_util_by_hour": [round(x, 4) for x in util_by_hour],
        "online_util_by_hour": [round(x, 4) for x in online_by_hour],
        "batch_tokens_by_hour": [round(x) for x in res.tokens_by_hour.tolist()],
        "capacity_bound_gpu_util": round(
            float((online_gpu.sum() + res.capacity_gpu_s.sum()) / (n_gpus * total_s)), 4
        ),
        "allocator": res.allocator,
    }
