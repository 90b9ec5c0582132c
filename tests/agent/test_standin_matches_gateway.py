"""The agent tests' stand-in gateway speaks the real gateway's protocol: same routes, same replies.

The same requests go to the stand-in (`tests/agent/standin_gateway.py`) and to the real app
(`gpupool.adapters.http.create_app` over the example pool, served on a free loopback port); each
reply must have the same status and the same keys, and leases / errors must validate against the
real response schemas. A change of the gateway's protocol (a renamed field, a new required one, a
moved route) fails here instead of leaving the agent tests green against a stale copy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.schemas import ErrorOut, LeaseOut
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running
from tests.agent.standin_gateway import ROUTES, StandinGateway, lease_out

ADMIN, TENANT = "agent-admin-token-01", "tenant-a-token-0001"
NODE, GPU = "gpu-c", "gpu-c/0"  # the example pool's whole H100 on node gpu-c


def _app(tmp_path: Path) -> tuple[Any, SqliteLeaseStore]:
    store = SqliteLeaseStore(tmp_path / "leases.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (TENANT, "a", "tenant")])
    return create_app(c, tokens=tokens, tick_s=0.05, agent_events=True), store


@pytest.fixture
def both(tmp_path: Path) -> Iterator[tuple[httpx.Client, httpx.Client, str]]:
    """(real gateway client, stand-in client, the real lease id held on GPU)."""
    app, store = _app(tmp_path)
    standin = StandinGateway(token=ADMIN)
    standin.start()
    try:
        with running(app) as url, httpx.Client(base_url=url, timeout=10) as real:
            r = real.post(
                "/v1/leases",
                headers={"Authorization": f"Bearer {TENANT}"},
                json={
                    "priority": "P2",
                    "vram_mib": 1024,
                    "compute_pct": 10,
                    "kinds": ["whole"],
                    "ttl_s": 600,
                },
            )
            assert r.status_code == 201, r.text
            lease = r.json()
            standin.leases = [
                lease_out(lease["id"], node=NODE, gpu_id=GPU, priority=lease["priority"], vram_mib=1024)
            ]
            with httpx.Client(base_url=standin.url, timeout=10) as fake:
                yield real, fake, lease["id"]
    finally:
        standin.stop()
        store.close()


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def test_every_standin_route_exists_in_the_real_app_with_its_method(tmp_path: Path) -> None:
    app, store = _app(tmp_path)
    try:
        served = {(m, r.path) for r in app.routes for m in getattr(r, "methods", ()) or ()}
    finally:
        store.close()
    assert served >= ROUTES, ROUTES - served


def _same(real: httpx.Response, fake: httpx.Response) -> tuple[dict[str, Any], dict[str, Any]]:
    assert real.status_code == fake.status_code, (real.text, fake.text)
    a, b = real.json(), fake.json()
    assert set(a) == set(b) or (set(b) <= set(a) and a.get("code") == b.get("code")), (a, b)
    return a, b


def test_replies_match_the_real_gateway(both: tuple[httpx.Client, httpx.Client, str]) -> None:
    real, fake, lease_id = both
    readings = {"gpus": [{"gpu_id": GPU, "vram_used_mib": 2048, "vram_total_mib": 81559}]}
    _same(real.post(f"/v1/nodes/{NODE}/readings", json=readings, headers=_admin()),
          fake.post(f"/v1/nodes/{NODE}/readings", json=readings, headers=_admin()))  # fmt: skip
    events = {"resync": True, "workloads": [{"lease_id": lease_id, "gpu_id": GPU, "state": "running"}],
              "events": [{"seq": 1, "kind": "paused", "gpu_id": GPU, "lease_id": lease_id}]}  # fmt: skip
    _same(real.post(f"/v1/nodes/{NODE}/events", json=events, headers=_admin()),
          fake.post(f"/v1/nodes/{NODE}/events", json=events, headers=_admin()))  # fmt: skip
    a, b = _same(real.get("/v1/leases", headers=_admin()), fake.get("/v1/leases", headers=_admin()))
    assert [x["id"] for x in a["leases"]] == [x["id"] for x in b["leases"]] == [lease_id]
    for x in (*a["leases"], *b["leases"]):
        assert set(x) == set(LeaseOut.model_fields)
        LeaseOut.model_validate(x)
    a, b = _same(real.delete(f"/v1/leases/{lease_id}", headers=_admin()),
                 fake.delete(f"/v1/leases/{lease_id}", headers=_admin()))  # fmt: skip
    assert a["state"] == b["state"] == "released"


def test_errors_match_the_real_gateway(both: tuple[httpx.Client, httpx.Client, str]) -> None:
    real, fake, _ = both
    bogus = {"gpus": [{"gpu_id": GPU, "vram_used_mib": 1, "vram_total_mib": 2, "bogus": 1}]}
    a, b = _same(real.post(f"/v1/nodes/{NODE}/readings", json=bogus, headers=_admin()),
                 fake.post(f"/v1/nodes/{NODE}/readings", json=bogus, headers=_admin()))  # fmt: skip
    assert a["field"] == b["field"] == "gpus.0.bogus"
    missing = {"gpus": [{"gpu_id": GPU, "vram_used_mib": 1}]}
    a, b = _same(real.post(f"/v1/nodes/{NODE}/readings", json=missing, headers=_admin()),
                 fake.post(f"/v1/nodes/{NODE}/readings", json=missing, headers=_admin()))  # fmt: skip
    assert a["field"] == b["field"] == "gpus.0.vram_total_mib"
    bad_event = {"events": [{"kind": "paused"}]}  # no seq
    a, b = _same(real.post(f"/v1/nodes/{NODE}/events", json=bad_event, headers=_admin()),
                 fake.post(f"/v1/nodes/{NODE}/events", json=bad_event, headers=_admin()))  # fmt: skip
    assert a["field"] == b["field"] == "events.0.seq"
    wrong = {"Authorization": "Bearer nope"}
    a, b = _same(real.get("/v1/leases", headers=wrong), fake.get("/v1/leases", headers=wrong))
    for body in (a, b):
        ErrorOut.model_validate(body)
    a, b = _same(real.delete("/v1/leases/no-such", headers=_admin()),
                 fake.delete("/v1/leases/no-such", headers=_admin()))  # fmt: skip
    assert a["code"] == b["code"] == "not_found"
