"""Tickets over real HTTP on a real SQLite store: unresolvable requests are 503 and never queue,
DELETE of a granted ticket is 409 naming its lease (which stays active), and tickets survive a
restart of the gateway (queued ones wait on with their deadline, granted ones point at the lease)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running

A, B = "tenant-a-token-1", "tenant-b-token-2"
MIG40 = {"priority": "P1", "vram_mib": 40 * 1024, "kinds": ["mig"]}


def h(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@contextlib.contextmanager
def gateway(db: Path) -> Iterator[tuple[httpx.Client, LeaseController]]:
    """A gateway process in miniature: open the store, recover, serve; close it all on exit."""
    store = SqliteLeaseStore(db)
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(A, "a", "tenant"), (B, "b", "tenant")])
    try:
        with (
            running(create_app(c, tokens=tokens, tick_s=0.05)) as url,
            httpx.Client(base_url=url, timeout=10) as cl,
        ):
            yield cl, c
    finally:
        store.close()


def test_unresolvable_request_is_503_on_an_empty_queue_and_never_queues(tmp_path: Path) -> None:
    with gateway(tmp_path / "l.db") as (cl, c):
        bad = {"vram_mib": 100, "nodes": ["gpu-a"], "kinds": ["mps"], "queue_timeout_s": 3600}  # MIG only
        r = cl.post("/v1/leases", json=bad, headers=h(A))
        assert r.status_code == 503 and r.json()["code"] == "unresolvable", r.text
        assert len(c.queue) == 0
        assert cl.post("/v1/leases", json={"vram_mib": 100}, headers=h(B)).status_code == 201


def test_delete_of_a_granted_ticket_is_409_naming_the_lease_which_stays_active(tmp_path: Path) -> None:
    with gateway(tmp_path / "l.db") as (cl, _):
        big = cl.post("/v1/leases", json=MIG40, headers=h(A)).json()
        q = cl.post("/v1/leases", json=MIG40, headers=h(B))
        assert q.status_code == 202
        ticket = q.json()["ticket"]
        cl.delete(f"/v1/leases/{big['id']}", headers=h(A))
        st = cl.get(f"/v1/tickets/{ticket}", params={"wait_s": 5}, headers=h(B)).json()
        assert st["state"] == "granted"
        lease_id = st["lease"]["id"]
        r = cl.delete(f"/v1/tickets/{ticket}", headers=h(B))
        assert (
            r.status_code == 409 and r.json()["code"] == "already_granted" and lease_id in r.json()["error"]
        )
        assert cl.get(f"/v1/leases/{lease_id}", headers=h(B)).json()["state"] == "active"
        assert cl.delete(f"/v1/tickets/{ticket}", headers=h(A)).status_code == 404  # not A's ticket


def test_tickets_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    with gateway(db) as (cl, _):
        first = cl.post("/v1/leases", json=MIG40, headers=h(A)).json()
        q1 = cl.post("/v1/leases", json=MIG40, headers=h(B)).json()  # granted before the restart
        cl.delete(f"/v1/leases/{first['id']}", headers=h(A))
        granted = cl.get(f"/v1/tickets/{q1['ticket']}", params={"wait_s": 5}, headers=h(B)).json()
        assert granted["state"] == "granted"
        q2 = cl.post("/v1/leases", json={**MIG40, "queue_timeout_s": 3600}, headers=h(A)).json()
        assert q2["state"] == "queued"
    with gateway(db) as (cl, c):
        g = cl.get(f"/v1/tickets/{q1['ticket']}", headers=h(B))
        assert g.status_code == 200 and g.json()["state"] == "granted"
        assert g.json()["lease"]["id"] == granted["lease"]["id"] and g.json()["lease"]["state"] == "active"
        w = cl.get(f"/v1/tickets/{q2['ticket']}", headers=h(A)).json()
        assert w["state"] == "queued" and w["deadline_at"] == q2["deadline_at"]
        assert w["enqueued_at"] == q2["enqueued_at"] and q2["ticket"] in c.queue
        cl.delete(f"/v1/leases/{granted['lease']['id']}", headers=h(B))
        done = cl.get(f"/v1/tickets/{q2['ticket']}", params={"wait_s": 5}, headers=h(A)).json()
        assert done["state"] == "granted" and done["lease"]["state"] == "active"


def test_a_client_that_hangs_up_while_its_acquire_waits_leaves_no_ticket_behind(tmp_path: Path) -> None:
    """``POST /v1/leases`` with ``wait_s``: the client gives up during the wait, so it never learns the
    ticket's id. The ticket stayed queued and was granted later, a lease nobody knew of holding the
    capacity until its TTL; the ticket is now cancelled when the client goes."""
    with gateway(tmp_path / "l.db") as (cl, c):
        big = cl.post("/v1/leases", json=MIG40, headers=h(A)).json()
        url = str(cl.base_url)
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(
                f"{url}/v1/leases",
                json={**MIG40, "wait_s": 5, "queue_timeout_s": 60},
                headers=h(B),
                timeout=0.3,
            )
        deadline = time.monotonic() + 5
        while len(c.queue) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(c.queue) == 0  # cancelled when the client went, not left to be granted
        cl.delete(f"/v1/leases/{big['id']}", headers=h(A))
        time.sleep(0.3)
        assert [x for x in c.leases() if x.request.tenant == "b"] == []


def test_an_acquire_whose_ticket_is_cancelled_during_its_wait_is_409_cancelled(tmp_path: Path) -> None:
    """It answered 202 with a ``poll`` URL, as if the ticket were still queued."""
    import threading

    with gateway(tmp_path / "l.db") as (cl, c):
        assert cl.post("/v1/leases", json=MIG40, headers=h(A)).status_code == 201
        got: list[httpx.Response] = []
        url = str(cl.base_url)
        body = {**MIG40, "wait_s": 20, "queue_timeout_s": 60}
        t = threading.Thread(
            target=lambda: got.append(httpx.post(f"{url}/v1/leases", json=body, headers=h(B), timeout=30))
        )
        t.start()
        deadline = time.monotonic() + 10
        while not len(c.queue) and time.monotonic() < deadline:
            time.sleep(0.02)
        (ticket,) = [x.ticket for x in c.queue]
        assert cl.delete(f"/v1/tickets/{ticket}", headers=h(B)).json()["state"] == "cancelled"
        t.join(30)
        assert got[0].status_code == 409 and got[0].json()["code"] == "cancelled", got[0].text
