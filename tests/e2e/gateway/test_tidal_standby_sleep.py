"""NIGHT sleeps the standby instance through the node agent's ``vllm-sleep`` pauser, a P0 burst wakes it
at once, and it is awake again before the day window opens. Real processes: two emulated vLLM-style
backends (``gpupool emulate-backend``: vLLM's ``/sleep``, ``/wake_up``, ``/is_sleeping``; each holds
simulated VRAM through the registry and keeps only its context while asleep) and a ``gpupool agent`` on
the simulated devices, reporting to the gateway. The gateway (`gpupool serve`'s `build`,
`register_backends` and `attach_tidal`) serves real HTTP on loopback; the schedule runs on a manual
clock, as in ``test_tidal_cycle``. Waits are liveness bounds, not timing assertions.

Checked, in order: DAY keeps both instances awake; NIGHT takes the standby out of routing and the
agent puts it to sleep (``is_sleeping``, the device readings, an event with the sleep's time); its
slice is then lent: a P2 lease held by a real batch process is granted on it; chat requests are
served by the main instance meanwhile; a burst of P0 requests wakes it at once: the P2 lease is
revoked, the agent frees the batch process's memory (it exits) and only then wakes the engine; the
night path ``sleep`` (burst -> confirmed awake) is an event, a ``/v1/pool`` figure and a metric; after
the quiet time it sleeps again; the wake lead before the day window wakes it while still NIGHT.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

from gpupool.adapters.simulated import embedded_default
from gpupool.adapters.simulated.holder import start_holder
from gpupool.adapters.simulated.vram import REGISTRY_ENV
from gpupool.cli.serve import build, register_backends
from gpupool.cli.serving import free_port, uvicorn_server
from gpupool.cli.tidalplane import attach_tidal
from gpupool.core import ManualClock
from gpupool.core.tidal.modes import Mode
from gpupool.core.tidal.plane import plane_config

pytestmark = pytest.mark.slow
TOKEN = "tidal-standby-admin"
HDR = {"Authorization": f"Bearer {TOKEN}"}
MIB, SLEEP_MIB = 2000, 512
WATERMARKS = {"vram_high": 1.0, "vram_low": 0.99, "temp_high_c": 90, "temp_low_c": 80, "early_warning": 0.99}
"""The simulated A100s also carry the plan's imagined replicas (about 90 % full): no backpressure here."""


def at(hh: int, mm: int = 0, day: int = 2) -> float:
    return datetime(2026, 3, day, hh, mm, tzinfo=ZoneInfo("UTC")).timestamp()


