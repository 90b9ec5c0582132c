"""``/v1/batch/jobs`` over real HTTP on a real batch queue (SQLite) and runner: bodies the bounded
decoder refuses are 400s naming the problem, never 500s, and store nothing; every job id the
route accepts can be read and cancelled again, a ``/`` in it included."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.batch.local import LocalExecutor
from gpupool.adapters.batch.queue import BatchJobQueue
from gpupool.adapters.batch.runner import BatchRunner, ControllerLeases
from gpupool.adapters.batch.service import BatchService
from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.batch_routes import add_batch_routes
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running

TOK = "batch-routes-admin-1"
AUTH = {"Authorization": f"Bearer {TOK}", "content-type": "application/json"}
JOB = [sys.executable, "-c", "import time; time.sleep(60)"]


class _ServedQueue:
    """The real `BatchService`, built on its first call: on the server's thread, the only one that
    may use its SQLite connection (as on the gateway, where every call runs on the event loop)."""

    def __init__(self, controller: LeaseController, path: Path) -> None:
        self._controller, self._path = controller, path
        self._service: BatchService | None = None

    def __getattr__(self, name: str) -> Any:
        if self._service is None:
            leases = ControllerLeases(self._controller)
            runner = BatchRunner(BatchJobQueue(self._path), leases, LocalExecutor())
            self._service = BatchService(runner.queue, runner, now=time.time)
        return getattr(self._service, name)


@pytest.fixture
def cl(tmp_path: Path) -> Iterator[httpx.Client]:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    app = create_app(c, tokens=TokenTable([(TOK, "ops", "admin")]), proxy=False)
    add_batch_routes(app, _ServedQueue(c, tmp_path / "jobs.db"))  # type: ignore[arg-type]
    with running(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=20) as client:
        yield client


def _jobs(cl: httpx.Client) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = cl.get("/v1/batch/jobs").json()["jobs"]
    return jobs


def test_bodies_the_bounded_decoder_refuses_are_400_and_store_nothing(cl: httpx.Client) -> None:
    deep = b"[" * 5000 + b"]" * 5000
    surrogate = b'{"id": "\\ud800", "command": ["true"], "vram_mib": 1}'
    r = cl.post("/v1/batch/jobs", content=deep)
    assert r.status_code == 400 and "nested deeper than" in r.json()["error"], r.text
    r = cl.post("/v1/batch/jobs", content=surrogate)
    assert r.status_code == 400 and r.json()["field"] == "id" and "surrogate" in r.json()["error"], r.text
    r = cl.post("/v1/batch/jobs", content=b"{")
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"], r.text
    assert _jobs(cl) == []


@pytest.mark.parametrize("job_id", ["eval/run-1", "nightly?x=1#2", "50% done", "a%2Fb"])
def test_every_accepted_id_can_be_read_and_cancelled_over_http_and_the_cli(
    cl: httpx.Client, job_id: str
) -> None:
    """A ``/`` in an id made its job unreachable (404 from the router for GET and DELETE); the CLI
    put the id into the URL as it was, so ``?``, ``#`` and ``%`` named another path."""
    quoted = urllib.parse.quote(job_id, safe="")
    r = cl.post("/v1/batch/jobs", json={"id": job_id, "command": JOB, "vram_mib": 1024})
    assert r.status_code == 201, r.text
    r = cl.get(f"/v1/batch/jobs/{quoted}")
    assert r.status_code == 200 and r.json()["id"] == job_id, r.text
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "batch", "cancel", "--url", str(cl.base_url),
         "--token", TOK, job_id],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == f"{job_id} cancelled", out.stderr
    assert [(j["id"], j["state"]) for j in _jobs(cl)] == [(job_id, "cancelled")]
    r = cl.delete(f"/v1/batch/jobs/{quoted}")
    assert r.status_code == 409 and r.json()["code"] == "job_ended", r.text


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("deadline_s", 10**400, "finite Unix seconds"),  # an integer no float holds: 422, never a 500
        ("deadline_s", -(10**400), "finite Unix seconds"),
        ("id", "nightly\x00run", "NUL"),  # a job the runner could never start (its id is in its env)
    ],
    ids=["huge-deadline", "huge-negative-deadline", "nul-in-id"],
)
def test_a_field_no_job_could_run_with_is_422_naming_it_and_stores_nothing(
    cl: httpx.Client, field: str, value: object, why: str
) -> None:
    body = {"command": JOB, "vram_mib": 1024, field: value}
    r = cl.post("/v1/batch/jobs", content=json.dumps(body))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and why in r.json()["error"], r.text
    assert _jobs(cl) == []


