"""Tidal time-sharing in ``gpupool serve`` and ``gpupool run``: the composition of the core
`TidalPlane` (mode machine on measured demand, DAY reservation, NIGHT holdback), the batch queue
and its runner (P2 jobs as local process groups or Ray tasks, each holding a P2 lease from the
gateway's own controller), and the NIGHT re-partition driver (simulated devices: the simulated
cluster's NVML MIG calls; standby replicas stopped and started around it).

`attach_tidal` wires them onto a built `Bundle` (admission hook, ``/v1/pool`` section ``tidal``,
``/v1/batch/jobs`` routes, ``gpupool_tidal_*`` metrics, and with ``standby_backends`` the standby
sleeper: ``GET /v1/nodes/{node}/engines`` directives for the node agents and their ``engine_*``
reports); `tidal_loop` runs `TidalRuntime.step` every ``period_s`` on the gateway's event loop: tick
the plane (mode changes become ``tidal`` events), put standby instances to sleep or wake them and
switch their routing, merge the named GPUs at NIGHT and restore them when the restore is due, step
the batch runner (job changes become ``batch`` events), kick the group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.cli.console import say
from gpupool.cli.errors import UserError
from gpupool.core.clock import Clock
from gpupool.core.errors import InvalidInput, show_value
from gpupool.core.ports import GatewayEvent
from gpupool.core.tidal.modes import Mode
from gpupool.core.tidal.night import NightRepartitioner
from gpupool.core.tidal.plane import PlaneConfig, TidalPlane, kv_usage_of, p2_usage_of, plane_config
from gpupool.core.tidal.standby import ASLEEP, AWAKE, StandbySleeper, instances_of

ENGINE_REPORTS = {
    "engine_asleep": (ASLEEP, True),
    "engine_awake": (AWAKE, True),
    "engine_sleep_failed": (ASLEEP, False),
    "engine_wake_failed": (AWAKE, False),
}
"""Agent event kind -> (state it was about, whether it was reached)."""


def load_plane_config(path: Path | None, **overrides: Any) -> PlaneConfig:
    """``tidal:`` mapping of a YAML file (or none) + overrides -> `PlaneConfig`; `UserError` naming
    the file and the setting otherwise, or the option (``--timezone`` for the override ``timezone``)
    when the bad value is an override's."""
    doc: dict[str, Any] = {}
    if path is not None:
        from gpupool.cli.specfiles import load_yaml

        raw = load_yaml(path)
        if not isinstance(raw, dict) or not isinstance(raw.get("tidal", {}), dict):
            raise UserError(f"{path}: expected a mapping 'tidal: {{setting: value}}'")
        doc = dict(raw.get("tidal") or {})
    doc.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return plane_config(doc)
    except InvalidInput as exc:
        given = {f"tidal.{k}": k for k, v in overrides.items() if v is not None}
        if exc.field in given:
            option = "--" + given[exc.field].replace("_", "-")
            raise UserError(f"invalid {option}={show_value(exc.value)}: {exc.reason}") from None
        raise UserError(f"{path or 'tidal settings'}: {exc}") from None


class SimulatedStandby:
    """`Standby` on the simulated cluster: the placed replicas on a GPU stop (the drain has revoked
    their instance leases, if they held any: P2 engines only, online ones refuse the plan) and start
    again on the day layout, each instance lease placed again on its slice."""

    def __init__(self, sim: Any, controller: Any) -> None:
        self.sim = sim
        self.c = controller

    def stop(self, gpu_id: str) -> object:
        from gpupool.cli.instances import SYSTEM_TENANT

        held = [
            (lease.request, lease.slice_ids)
            for lease in self.c.allocator.leases
            if lease.request.tenant == SYSTEM_TENANT and any(g.gpu_id == gpu_id for g in lease.grants)
        ]
        return (self.sim.stop_residents(gpu_id), held)

    def start(self, gpu_id: str, stopped: object) -> None:
        if not isinstance(stopped, tuple):
            return
        residents, held = stopped
        self.sim.start_residents(residents)
        for request, slice_ids in held:
            with contextlib.suppress(InvalidInput, KeyError):
                self.c.place(request, slice_ids)