def gpupool(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "from gpupool.cli.main import main; main()", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def until(
    pred: Callable[[], object], what: str, step: Callable[[], object] | None = None, s: float = 60
) -> None:
    for _ in range(int(s / 0.05)):
        if step is not None:
            step()
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached within {s} s: {what}")


def held_by(registry: Path, gpu_id: str, pid: int) -> int:
    node = gpu_id.split("/", maxsplit=1)[0]
    snap = embedded_default(vram_registry=registry).read(node)
    g = next(g for g in snap.gpus if f"{node}/{g.index}" == gpu_id)
    return sum(p.used_mib for p in g.processes if p.pid == pid)


async def _night_sleep(tmp: Path) -> None:
    registry = tmp / "vram"
    env = {**os.environ, REGISTRY_ENV: str(registry), "PYTHONPATH": os.pathsep.join(sys.path)}
    bundle = build(data_dir=tmp / "gw", extra_tokens=[(TOKEN, "ops", "admin")])
    c = bundle.controller
    main = next(w for w in bundle.workloads if w.name == "main-llm")
    slices = {st.slice.id: st.slice for st in c.allocator.states()}
    placed = [pl.slice for pl in bundle.plan.placements if pl.workload == "main-llm" and pl.slice in slices]
    s0, s1 = slices[placed[0]], slices[placed[1]]
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for s in (s0, s1):
            port = free_port()
            procs.append(
                gpupool(
                    "emulate-backend", "--model", str(main.model), "--quant", main.quant, "--port", str(port),
                    "--speed", "10", "--scheduling-policy", "priority", "--kv-budget-mib", "8192",
                    "--hold-vram-mib", str(MIB), "--hold-on", s.id, "--sleep-vram-mib", str(SLEEP_MIB),
                    env=env,
                )
            )  # fmt: skip
            urls.append(f"http://127.0.0.1:{port}")
        for u in urls:
            await until(lambda u=u: _ok(f"{u}/health"), f"{u} up")
        register_backends(
            bundle,
            [("main-0", str(main.model), urls[0], s0.id), ("main-1", str(main.model), urls[1], s1.id)],
            {"main-0": {"priority_scheduling": True}, "main-1": {"priority_scheduling": True}},
        )
        clock = ManualClock(at(12))
        cfg = plane_config(
            {
                "timezone": "UTC",
                "initial_baseline": 60.0,
                "night_end": "08:45",
                "day_start": "08:45",
                "standby_backends": ["main-1"],
                "standby_wake_burst": 3,
                "standby_burst_window_s": 600,
                "standby_sleep_after_s": 120,
                "standby_wake_lead_min_s": 600,
            }
        )
        rt = attach_tidal(bundle, config=cfg, data_dir=tmp / "gw", clock=clock, batch=False)
        sl = rt.standby
        assert sl is not None
        gw_port = free_port()
        server = uvicorn_server(bundle.app, host="127.0.0.1", port=gw_port)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        gw = f"http://127.0.0.1:{gw_port}"
        async with httpx.AsyncClient(base_url=gw, headers=HDR, timeout=30) as cl:
            assert (await cl.put("/v1/admin/watermarks", json=WATERMARKS)).status_code == 200
        agent_metrics = free_port()
        agent = gpupool(
            "agent", "--gateway", gw, "--token", TOKEN, "--node", s1.node, "--devices", "simulated",
            "--no-publish", "--metrics-port", str(agent_metrics), "--period-ms", "100", env=env,
        )  # fmt: skip
        procs.append(agent)
        standby_pid = procs[1].pid
        try:
            async with httpx.AsyncClient(base_url=gw, headers=HDR, timeout=30) as cl:
                # ------------------------------------------------------------ DAY: both awake
                rt.step()
                r = await cl.get(f"/v1/nodes/{s1.node}/engines")
                assert r.status_code == 200
                want = {"id": "main-1", "gpu_id": s1.gpu_id, "endpoint": urls[1], "pauser": "vllm-sleep"}
                assert r.json()["engines"] == [{**want, "level": 1, "state": "awake"}]
                assert (await cl.get("/v1/nodes/nope/engines")).json() == {"engines": []}
                assert (
                    await cl.get(f"/v1/nodes/{s1.node}/engines", headers={"Authorization": "Bearer x"})
                ).status_code == 401
                await until(
                    lambda: held_by(registry, s1.gpu_id, standby_pid) == MIB, "the standby holds its VRAM"
                )

                # ------------------------------------------------------------ NIGHT: asleep
                clock.advance(at(20) - clock.now())
                for _ in range(40):  # measured silence after 20:00
                    rt.step()
                    clock.advance(60)
                assert rt.plane.mode is Mode.NIGHT
                assert not c.kv.ledger.is_healthy("kv/main-1")  # out of routing at once
                await until(lambda: sl.state("main-1")[2] == "asleep", "the agent slept the standby", rt.step)
                assert (await _get(f"{urls[1]}/is_sleeping")) == {"is_sleeping": True}
                assert (await _get(f"{urls[0]}/is_sleeping")) == {"is_sleeping": False}
                await until(lambda: held_by(registry, s1.gpu_id, standby_pid) == SLEEP_MIB, "its VRAM freed")
                reasons = [e.reason for e in rt.emitted if e.kind == "tidal"]
                assert any(r.startswith("standby main-1: asleep (sleep ") for r in reasons), reasons

                # ------------------------------------------------------------ its slice is lent to P2
                await until(lambda: not sl.view()["main-1"]["slice_held"], "the slice is lent", rt.step)
                assert not [x for x in c.leases() if x.slice_ids == (s1.id,)]
                batch, _ = start_holder(registry, s1.id, 3000)
                procs.append(batch)  # type: ignore[arg-type]
                labels = {"gpupool.io/pauser": "signal", "gpupool.io/pgid": str(batch.pid)}
                want = {
                    "priority": "P2",
                    "vram_mib": s1.capacity.vram_mib,
                    "gpu_id": s1.gpu_id,
                    "labels": labels,
                }
                r = await cl.post("/v1/leases", json={**want, "ttl_s": 600})
                assert r.status_code == 201, r.text
                p2 = r.json()
                assert p2["grants"][0]["slice_id"] == s1.id
                await until(
                    lambda: _agent_tracks_p2(agent_metrics), "the agent took the P2 lease from its ledger"
                )
                body = {"model": main.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                p0 = {**HDR, "x-gpupool-priority": "P0"}
                r = await cl.post("/v1/chat/completions", json=body, headers=p0)
                assert r.status_code == 200, r.text  # the main instance serves meanwhile
                assert sl.state("main-1")[0] == "asleep"  # one P0 request is no burst

                # ------------------------------------------------------------ a P0 burst: awake at once
                rs = await asyncio.gather(
                    *(cl.post("/v1/chat/completions", json=body, headers=p0) for _ in range(2))
                )
                assert [x.status_code for x in rs] == [200, 200]
                assert sl.state("main-1")[0] == "awake"
                await until(lambda: sl.routable("main-1"), "the burst woke the standby", rt.step)
                assert batch.poll() is not None  # the batch process was gone before the engine woke
                assert (await cl.get(f"/v1/leases/{p2['id']}")).json()["state"] == "revoked"
                assert [x.request.tenant for x in c.leases() if x.slice_ids == (s1.id,)] == ["gpupool-system"]
                rt.step()
                assert c.kv.ledger.is_healthy("kv/main-1")
                assert (await _get(f"{urls[1]}/is_sleeping")) == {"is_sleeping": False}
                await until(lambda: held_by(registry, s1.gpu_id, standby_pid) == MIB, "its VRAM is back")
                pool = (await cl.get("/v1/pool")).json()["tidal"]
                assert (
                    pool["night_paths"]["sleep"]["count"] == 1 and pool["night_paths"]["sleep"]["p99_ms"] > 0
                )
                assert pool["standby"]["main-1"]["actual"] == "awake"
                assert 'gpupool_tidal_night_path_total{path="sleep"} 1.0' in (await cl.get("/metrics")).text
                reasons = [e.reason for e in rt.emitted if e.kind == "tidal"]
                assert any(r.startswith("night path sleep: ") for r in reasons), reasons
                assert any("wake for a P0 burst" in r for r in reasons)

                # ------------------------------------------------------------ quiet again: asleep
                clock.advance(121)
                await until(lambda: sl.state("main-1")[2] == "asleep", "asleep after the quiet time", rt.step)

                # ------------------------------------------------------------ before DAY: awake
                clock.advance(at(8, 36, day=3) - clock.now())  # 9 minutes before 08:45
                rt.step()
                assert rt.plane.mode is Mode.NIGHT and rt.plane.standby_wake_due()
                await until(lambda: sl.routable("main-1"), "awake before the day window", rt.step)
                assert (await _get(f"{urls[1]}/is_sleeping")) == {"is_sleeping": False}
                assert rt.plane.paths["sleep"].count == 1  # a planned wake is not a night path
                c.check_invariants()
        finally:
            server.should_exit = True
            await serving
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _agent_tracks_p2(port: int) -> bool:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
    except httpx.HTTPError:
        return False
    return any(
        line.startswith("gpupool_agent_workloads{")
        and 'state="running"' in line
        and float(line.split()[-1]) >= 1
        for line in text.splitlines()
    )


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def _get(url: str) -> object:
    async with httpx.AsyncClient(timeout=10) as cl:
        return (await cl.get(url)).json()


def test_night_sleeps_the_standby_through_the_agent_and_a_p0_burst_wakes_it(tmp_path: Path) -> None:
    asyncio.run(_night_sleep(tmp_path))


def _wired(tmp: Path, **extra: object) -> tuple[object, object, ManualClock]:
    """The runtime wiring alone (no engines, no agent): two registered backends of the main model."""
    bundle = build(data_dir=tmp, extra_tokens=[(TOKEN, "ops", "admin")])
    slices = {st.slice.id: st.slice for st in bundle.controller.allocator.states()}
    placed = [pl.slice for pl in bundle.plan.placements if pl.workload == "main-llm" and pl.slice in slices]
    model = next(w.model for w in bundle.workloads if w.name == "main-llm")
    register_backends(
        bundle,
        [
            ("m0", str(model), "http://127.0.0.1:9", placed[0]),
            ("m1", str(model), "http://127.0.0.1:9", placed[1]),
        ],
    )
    clock = ManualClock(at(23))
    doc = {"timezone": "UTC", "initial_baseline": 60.0, "standby_backends": ["m1"], **extra}
    rt = attach_tidal(bundle, config=plane_config(doc), data_dir=tmp, clock=clock, batch=False)
    return bundle, rt, clock


def test_the_off_switch_keeps_standbys_awake_and_agent_reports_are_checked(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gpupool.cli.errors import UserError

    for enabled in (False, True):
        bundle, rt, clock = _wired(tmp_path / str(enabled), enabled=enabled)
        for _ in range(40):  # quiet night
            rt.step()  # type: ignore[attr-defined]
            clock.advance(60)
        assert rt.plane.mode is Mode.NIGHT  # type: ignore[attr-defined]
        sl = rt.standby  # type: ignore[attr-defined]
        assert sl.state("m1")[0] == ("asleep" if enabled else "awake")
        assert bundle.controller.kv.ledger.is_healthy("kv/m1") is not enabled  # type: ignore[attr-defined]
    node = sl.instances["m1"].node
    ev = SimpleNamespace(kind="engine_asleep", lease_id="m1", latency_ms=12.0, reason="")
    rt.engine_reports("other-node", [ev])  # type: ignore[attr-defined]  # not the backend's node: ignored
    assert sl.state("m1")[2] == "awake"
    rt.engine_reports(
        node, [SimpleNamespace(kind="engine_asleep", lease_id="nope", latency_ms=1.0, reason="")]
    )  # type: ignore[attr-defined]
    rt.engine_reports(node, [ev])  # type: ignore[attr-defined]
    assert sl.state("m1")[2] == "asleep"
    with pytest.raises(UserError, match="standby_backends"):
        _wired(tmp_path / "bad", standby_backends=["nope"])
