"""The lease API shows whether a grant is usable on the device yet: the node agent reports grants
whose memory it is still freeing (``granted-pending-free``) or could not free (``free-failed``) in
its workload list, and every lease view carries that as ``device_state`` (``usable`` otherwise)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running

ADMIN, A = "admin-token-0001", "tenant-a-token-1"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    store = SqliteLeaseStore(tmp_path / "l.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (A, "a", "tenant")])
    with running(create_app(c, tokens=tokens, tick_s=0.05, agent_events=True)) as u:
        yield u
    store.close()


def report(cl: httpx.Client, node: str, workloads: list[dict[str, str]]) -> None:
    body = {"workloads": workloads, "events": [{"seq": 1, "kind": "grant_pending_free", "lease_id": "x"}]}
    r = cl.post(f"/v1/nodes/{node}/events", headers={"Authorization": f"Bearer {ADMIN}"}, json=body)
    assert r.status_code == 200, r.text


def test_device_state_follows_the_agents_report(url: str) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {A}"}) as cl:
        lease = cl.post("/v1/leases", json={"priority": "P0", "vram_mib": 4096}).json()
        lid, node, gpu = lease["id"], lease["node"], lease["gpu_id"]
        assert lease["device_state"] == "usable"
        report(cl, node, [{"lease_id": lid, "gpu_id": gpu, "state": "granted-pending-free"}])
        assert cl.get(f"/v1/leases/{lid}").json()["device_state"] == "granted-pending-free"
        assert [x["device_state"] for x in cl.get("/v1/leases").json()["leases"]] == ["granted-pending-free"]
        report(cl, "some-other-node", [{"lease_id": lid, "gpu_id": gpu, "state": "free-failed"}])
        assert cl.get(f"/v1/leases/{lid}").json()["device_state"] == "granted-pending-free"  # not its node
        report(cl, node, [{"lease_id": lid, "gpu_id": gpu, "state": "free-failed"}])
        assert cl.get(f"/v1/leases/{lid}").json()["device_state"] == "free-failed"
        report(cl, node, [{"lease_id": "p2-job", "gpu_id": gpu, "state": "revoked"}])  # memory back
        assert cl.get(f"/v1/leases/{lid}").json()["device_state"] == "usable"