@dataclass
class TidalRuntime:
    plane: TidalPlane
    bundle: Any
    batch: Any = None
    night: NightRepartitioner | None = None
    standby: StandbySleeper | None = None
    lent: dict[str, tuple[Any, tuple[str, ...]]] = field(default_factory=dict)
    """Standby id -> (its placement lease's request, slices) while its slice is lent to P2."""
    seen_log: int = 0
    seen_night: int = 0
    emitted: list[GatewayEvent] = field(default_factory=list)

    def emit(self, kind: str, reason: str, gpu_id: str = "") -> None:
        c = self.bundle.controller
        e = GatewayEvent(kind=kind, at=c.clock.now(), reason=reason, gpu_id=gpu_id)
        self.emitted.append(e)
        del self.emitted[:-1000]
        if c.sink is not None:
            c.sink(e)

    def step(self) -> None:
        plane = self.plane
        tr = plane.tick()
        if tr is not None:
            local = plane.controller.local_time(tr.wall_at)
            msg = (
                f"{tr.mode_from.value} -> {tr.mode_to.value} ({tr.reason}) at {local:%a %H:%M} "
                f"{plane.controller.config.timezone}; demand {tr.demand:.2f}/min, "
                f"baseline {tr.baseline:.2f}/min"
            )
            say(f"tidal: {msg}")
            self.emit("tidal", msg)
        for ch in plane.lending_changes:
            self.emit(
                "tidal",
                f"day lending {ch.level_from:g} -> {ch.level_to:g} (P0 TTFT attainment {ch.attainment:.4f} "
                f"over {ch.samples} requests)",
            )
        plane.lending_changes.clear()
        for path, ms in plane.path_log[-100:]:
            self.emit("tidal", f"{plane.mode.value} path {path}: {ms:g} ms")
        plane.path_log.clear()
        c = self.bundle.controller
        if self.standby is not None:
            self.step_standby()
        taken = plane.reclaim(c.allocator.leases)
        for lease_id in taken:
            c.revoke(lease_id, reason="tidal: DAY, P2 above its share gives capacity back to P0/P1")
        if taken:
            self.emit("tidal", f"DAY reclaimed {len(taken)} P2 leases above the P2 share")
        if self.night is not None:
            if plane.mode is Mode.NIGHT and not plane.restore_due():
                done = self.night.merge_all()
            else:
                done = self.night.restore_all()
            for g in done:
                if g.last_s is not None and g.state in ("merged", "day"):
                    plane.repartition_s = g.last_s
            for _, gpu_id, action, detail in self.night.log[self.seen_night :]:
                say(f"tidal: {gpu_id}: {action}: {detail}")
                self.emit("tidal", f"{action}: {detail}", gpu_id=gpu_id)
            self.seen_night = len(self.night.log)
            plane.notes["repartition"] = self.night.view()
        if self.batch is not None:
            self.batch.step()
            log = self.batch.runner.log
            for _, job_id, what in log[self.seen_log :]:
                self.emit("batch", f"job {job_id} {what}")
                if what.startswith("skipped"):  # (a damaged row: reported once)
                    say(f"batch: job {job_id} {what}")
            self.seen_log = len(log)
            del log[: max(0, len(log) - 1000)]
            self.seen_log = min(self.seen_log, len(log))
            plane.notes["batch_jobs"] = self.batch.counts()
        self.bundle.app.state.gateway.committer.kick()

    def step_standby(self) -> None:
        """Sleep or wake the standby instances and switch their routing (see `StandbySleeper`)."""
        sl, plane, c = self.standby, self.plane, self.bundle.controller
        assert sl is not None
        from gpupool.core.kvbackends import KV_PREFIX

        changed = sl.step(
            plane.clock.now(),
            night=plane.mode is Mode.NIGHT and plane.config.enabled,  # the off switch keeps them awake
            wake_due=plane.standby_wake_due(),
            busy=lambda bid: c.kv_load(KV_PREFIX + bid)[0] > 0,
        )
        for bid in changed:
            c.set_backend_routable(bid, sl.routable(bid))
        for bid in sl.config.backends:
            self._hand_over(bid)
        for ms in sl.paths:
            plane.record_path("sleep", ms)
        sl.paths.clear()
        for bid, what in sl.log:
            inst = sl.instances[bid]
            say(f"tidal: standby {bid}: {what}")
            self.emit("tidal", f"standby {bid}: {what}", gpu_id=inst.gpu_id)
        sl.log.clear()
        plane.notes["standby"] = sl.view()

    def _hand_over(self, bid: str) -> None:
        """Lend a sleeping standby's slice to P2 (its placement lease given back), or take it back
        before the wake (P2 leases there revoked, the placement lease placed again)."""
        sl, c, keeper = self.standby, self.bundle.controller, self.bundle.keeper
        assert sl is not None and keeper is not None  # (standbys are registered backends: kept placed)
        if sl.lendable(bid):
            lease = keeper.held().get(bid)
            if lease is not None:
                self.lent[bid] = (lease.request, lease.slice_ids)
                c.release(lease.id, reason=f"tidal: standby {bid} asleep, its slice lent to P2 work")
            sl.set_held(bid, False)
        elif sl.wants_slice(bid):
            request, slice_ids = self.lent.get(bid, (None, ()))
            if request is None:
                sl.set_held(bid, True)
                return
            for sid in slice_ids:
                for x in list(c.allocator.leases.on_slice(sid)):
                    if x.priority < 0:
                        c.revoke(
                            x.id, reason=f"tidal: standby {bid} wakes: its slice goes back to online work"
                        )
            out = c.place(request, slice_ids)
            if out.granted:
                del self.lent[bid]
                sl.set_held(bid, True)

    def engine_reports(self, node: str, events: list[Any]) -> None:
        """The node agents' ``engine_*`` events -> the standby sleeper (a listener of the events route)."""
        sl = self.standby
        if sl is None:
            return
        now = self.plane.stopwatch()  # the clock NIGHT P0 arrivals were stamped with
        for e in events:
            kind = ENGINE_REPORTS.get(getattr(e, "kind", ""))
            bid = getattr(e, "lease_id", "")
            if kind is None or bid not in sl.instances or sl.instances[bid].node != node:
                continue
            with contextlib.suppress(InvalidInput, KeyError):
                sl.report(
                    bid, kind[0], latency_ms=float(e.latency_ms), now=now, ok=kind[1], why=str(e.reason)
                )