def test_a_damaged_job_row_is_503_naming_the_file_and_the_row(cl: httpx.Client, tmp_path: Path) -> None:
    import sqlite3

    r = cl.post("/v1/batch/jobs", content=json.dumps({"id": "q1", "command": JOB, "vram_mib": 10**6}))
    assert r.status_code == 201, r.text
    with sqlite3.connect(tmp_path / "jobs.db") as db:  # (damage on disk, or a hand edit)
        db.execute("UPDATE batch_jobs SET spec = '{broken' WHERE id = 'q1'")
    for r in (cl.get("/v1/batch/jobs"), cl.get("/v1/batch/jobs/q1"), cl.delete("/v1/batch/jobs/q1")):
        assert r.status_code == 503 and r.json()["code"] == "store_damaged", r.text
        assert "jobs.db" in r.json()["error"] and "'q1'" in r.json()["error"], r.text


async def _until(pred: Any, what: str) -> None:
    """Await ``pred`` while the loop (the server's too) runs; a liveness bound, not a timing check."""
    for _ in range(1500):
        if pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached: {what}")


async def _cancel_a_job_that_ignores_sigterm(tmp_path: Path) -> None:
    from gpupool.adapters.pause.procfs import proc_state
    from gpupool.cli.serving import free_port, uvicorn_server
    from tests.adapters.batch.test_local_runner import stubborn

    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    app = create_app(c, tokens=TokenTable([(TOK, "ops", "admin")]), proxy=False)
    queue = BatchJobQueue(tmp_path / "jobs.db")
    runner = BatchRunner(queue, ControllerLeases(c), LocalExecutor(), stop_grace_s=60.0)
    service = BatchService(queue, runner, now=time.time)
    add_batch_routes(app, service)
    port = free_port()
    server = uvicorn_server(app, host="127.0.0.1", port=port)
    serving = asyncio.create_task(server.serve())
    spec, ready, term, go = stubborn("s", tmp_path, vram=1024)
    try:
        await _until(lambda: server.started, "the server serves")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=120) as cl:
            body = {"id": "s", "command": list(spec.command), "vram_mib": 1024}
            assert (await cl.post("/v1/batch/jobs", json=body)).status_code == 201
            service.step()  # (on the loop, as the gateway's tidal loop does)
            pid = runner.running["s"].handle.pid  # type: ignore[attr-defined]
            lease_id = service.job("s")["lease_id"]
            await _until(ready.exists, "the job runs")
            cancel = asyncio.create_task(cl.delete("/v1/batch/jobs/s"))
            await _until(term.exists, "the job got SIGTERM")  # the stop is in progress ...
            r = await cl.get("/v1/batch/jobs/s")  # ... and another request is answered meanwhile
            assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
            assert proc_state(pid) not in (None, "Z"), "answered only once the job's process was gone"
            assert not cancel.done()  # the cancel answers once the process is gone ...
            assert (await cl.get(f"/v1/leases/{lease_id}")).json()["state"] == "active"  # ... lease held
            go.touch()
            r = await cancel
            assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
            assert proc_state(pid) in (None, "Z")
            assert (await cl.get(f"/v1/leases/{lease_id}")).json()["state"] == "released"
    finally:
        go.touch()
        server.should_exit = True
        await serving
        service.close()


def test_other_requests_are_answered_while_a_cancelled_job_that_ignores_sigterm_stops(tmp_path: Path) -> None:
    """Cancelling a job whose process ignores SIGTERM held the gateway's event loop for the whole
    grace period (the stop waited for the process on the loop): every other request waited too."""
    asyncio.run(_cancel_a_job_that_ignores_sigterm(tmp_path))


def test_an_empty_state_filter_on_the_cli_is_refused_not_ignored(cl: httpx.Client) -> None:
    """``gpupool batch list --state ''`` listed every job (the empty value was dropped as if not
    given); it is now the server's 422 naming ``state``, exit 2 with one line."""
    r = cl.post("/v1/batch/jobs", json={"id": "j", "command": JOB, "vram_mib": 1024})
    assert r.status_code == 201, r.text
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "batch", "list", "--url", str(cl.base_url),
         "--token", TOK, "--state", ""],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == "", out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and 'invalid state=""' in out.stderr, out.stderr
