"""A compressed day -> night -> day cycle of the control plane on simulated devices, end to end.

The gateway (`gpupool serve`'s `build` + `attach_tidal`) serves real HTTP on loopback; the batch
jobs are real child processes in their own process groups holding P2 leases; the MIG re-partition
goes through the node actuator's NVML calls on the simulated cluster. The schedule runs on a manual
clock (the compressed day), the leases on the wall clock. Everything runs on one event loop, as in
``gpupool serve``: the test's requests and `TidalRuntime.step` never overlap.

Checked, in order: DAY runs one batch job at a time and refuses a P2 lease beyond the P2 share
(429 naming the reservation); measured silence after 20:00 switches to NIGHT, gpu-a/1 is drained and
merged into one 7g.80gb instance that batch work then uses, all jobs run; a P0 lease at night is
served by preempting a job, which is paused (SIGSTOP: state T) and not resumed while the holdback
lasts; 07:00 restores the day layout (and the standby replica), and the DAY concurrency applies again;
cancel stops a job and a second cancel is 409.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

from gpupool.adapters.pause.procfs import proc_state
from gpupool.cli.serve import build
from gpupool.cli.tidalplane import attach_tidal
from gpupool.core import ManualClock
from gpupool.core.tidal.modes import Mode, TidalConfig
from gpupool.core.tidal.plane import PlaneConfig
from gpupool.hardware.mig import MigInstance
from tests.adapters.http.servers import served

pytestmark = pytest.mark.slow
TOKEN = "tidal-e2e-admin"
HDR = {"Authorization": f"Bearer {TOKEN}"}
JOB = [sys.executable, "-c", "import time\nwhile True:\n    time.sleep(0.05)\n"]
GIB = 1024


def at(hh: int, mm: int = 0, day: int = 2) -> float:
    return datetime(2026, 3, day, hh, mm, tzinfo=ZoneInfo("UTC")).timestamp()


async def _until(pred: object, what: str, tries: int = 200) -> None:
    for _ in range(tries):
        if callable(pred) and pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached: {what}")


async def _cycle(tmp: Path) -> None:
    bundle = build(data_dir=tmp, extra_tokens=[(TOKEN, "ops", "admin")])
    clock = ManualClock(at(12))
    cfg = PlaneConfig(
        tidal=TidalConfig(timezone="UTC", initial_baseline=60.0),
        holdback_s=600.0,
        repartition_gpus=("gpu-a/1",),
    )
    rt = attach_tidal(bundle, config=cfg, data_dir=tmp, clock=clock)
    c, sim = bundle.controller, bundle.sim
    try:
        async with served(bundle.app) as url, httpx.AsyncClient(base_url=url, headers=HDR, timeout=10) as cl:
            # ---------------------------------------------------------------- DAY
            for i in range(3):
                body = {"id": f"j{i}", "command": JOB, "vram_mib": 60 * GIB, "checkpointable": i < 2}
                r = await cl.post("/v1/batch/jobs", json=body)
                assert r.status_code == 201, r.text
                assert r.json()["state"] == "queued"
            r = await cl.post("/v1/batch/jobs", json={"command": JOB, "vram_mib": 0})
            assert r.status_code == 422 and "vram_mib" in r.text
            r = await cl.post("/v1/batch/jobs", json={"command": JOB, "vram_mib": 10**20})
            assert r.status_code == 422 and r.json()["field"] == "vram_mib", r.text  # never queued
            rt.batch.queue._db.execute("PRAGMA query_only = 1")  # the queue's disk refuses writes
            r = await cl.post("/v1/batch/jobs", json={"id": "refused", "command": JOB, "vram_mib": 1024})
            assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text
            assert r.headers["retry-after"] == "1" and "batch queue" in r.json()["error"]
            rt.batch.queue._db.execute("PRAGMA query_only = 0")
            rt.step()
            jobs = (await cl.get("/v1/batch/jobs")).json()["jobs"]
            assert [j["state"] for j in jobs] == ["running", "queued", "queued"]  # DAY: one at a time
            r = await cl.post("/v1/leases", json={"priority": "P2", "vram_mib": 30 * GIB})
            assert r.status_code == 429 and "DAY reservation" in r.text
            pool = (await cl.get("/v1/pool")).json()
            assert pool["tidal"]["mode"] == "day" and pool["tidal"]["refused"] == {"day-reservation": 1}
            assert pool["tidal"]["next_switch"]["to"] == "night"
            standby = dict(sim._resident)  # the day's placed replicas (gpu-a/1 holds main-llm#2)
            assert "gpu-a/1/mig-3g.40gb-4" in standby

            # ---------------------------------------------------------------- NIGHT
            clock.advance(at(20) - clock.now())
            for _ in range(40):  # measured silence: no P0/P1 arrivals for 40 simulated minutes
                rt.step()
                clock.advance(60)
            assert rt.plane.mode is Mode.NIGHT
            assert rt.plane.controller.transitions[-1].reason == "traffic-low"
            night = rt.night
            assert night is not None and night.gpus["gpu-a/1"].state == "merged", night.view()
            act = sim.mig_hardware("gpu-a")
            assert sorted(MigInstance(g.profile, g.start) for g in act.gpu_instances(1)) == [
                MigInstance("7g.80gb", 0)
            ]
            assert "gpu-a/1/mig-3g.40gb-4" not in sim._resident  # the standby replica was stopped
            pool = (await cl.get("/v1/pool")).json()
            a1 = next(g for n in pool["nodes"] for g in n["gpus"] if g["gpu_id"] == "gpu-a/1")
            assert [s["slice_id"] for s in a1["slices"]] == ["gpu-a/1/mig-7g.80gb-0"]
            assert not a1["drained"]
            rt.step()
            jobs = {j["id"]: j for j in (await cl.get("/v1/batch/jobs")).json()["jobs"]}
            assert [jobs[f"j{i}"]["state"] for i in range(3)] == ["running"] * 3
            on = {
                (await cl.get(f"/v1/leases/{j['lease_id']}")).json()["grants"][0]["slice_id"]
                for j in jobs.values()
            }
            assert "gpu-a/1/mig-7g.80gb-0" in on  # batch work runs on the merged instance

            # a P0 arrival at night: served by preempting a job, which the runner pauses
            r = await cl.post("/v1/leases", json={"priority": "P0", "vram_mib": 60 * GIB, "ttl_s": 600})
            assert r.status_code == 201, r.text
            p0 = r.json()["id"]
            rt.step()
            jobs = {j["id"]: j for j in (await cl.get("/v1/batch/jobs")).json()["jobs"]}
            states = sorted(j["state"] for j in jobs.values())
            assert states in (["paused", "running", "running"], ["queued", "running", "running"]), jobs
            paths = rt.plane.paths
            assert paths["preempt"].count == 1
            displaced = next(j for j in jobs.values() if j["state"] != "running")
            if displaced["state"] == "paused":
                assert paths["pause"].count == 1
                handle = rt.batch.runner.paused[displaced["id"]].handle
                await _until(lambda: proc_state(handle.pid) == "T", "the paused job is stopped")
            else:
                assert paths["requeue"].count == 1
            r = await cl.post("/v1/leases", json={"priority": "P2", "vram_mib": GIB})
            assert r.status_code == 429 and "holdback" in r.text  # capacity goes to online work first
            rt.step()
            assert displaced["id"] not in rt.batch.runner.running  # held back: not resumed yet
            pool = (await cl.get("/v1/pool")).json()
            assert pool["tidal"]["night_paths"]["preempt"]["count"] == 1
            metrics = (await cl.get("/metrics")).text
            assert 'gpupool_tidal_night_path_total{path="preempt"} 1.0' in metrics
            assert 'gpupool_tidal_mode{mode="night"} 1.0' in metrics
            reasons = [e.reason for e in rt.emitted if e.kind == "tidal"]
            assert any(r.startswith("night path preempt: ") for r in reasons)
            assert any(r.startswith(("night path pause: ", "night path requeue: ")) for r in reasons)
            assert (await cl.delete(f"/v1/leases/{p0}")).status_code == 200

            # ---------------------------------------------------------------- DAY again
            clock.advance(at(7, 0, day=3) - clock.now())
            rt.step()
            assert rt.plane.mode is Mode.DAY
            assert night.gpus["gpu-a/1"].state == "day", night.view()
            assert sorted(MigInstance(g.profile, g.start) for g in act.gpu_instances(1)) == [
                MigInstance("3g.40gb", 4),
                MigInstance("4g.40gb", 0),
            ]
            assert sim._resident.get("gpu-a/1/mig-3g.40gb-4") == standby["gpu-a/1/mig-3g.40gb-4"]
            pool = (await cl.get("/v1/pool")).json()
            a1 = next(g for n in pool["nodes"] for g in n["gpus"] if g["gpu_id"] == "gpu-a/1")
            assert sorted(s["slice_id"] for s in a1["slices"]) == [
                "gpu-a/1/mig-3g.40gb-4",
                "gpu-a/1/mig-4g.40gb-0",
            ]
            rt.step()
            running = [j for j in (await cl.get("/v1/batch/jobs")).json()["jobs"] if j["state"] == "running"]
            assert len(running) == 1  # DAY concurrency again; the others paused or requeued
            c.check_invariants()

            # cancel: the process stops, the lease is released; a second cancel is 409
            job = running[0]
            pid = rt.batch.runner.running[job["id"]].handle.pid
            r = await cl.delete(f"/v1/batch/jobs/{job['id']}")
            assert r.status_code == 200 and r.json()["state"] == "cancelled"
            assert (await cl.get(f"/v1/leases/{job['lease_id']}")).json()["state"] == "released"
            await _until(lambda: proc_state(pid) in (None, "Z", "X"), "the cancelled job's process ended")
            assert (await cl.delete(f"/v1/batch/jobs/{job['id']}")).status_code == 409
            assert (await cl.delete("/v1/batch/jobs/nope")).status_code == 404
            kinds = {e.kind for e in rt.emitted}
            assert kinds == {"tidal", "batch"}
    finally:
        if rt.batch is not None:
            rt.batch.close()


def test_compressed_day_night_day_cycle(tmp_path: Path) -> None:
    asyncio.run(_cycle(tmp_path))


def test_day_lending_is_fed_the_p0_models_ttft_from_the_proxy(tmp_path: Path) -> None:
    from gpupool.core.tidal.plane import plane_config

    bundle = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    cfg = plane_config({"timezone": "UTC", "day_policy": "lending", "lending_min_samples": 5})
    rt = attach_tidal(bundle, config=cfg, data_dir=tmp_path, clock=ManualClock(at(12)), batch=False)
    p0 = next(w.model for w in bundle.workloads if w.priority == "P0" and w.model)
    p1 = next(w.model for w in bundle.workloads if w.priority == "P1" and w.model)
    metrics = bundle.app.state.gateway.metrics
    for _ in range(5):
        metrics.observe_proxy(p0, 200, 0.2, 0.5)
        metrics.observe_proxy(p1, 200, 9.0, 9.0)  # not a P0 model: not the guard's measurement
    metrics.observe_proxy(p0, 502, None, 0.1)  # no first token: not measured
    assert rt.plane.guard.attainment(rt.plane.clock.now()) == (1.0, 5)
    rt.step()
    assert rt.plane.guard.level == 0.25
    assert "gpupool_proxy_requests_total" in metrics.render()[0].decode()  # the wrapped call still counts


def test_a_day_strict_refusal_says_how_long_until_night(tmp_path: Path) -> None:
    """A P2 request to an online engine by DAY (strict) waits for NIGHT: its 429 says when the night
    window opens and Retry-After is that wait (at most an hour), not 1 s all day long. Before: 1."""
    from gpupool.core.ports import Backend
    from gpupool.core.tidal.plane import MAX_RETRY_AFTER_S, plane_config
    from tests.adapters.http.servers import running

    bundle = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    model = "qwen2.5-0.5b"  # refused before any backend is asked: none needs to run
    be = Backend("be", model, "http://127.0.0.1:9", node="gpu-a", gpu_id="gpu-a/0", kv_budget_mib=4096)
    bundle.controller.register_backend(be)
    clock = ManualClock(at(19, 50))
    attach_tidal(
        bundle, config=plane_config({"timezone": "UTC"}), data_dir=tmp_path, clock=clock, batch=False
    )
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    p2 = {**HDR, "x-gpupool-priority": "P2"}
    with running(bundle.app) as url, httpx.Client(base_url=url, timeout=10) as cl:
        r = cl.post("/v1/chat/completions", json=chat, headers=p2)
        assert r.status_code == 429 and r.headers["retry-after"] == "600", (r.headers, r.text)
        msg = r.json()["error"]["message"]
        assert "DAY (strict)" in msg and "2026-03-02T20:00" in msg and "in 600 s" in msg, msg
        r = cl.post("/v1/leases", json={"priority": "P2", "model": model, "prompt_tokens": 10}, headers=HDR)
        assert r.status_code == 429 and r.headers["retry-after"] == "600", r.text
        assert r.json()["retry_after_s"] == 600 and "in 600 s" in r.json()["error"]
        clock.advance(at(12, day=3) - clock.now())  # noon: eight hours to the night window
        r = cl.post("/v1/chat/completions", json=chat, headers=p2)
        assert r.status_code == 429 and r.headers["retry-after"] == str(MAX_RETRY_AFTER_S)
        assert "2026-03-03T20:00" in r.json()["error"]["message"] and "in 28800 s" in r.text
        clock.advance(at(20, 5, day=3) - clock.now())  # in the window, still DAY: the low stretch is due
        r = cl.post("/v1/chat/completions", json=chat, headers=p2)
        assert r.status_code == 429 and "the night window is open" in r.json()["error"]["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 1800  # at most the 30-minute low stretch
    assert bundle.controller.request_lease_count() == 0 and not bundle.controller.leases()


def test_a_job_lease_a_crash_kept_after_its_job_ended_is_released_at_the_next_start(tmp_path: Path) -> None:
    """The runner records a job's end, then releases its lease; a gateway killed between the two
    (the lease store commits in batches) leaves an active P2 lease that no job holds. The next
    start releases it at once, as it does the leases of the jobs it requeues: it would otherwise
    hold its VRAM out of the DAY share until its TTL ran out."""
    from gpupool.adapters.batch.queue import BatchJobQueue
    from gpupool.core.tidal.jobs import BatchJobSpec, JobState, lease_request

    spec = BatchJobSpec(id="ended", vram_mib=4 * GIB, command=("true",))
    first = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    out = first.controller.acquire(lease_request(spec, attempt=1, ttl_s=120.0), queue=False)
    assert out.granted and out.lease is not None
    lease_id = out.lease.id
    first.controller.flush()
    first.controller.store.close()  # (the process dies here: the release never reached the store)
    queue = BatchJobQueue(tmp_path / "batch.db")
    queue.submit(spec, now=at(11))
    queue.claim(spec.id, worker="gateway", now=at(11), lease_id=lease_id)
    queue.transition(spec.id, JobState.DONE, now=at(11), returncode=0, reason="exit 0")
    queue.close()

    bundle = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    assert not bundle.controller.get(lease_id).state.ended  # recovered from the store
    rt = attach_tidal(
        bundle,
        config=PlaneConfig(tidal=TidalConfig(timezone="UTC")),
        data_dir=tmp_path,
        clock=ManualClock(at(12)),
    )
    try:
        assert bundle.controller.get(lease_id).state.ended
        assert rt.batch is not None and rt.batch.job(spec.id)["state"] == "done"  # the job is untouched
    finally:
        if rt.batch is not None:
            rt.batch.close()
        bundle.controller.store.close()


def test_a_damaged_job_row_neither_stops_the_start_nor_the_queue(tmp_path: Path) -> None:
    """One batch_jobs row that is not a job stopped the gateway's start (the recovery read every
    job) and then, at every tidal step, the whole queue; now it is skipped and reported once."""
    import sqlite3

    from gpupool.adapters.batch.queue import BatchJobQueue
    from gpupool.core.tidal.jobs import BatchJobSpec

    queue = BatchJobQueue(tmp_path / "batch.db")
    queue.submit(BatchJobSpec(id="bad", vram_mib=GIB, command=tuple(JOB), deadline_s=1.0), now=at(11))
    queue.submit(BatchJobSpec(id="ok", vram_mib=GIB, command=tuple(JOB)), now=at(11))
    queue.claim("ok", worker="gateway", now=at(11), lease_id="")  # (a previous run's: requeued at start)
    queue.close()
    with sqlite3.connect(tmp_path / "batch.db") as db:
        db.execute("UPDATE batch_jobs SET spec = '{broken' WHERE id = 'bad'")
    bundle = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    rt = attach_tidal(
        bundle,
        config=PlaneConfig(tidal=TidalConfig(timezone="UTC")),
        data_dir=tmp_path,
        clock=ManualClock(at(12)),
    )
    try:
        assert rt.batch is not None

        async def two_steps() -> None:  # (on an event loop, as the gateway's tidal loop steps)
            rt.step()
            rt.step()

        asyncio.run(two_steps())
        assert rt.batch.job("ok")["state"] == "running"
        reports = [e.reason for e in rt.emitted if e.kind == "batch" and "skipped" in e.reason]
        assert len(reports) == 1 and reports[0].startswith("job bad skipped: ") and "batch.db" in reports[0]
        assert rt.plane.notes["batch_jobs"]["damaged"] == 1 and rt.plane.notes["batch_jobs"]["running"] == 1
    finally:
        rt.batch.close()
        bundle.controller.store.close()