def _feed_ttft(metrics: Any, plane: TidalPlane, p0_models: set[str]) -> None:
    """The lending guard's measurement: the TTFT of every proxied request to a P0 model (P2 requests
    lent to it are among them: a slow one lowers the attainment, so the guard errs on the safe side)."""
    inner = metrics.observe_proxy

    def observe_proxy(model: str, status: int, ttft_s: float | None, latency_s: float) -> None:
        inner(model, status, ttft_s, latency_s)
        if model in p0_models and status == 200 and ttft_s is not None:
            plane.observe_ttft(ttft_s)

    metrics.observe_proxy = observe_proxy


def attach_tidal(
    bundle: Any,
    *,
    config: PlaneConfig,
    data_dir: Path,
    clock: Clock,
    batch: bool = True,
    ray: Any = None,
    queue: Any = None,
    wall: Clock | None = None,
) -> TidalRuntime:
    """Wire the plane (and the batch queue, and the NIGHT re-partition of ``config.repartition_gpus``
    on the simulated cluster) onto ``bundle``; see the module docstring. ``queue``: the batch
    queue to use (replicas on etcd pass the store's `EtcdJobQueue`: same methods and semantics,
    tests/contract/store/test_job_queue_contract.py); default ``DATA_DIR/batch.db``. Either way
    the jobs a previous run left running or paused are requeued here (``recover``). ``ray``: a
    `RayExecutor` already connected (`gpupool.cli.ray_address.connect`) to run the jobs on; default:
    local processes. ``clock``: the plane's time line (durations); ``wall``: the clock its schedule
    reads the time of day from (default ``clock``: a manual or compressed clock drives both)."""
    from gpupool.adapters.http.batch_routes import add_batch_routes

    c = bundle.controller
    gpus = {st.slice.gpu_id for st in c.allocator.states()}
    for g in config.repartition_gpus:
        if g not in gpus:
            raise UserError(
                f"tidal.repartition_gpus: {g!r} is not a GPU of the pool ({', '.join(sorted(gpus))})"
            )
    if config.repartition_gpus and bundle.sim is None:
        raise UserError(
            "tidal.repartition_gpus: the NIGHT re-partition drives the simulated cluster's MIG calls here; "
            "run with simulated readings (real nodes re-partition through `gpupool plan --apply`)"
        )
    usage = p2_usage_of(c.allocator)
    plane = TidalPlane(config, clock=clock, p2_usage=usage, stopwatch=time.perf_counter, wall=wall)
    plane.kv_usage = kv_usage_of(c)
    c.admission_hook = plane
    c.views["tidal"] = plane.view
    rt = TidalRuntime(plane, bundle)
    gw = bundle.app.state.gateway
    if gw.metrics is not None and hasattr(gw.metrics, "registry"):
        from gpupool.adapters.metrics.tidal import TidalCollector

        gw.metrics.registry.register(TidalCollector(plane))
    if gw.metrics is not None and config.day_policy == "lending":
        _feed_ttft(
            gw.metrics, plane, {w.model for w in bundle.workloads or () if w.model and w.priority == "P0"}
        )
    if batch:
        from gpupool.adapters.batch.queue import BatchJobQueue
        from gpupool.adapters.batch.runner import BatchRunner, ControllerLeases, Executor
        from gpupool.adapters.batch.service import BatchService

        executor: Executor
        if ray is not None:
            executor = ray
        else:
            from gpupool.adapters.batch.local import LocalExecutor

            executor = LocalExecutor()
        if queue is None:
            data_dir.mkdir(parents=True, exist_ok=True)
            queue = BatchJobQueue(data_dir / "batch.db")
        now = c.clock.now
        from gpupool.core.tidal.jobs import JobState

        # a job a previous run (or a leader that died) left running holds a P2 lease the store
        # kept: release it with the requeue, so the job's next start does not find its own VRAM taken.
        # The runner starting here holds no job lease, so every other active one (``job/ID/N``, the
        # runner's own request ids) is an orphan too: a run killed between recording a job's end
        # and its lease's release (the lease store commits in batches) left it behind.
        running = (JobState.RUNNING, JobState.PAUSED)  # (a damaged row: skipped here, named by the runner)
        orphaned = [r.lease_id for r in queue.jobs(damaged={}) if r.state in running]
        orphaned += [x.id for x in c.leases() if x.request.id.startswith("job/") and x.id not in orphaned]
        requeued = queue.recover(now=now())
        for lease_id in orphaned:
            with contextlib.suppress(InvalidInput, KeyError, LookupError):
                c.release(lease_id, reason="batch job requeued after a restart or a leader change")
        if orphaned:
            c.flush()
        if requeued:
            say(f"gpupool: batch queue: requeued {len(requeued)} jobs of the previous run")
        runner = BatchRunner(
            queue,
            ControllerLeases(c),
            executor,
            worker="gateway",
            lease_ttl_s=120.0,
            max_running=plane.max_batch_running,
            on_path=plane.record_path,
            stopwatch=time.perf_counter,
        )
        rt.batch = BatchService(queue, runner, now=now)
        add_batch_routes(bundle.app, rt.batch)
    if config.standby.backends:
        from gpupool.adapters.http.engine_routes import add_engine_routes

        try:
            rt.standby = StandbySleeper(config.standby, instances_of(bundle.backends))
        except InvalidInput as exc:
            raise UserError(str(exc)) from None
        plane.standby = rt.standby
        add_engine_routes(bundle.app, rt.standby)
        gw.agent_listeners.append(rt.engine_reports)
    if config.repartition_gpus:
        from gpupool.hardware.migactuate import NvmlMigActuator

        sim = bundle.sim

        def busy(node: str, index: int, doomed: Any) -> list[str]:
            ids = []
            for st in c.allocator.states():
                s = st.slice
                if s.node == node and s.gpu_index == index and s.profile in {d.profile for d in doomed}:
                    ids += [x.id for x in c.allocator.leases.on_slice(s.id)]
            return ids

        rt.night = NightRepartitioner(
            c,
            gpus=config.repartition_gpus,
            actuator_of=lambda node: NvmlMigActuator(sim.mig_hardware(node), busy=busy),
            discover=lambda node: [s for s in sim.inventory() if s.node == node],
            clock=clock,
            standby=SimulatedStandby(sim, c),
        )
    return rt


