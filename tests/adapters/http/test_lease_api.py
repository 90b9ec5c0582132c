"""Lease API over real HTTP: statuses, auth and tenant isolation, queueing, events, admin routes."""

from __future__ import annotations

import json
import threading
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

ADMIN, A, B = "admin-token-0001", "tenant-a-token-1", "tenant-b-token-2"


def h(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[tuple[str, LeaseController]]:
    import time

    store = SqliteLeaseStore(tmp_path / "l.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (A, "a", "tenant"), (B, "b", "tenant")])
    with running(create_app(c, tokens=tokens, tick_s=0.05, agent_events=True)) as url:
        yield url, c
    store.close()


def test_acquire_get_renew_release_and_idempotent_delete(gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    with httpx.Client(base_url=url, headers=h(A)) as cl:
        r = cl.post(
            "/v1/leases", json={"priority": "P1", "vram_mib": 4096, "compute_pct": 10, "kinds": ["mig"]}
        )
        assert r.status_code == 201, r.text
        lease = r.json()
        assert (
            lease["slice_id"].startswith("gpu-a/0/mig")
            and lease["gpu_id"] == "gpu-a/0"
            and lease["tenant"] == "a"
        )
        assert cl.get(f"/v1/leases/{lease['id']}").json()["id"] == lease["id"]
        assert [x["id"] for x in cl.get("/v1/leases").json()["leases"]] == [lease["id"]]
        rn = cl.post(f"/v1/leases/{lease['id']}/renew", json={"ttl_s": 120})
        assert rn.status_code == 200 and rn.json()["revision"] == 2
        d1, d2 = cl.delete(f"/v1/leases/{lease['id']}"), cl.delete(f"/v1/leases/{lease['id']}")
        assert d1.status_code == d2.status_code == 200 and d2.json()["state"] == "released"
        assert cl.post(f"/v1/leases/{lease['id']}/renew").status_code == 409
    stored = c.store.get(lease["id"])
    assert stored is not None and stored.state.value == "released"


def test_statuses_for_bad_input_unresolvable_and_auth(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    with httpx.Client(base_url=url) as cl:
        assert cl.get("/healthz").status_code == 200
        assert cl.get("/v1/pool").status_code == 401
        assert cl.get("/v1/pool", headers=h("wrong-token-xyz")).status_code == 401
        r = cl.post("/v1/leases", headers=h(A), json={"vram_mib": -5})
        assert r.status_code == 422 and r.json()["field"] == "vram_mib"
        r = cl.post("/v1/leases", headers=h(A), json={"vram_mib": 5, "bogus": 1})
        assert r.status_code == 422 and r.json()["field"] == "bogus"
        r = cl.post("/v1/leases", headers=h(A), json={"vram_mib": 5, "priority": "urgent"})
        assert r.status_code == 422 and r.json()["field"] == "priority"
        r = cl.post("/v1/leases", headers={**h(A), "content-type": "application/json"}, content=b"{nope")
        assert r.status_code == 400 and r.json()["field"] == "body", r.text
        assert "line 1 column 2" in r.json()["error"], r.text
        r = cl.post("/v1/leases", headers=h(A), json={"vram_mib": 50_000, "kinds": ["mig"]})
        assert r.status_code == 503 and r.json()["code"] == "unresolvable"
        r = cl.post("/v1/leases", headers=h(A), json={"priority": "P0"})
        assert r.status_code == 422 and r.json()["field"] == "vram_mib"
        assert cl.put("/v1/admin/watermarks", headers=h(A), json={}).status_code == 403
        assert cl.patch("/v1/admin/watermarks", headers=h(ADMIN), json={"vram_high": 0.9}).status_code == 200
        assert "/v1/leases" in cl.get("/openapi.json").json()["paths"]


def test_tenant_isolation(gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    with httpx.Client(base_url=url) as cl:
        lid = cl.post("/v1/leases", headers=h(A), json={"vram_mib": 1024}).json()["id"]
        assert cl.get(f"/v1/leases/{lid}", headers=h(B)).status_code == 404
        assert cl.post(f"/v1/leases/{lid}/renew", headers=h(B)).status_code == 404
        assert cl.delete(f"/v1/leases/{lid}", headers=h(B)).status_code == 404
        assert cl.get("/v1/leases", headers=h(B)).json()["leases"] == []
        assert cl.get(f"/v1/leases/{lid}", headers=h(ADMIN)).status_code == 200
    assert c.get(lid).state.value == "active"


def test_queue_ticket_long_poll_and_events(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    events: list[dict[str, object]] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx.Client(base_url=url, timeout=10) as cl, cl.stream("GET", "/v1/events", headers=h(A)) as r:
            ready.set()
            kind = ""
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    events.append({"kind": kind, **json.loads(line[6:])})
                    if len(events) >= 3:
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert ready.wait(5)
    with httpx.Client(base_url=url, headers=h(A), timeout=10) as cl:
        big = cl.post("/v1/leases", json={"priority": "P1", "vram_mib": 40 * 1024, "kinds": ["mig"]})
        assert big.status_code == 201
        q = cl.post("/v1/leases", json={"priority": "P1", "vram_mib": 40 * 1024, "kinds": ["mig"]})
        assert q.status_code == 202 and q.headers["location"].startswith("/v1/tickets/")
        ticket = q.json()["ticket"]
        assert cl.get(f"/v1/tickets/{ticket}", headers=h(B)).status_code == 404
        cl.delete(f"/v1/leases/{big.json()['id']}")
        st = cl.get(f"/v1/tickets/{ticket}", params={"wait_s": 5}).json()
        assert st["state"] == "granted" and st["lease"]["slice_id"] == big.json()["slice_id"]
    t.join(5)
    kinds = [e["kind"] for e in events]
    assert kinds[:1] == ["granted"] and "released" in kinds


def test_p0_preempts_and_pool_view(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    with httpx.Client(base_url=url, headers=h(A)) as cl:
        p2 = cl.post("/v1/leases", json={"priority": "P2", "vram_mib": 40 * 1024, "kinds": ["mig"]}).json()
        p0 = cl.post("/v1/leases", json={"priority": "P0", "vram_mib": 40 * 1024, "kinds": ["mig"]})
        assert p0.status_code == 201 and p0.json()["victims"] == [p2["id"]]
        assert cl.get(f"/v1/leases/{p2['id']}").json()["state"] == "preempted"
        pool = cl.get("/v1/pool").json()
        assert {n["node"] for n in pool["nodes"]} == {"gpu-a", "gpu-b", "gpu-c"}
        assert pool["granted"]["vram_mib"] == 40 * 1024


def test_agent_events_revoke_and_lease_labels(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    with httpx.Client(base_url=url) as cl:
        lease = cl.post(
            "/v1/leases",
            headers=h(A),
            json={"priority": "P2", "vram_mib": 1024, "labels": {"pauser": "signal"}},
        ).json()
        assert lease["labels"] == {"pauser": "signal"}
        body = {
            "resync": False,
            "dropped_events": 0,
            "workloads": [{"lease_id": lease["id"], "gpu_id": lease["gpu_id"], "state": "paused"}],
            "events": [
                {"seq": 1, "kind": "paused", "at_s": 1.0, "gpu_id": lease["gpu_id"], "lease_id": lease["id"]},
                {
                    "seq": 2,
                    "kind": "revoke",
                    "at_s": 2.0,
                    "gpu_id": lease["gpu_id"],
                    "lease_id": lease["id"],
                    "reason": "VRAM not freed in 2 s",
                    "pauser": "signal",
                    "frees": "compute",
                    "latency_ms": 3.5,
                },
            ],
        }
        assert cl.post(f"/v1/nodes/{lease['node']}/events", headers=h(A), json=body).status_code == 403
        other = "gpu-c" if lease["node"] != "gpu-c" else "gpu-a"
        r = cl.post(f"/v1/nodes/{other}/events", headers=h(ADMIN), json=body)
        assert r.status_code == 200 and r.json()["revoked"] == []  # not that node's lease
        r = cl.post(f"/v1/nodes/{lease['node']}/events", headers=h(ADMIN), json=body)
        assert r.status_code == 200 and r.json() == {"accepted": 2, "revoked": [lease["id"]]}
        assert cl.get(f"/v1/leases/{lease['id']}", headers=h(A)).json()["state"] == "revoked"
        bad = {**body, "events": [{"seq": -1, "kind": "revoke"}]}
        assert cl.post(f"/v1/nodes/{lease['node']}/events", headers=h(ADMIN), json=bad).status_code == 422


def test_marking_a_slice_of_a_drained_gpu_healthy_is_409_and_the_gpu_stays_closed(
    gw: tuple[str, LeaseController],
) -> None:
    url, c = gw
    with httpx.Client(base_url=url, headers=h(ADMIN)) as cl:
        assert cl.post("/v1/admin/gpus/gpu-c/0/drain", json={}).status_code == 200
        r = cl.post("/v1/admin/slices/gpu-c/0/health", json={"healthy": True})
        assert r.status_code == 409 and r.json()["code"] == "gpu_drained", r.text
        assert "gpu-c/0" in r.json()["error"] and "undo" in r.json()["error"]
        assert not c.allocator.ledger.is_healthy("gpu-c/0")  # nothing changed
        aimed = {"vram_mib": 1024, "gpu_id": "gpu-c/0"}
        r = cl.post("/v1/leases", json=aimed)
        assert r.status_code == 503 and r.json()["code"] == "unresolvable", r.text
        assert cl.post("/v1/admin/gpus/gpu-c/0/drain", json={"undo": True}).status_code == 200
        assert cl.post("/v1/leases", json=aimed).status_code == 201


def test_each_granted_request_gets_its_own_uuid4_id(gw: tuple[str, LeaseController]) -> None:
    """The core request behind a lease (stored with it) has a fresh UUID version 4 as its id, in
    the canonical text form."""
    import uuid

    url, c = gw
    with httpx.Client(base_url=url, headers=h(A)) as cl:
        body = {"priority": "P1", "vram_mib": 1024}
        ids = [cl.post("/v1/leases", json=body).json()["id"] for _ in range(8)]
    request_ids = [c.get(i).request.id for i in ids]
    assert len(set(request_ids)) == len(request_ids)
    for rid in request_ids:
        assert str(uuid.UUID(rid)) == rid and uuid.UUID(rid).version == 4
        stored = c.store.get(ids[request_ids.index(rid)])
        assert stored is not None and stored.request.id == rid