async def tidal_loop(
    rt: TidalRuntime, *, period_s: float = 0.5, leading: Callable[[], bool] | None = None
) -> None:
    """`TidalRuntime.step` every ``period_s`` until cancelled; on the way out running jobs stop and
    are requeued (the next start runs them again). ``leading``: whether this replica still leads
    (`gpupool.cli.ha`); when it no longer does on the way out, the batch runner steps down instead
    (`BatchService.step_down`): no write, no wait on the event loop, the processes killed after
    the grace period off it, the jobs requeued by the next leader."""
    try:
        while True:
            try:
                rt.step()
            except Exception as exc:  # one bad step must not stop tidal: it is reported, the next runs
                say(f"tidal: step failed: {type(exc).__name__}: {exc}")
            await asyncio.sleep(period_s)
    finally:
        if rt.batch is not None:
            with contextlib.suppress(Exception):
                if leading is not None and not leading():
                    rt.batch.step_down()
                else:
                    rt.batch.close()


def attach_serving(
    bundle: Any, *, config: PlaneConfig, data_dir: Path, ray: Any = None, queue: Any = None
) -> TidalRuntime:
    """`gpupool serve`'s plane: durations on the lease clock (``bundle.controller.clock``, immune to
    wall-clock steps), the day/night schedule on the wall clock itself (``bundle.wall``, default
    ``time.time``), so that a corrected wall clock moves DAY and NIGHT at the next tick, without a
    restart. See "Time" in docs/store.md."""
    from gpupool.core.clock import FunctionClock

    clock, wall = bundle.controller.clock, FunctionClock(bundle.wall)
    return attach_tidal(
        bundle, config=config, data_dir=data_dir, clock=clock, wall=wall, ray=ray, queue=queue
    )


# --------------------------------------------------------------------------- `gpupool run`'s demo
DEMO_START_HOUR = 18
DEMO_TENANT = "tidal-batch"


def demo_clock(speed: float, config: PlaneConfig) -> Any:
    """A compressed clock from today's `DEMO_START_HOUR`:00 in the schedule's time zone."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from gpupool.core.clock import FunctionClock
    from gpupool.core.tidal.modes import CompressedClock

    zone = ZoneInfo(config.tidal.timezone)
    start = datetime.now(zone).replace(hour=DEMO_START_HOUR, minute=0, second=0, microsecond=0)
    return CompressedClock(FunctionClock(time.monotonic), origin_s=start.timestamp(), speed=speed)


def demo_config(speed: float, *, repartition_gpus: tuple[str, ...] = ()) -> PlaneConfig:
    """The seed's schedule on a compressed clock: the demand window and the smoothing span two real
    seconds (at x144, 288 simulated seconds) and the exit hold four, so that a few requests per
    second measure a stable rate."""
    from gpupool.core.tidal.modes import TidalConfig

    return PlaneConfig(
        tidal=TidalConfig(smooth_tau_s=max(300.0, 2.0 * speed), exit_hold_s=max(300.0, 4.0 * speed)),
        demand_window_s=max(60.0, 2.0 * speed),
        holdback_s=max(30.0, 2.0 * speed),
        repartition_gpus=repartition_gpus,
    )


def demand_shape(rt: TidalRuntime) -> float:
    """Online demand relative to its daily mean at the plane's (compressed) local time: the
    synthetic traffic of `gpupool run` follows it, the plane measures it back."""
    from gpupool.cli.tidal import live_demand

    local = rt.plane.controller.local_time(rt.plane.wall.now())
    return live_demand(local.hour + local.minute / 60)


async def demo_batch_jobs(rt: TidalRuntime, *, seed: int = 11, period_s: float = 4.0, depth: int = 6) -> None:
    """Keep ``depth`` real batch jobs queued or running (tenant ``tidal-batch``): each a Python child
    process that runs for 20-60 s; every other one checkpointable (paused by SIGSTOP when displaced,
    the others requeued)."""
    import random
    import sys

    from gpupool.core.tidal.jobs import BatchJobSpec, JobState

    rng = random.Random(seed)
    n = 0
    while rt.batch is not None:
        active = sum(
            1 for j in rt.batch.jobs() if j["state"] in (JobState.QUEUED, JobState.RUNNING, JobState.PAUSED)
        )
        if active < depth:
            n += 1
            run_s = rng.randint(20, 60)
            code = f"import time\nend = time.time() + {run_s}\nwhile time.time() < end: time.sleep(0.1)\n"
            spec = BatchJobSpec(
                id=f"demo-{int(time.time())}-{n}",
                vram_mib=rng.choice((8, 16, 24)) * 1024,
                command=(sys.executable, "-c", code),
                checkpointable=n % 2 == 0,
                tenant=DEMO_TENANT,
            )
            with contextlib.suppress(InvalidInput):
                rt.batch.submit(spec)
        await asyncio.sleep(period_s)


__all__ = [
    "DEMO_TENANT",
    "SimulatedStandby",
    "TidalRuntime",
    "attach_serving",
    "attach_tidal",
    "demand_shape",
    "demo_batch_jobs",
    "demo_clock",
    "demo_config",
    "load_plane_config",
    "tidal_loop",
]
