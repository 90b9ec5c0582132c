"""`StandbyApp` in front of a real leader gateway, both over real HTTP on loopback.

Proves: a standby answers lease reads from its view with exactly the leader's JSON, auth and tenant
scope (a tenant never sees another's lease; a bad token gets the leader's own 401); every write is
forwarded and lands in the leader's ledger once (its answer passed through unchanged, status and
body); an id the view does not hold yet is forwarded (no false 404); a server-sent event stream is
forwarded as a stream; with no leader, a forwarding loop or the leader unreachable the answer is a
retryable 503 naming why; `LeaderOnly` answers 503 once the replica stops leading.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.standby import FORWARDED_BY, LeaderOnly, StandbyApp
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.adapters.store.etcd_server import free_port
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.errors import StoreUnreachable
from gpupool.core.model import Lease
from tests.adapters.http.servers import running

ADMIN, A, B = "standby-admin-token-01", "standby-tenant-a-0001", "standby-tenant-b-0001"
TOKENS = [(ADMIN, "ops", "admin"), (A, "a", "tenant"), (B, "b", "tenant")]


def h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class ControllerView:
    """A view that shows the leader's leases only once `sync` is called (a lagging watch)."""

    def __init__(self, c: LeaseController) -> None:
        self.c = c
        self.seen: dict[str, Lease] = {}

    def sync(self) -> None:
        self.seen = {x.id: x for x in self.c.leases()}

    def get(self, lease_id: str) -> Lease | None:
        return self.seen.get(lease_id)

    def leases(self, *, tenant: str | None = None) -> list[Lease]:
        return sorted(
            (x for x in self.seen.values() if tenant is None or x.request.tenant == tenant),
            key=lambda x: x.id,
        )

    def meta(self, key: str) -> str | None:
        return self.c.store.get_meta(key)


def leader() -> tuple[LeaseController, object]:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    return c, create_app(c, tokens=TokenTable(TOKENS), tick_s=0.05, agent_events=True)


def test_a_standby_reads_the_device_state_the_node_agent_reported_to_the_leader() -> None:
    c, app = leader()
    view = ControllerView(c)
    with running(app) as lead:
        standby = StandbyApp(
            view=view, tokens=TokenTable(TOKENS), leader_url=lambda: lead, self_url="http://x:1"
        )
        with running(standby) as sb:
            r = httpx.post(
                f"{lead}/v1/leases", headers=h(A), json={"vram_mib": 1024, "ttl_s": 600}, timeout=10
            )
            lid, node, gpu = r.json()["id"], r.json()["node"], r.json()["grants"][0]["gpu_id"]
            view.sync()

            def report(state: str) -> None:
                body = {"workloads": [{"lease_id": lid, "gpu_id": gpu, "state": state}]}
                ok = httpx.post(f"{lead}/v1/nodes/{node}/events", headers=h(ADMIN), json=body, timeout=10)
                assert ok.status_code == 200, ok.text

            for state in ("granted-pending-free", "free-failed", "usable"):
                report(state)
                answered = standby.answered
                mine = httpx.get(f"{sb}/v1/leases/{lid}", headers=h(A), timeout=10).json()
                theirs = httpx.get(f"{lead}/v1/leases/{lid}", headers=h(A), timeout=10).json()
                assert standby.answered == answered + 1  # (from the view, not forwarded)
                assert mine["device_state"] == theirs["device_state"] == state
                listed = httpx.get(f"{sb}/v1/leases", headers=h(A), timeout=10).json()["leases"]
                assert [x["device_state"] for x in listed] == [state]


def test_reads_come_from_the_view_with_the_leaders_json_and_writes_are_forwarded_once() -> None:
    c, app = leader()
    view = ControllerView(c)
    with running(app) as lead:
        standby = StandbyApp(
            view=view, tokens=TokenTable(TOKENS), leader_url=lambda: lead, self_url="http://x:1"
        )
        with running(standby) as sb:
            r = httpx.post(f"{sb}/v1/leases", headers=h(A), json={"vram_mib": 1024, "ttl_s": 600}, timeout=10)
            assert r.status_code == 201, r.text
            assert r.headers["x-gpupool-role"] == "standby"
            lid = r.json()["id"]
            assert [x.id for x in c.leases()] == [lid]  # landed once, in the leader's ledger
            # not in the view yet: forwarded, answered by the leader (no false 404)
            got = httpx.get(f"{sb}/v1/leases/{lid}", headers=h(A), timeout=10)
            assert got.status_code == 200 and got.json()["id"] == lid
            view.sync()
            before = standby.answered
            for path in (f"/v1/leases/{lid}", "/v1/leases"):
                mine = httpx.get(f"{sb}{path}", headers=h(A), timeout=10)
                theirs = httpx.get(f"{lead}{path}", headers=h(A), timeout=10)
                assert mine.status_code == theirs.status_code == 200
                assert mine.json() == theirs.json()
            assert standby.answered == before + 2  # (answered from the view, not forwarded)
            # tenant scope: b neither lists nor reads a's lease (the leader's own 404 for the id)
            assert httpx.get(f"{sb}/v1/leases", headers=h(B), timeout=10).json() == {"leases": []}
            other = httpx.get(f"{sb}/v1/leases/{lid}", headers=h(B), timeout=10)
            assert other.status_code == 404
            assert other.json() == httpx.get(f"{lead}/v1/leases/{lid}", headers=h(B), timeout=10).json()
            bad = httpx.get(f"{sb}/v1/leases", headers=h("nope"), timeout=10)
            assert (
                bad.status_code == 401
                and bad.json() == httpx.get(f"{lead}/v1/leases", headers=h("nope")).json()
            )
            # a release through the standby ends the lease in the leader's ledger
            d = httpx.delete(f"{sb}/v1/leases/{lid}", headers=h(A), timeout=10)
            assert d.status_code == 200 and d.json()["state"] == "released"
            assert c.get(lid).state.value == "released"
            m = httpx.get(f"{sb}/metrics", timeout=10)  # its own series, not the leader's ledger
            assert m.status_code == 200 and "gpupool_ha_standby 1" in m.text
            assert f"gpupool_ha_answered_total {standby.answered}\n" in m.text and standby.answered == 3
            assert f"gpupool_ha_forwarded_total {standby.forwarded}\n" in m.text and standby.forwarded >= 4
            assert "gpupool_leases" not in m.text
            # a bad body: the leader's 4xx comes back unchanged
            e = httpx.post(f"{sb}/v1/leases", headers=h(A), json={"vram_mib": -1}, timeout=10)
            assert e.status_code == 422 and "vram_mib" in e.text


def test_an_event_stream_is_forwarded_as_a_stream() -> None:
    c, app = leader()
    with running(app) as lead:
        standby = StandbyApp(
            view=ControllerView(c), tokens=TokenTable(TOKENS), leader_url=lambda: lead, self_url="http://x:1"
        )
        with running(standby) as sb, httpx.stream("GET", f"{sb}/v1/events", headers=h(A)) as stream:
            assert stream.status_code == 200
            body = {"vram_mib": 512, "ttl_s": 60}
            r = httpx.post(f"{sb}/v1/leases", headers=h(A), json=body, timeout=10)
            assert r.status_code == 201
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    assert event["kind"] == "granted" and event["lease"]["id"] == r.json()["id"]
                    break


def test_no_leader_a_loop_or_an_unreachable_leader_is_a_retryable_503() -> None:
    c, _ = leader()
    target: list[str | None] = [None]
    standby = StandbyApp(
        view=ControllerView(c),
        tokens=TokenTable(TOKENS),
        leader_url=lambda: target[0],
        self_url="http://me:1",
    )
    with running(standby) as sb:
        body = {"vram_mib": 512, "ttl_s": 60}
        r = httpx.post(f"{sb}/v1/leases", headers=h(A), json=body, timeout=10)
        assert r.status_code == 503 and r.json()["code"] == "no_leader" and r.headers["retry-after"] == "1"
        assert httpx.get(f"{sb}/healthz", timeout=10).json() == {"ok": True, "role": "standby", "leader": ""}
        target[0] = "http://me:1"  # the leader key names this very replica (it is still starting)
        assert (
            httpx.post(f"{sb}/v1/leases", headers=h(A), json=body, timeout=10).json()["code"] == "no_leader"
        )
        target[0] = f"http://127.0.0.1:{free_port()}"  # nobody listens there
        r = httpx.post(f"{sb}/v1/leases", headers=h(A), json=body, timeout=10)
        assert r.status_code == 503 and r.json()["code"] == "leader_unreachable", r.text
        looped = httpx.post(f"{sb}/v1/leases", headers={**h(A), FORWARDED_BY: "http://other:1"}, json=body)
        assert looped.status_code == 503 and looped.json()["code"] == "no_leader"
    assert c.leases() == []


def test_a_forward_to_a_leader_that_hangs_ends_with_503_when_the_leader_changes() -> None:
    c, _ = leader()
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts connections (the kernel does), never answers: a paused leader
    lead = f"http://127.0.0.1:{hung.getsockname()[1]}"
    standby = StandbyApp(
        view=ControllerView(c), tokens=TokenTable(TOKENS), leader_url=lambda: lead, self_url="http://me:1"
    )
    got: list[httpx.Response] = []
    with running(standby) as sb:
        body = {"vram_mib": 512, "ttl_s": 60}
        t = threading.Thread(
            target=lambda: got.append(httpx.post(f"{sb}/v1/leases", headers=h(A), json=body, timeout=30))
        )
        t.start()
        hung.settimeout(10)
        conn, _ = hung.accept()  # the forward reached the leader, which says nothing
        standby.leader_changed()
        t.join(30)
    conn.close()
    hung.close()
    assert got and got[0].status_code == 503, got
    assert got[0].json()["code"] == "leader_unreachable" and "leader changed" in got[0].json()["error"]


def test_leader_only_answers_503_once_the_replica_stops_leading() -> None:
    c, app = leader()
    leading = [True]
    guarded = LeaderOnly(app, lambda: leading[0])
    with running(guarded) as url:
        body = {"vram_mib": 512, "ttl_s": 60}
        assert httpx.post(f"{url}/v1/leases", headers=h(A), json=body, timeout=10).status_code == 201
        leading[0] = False
        r = httpx.post(f"{url}/v1/leases", headers=h(A), json=body, timeout=10)
        assert r.status_code == 503 and r.json()["code"] == "no_leader"
        assert httpx.get(f"{url}/v1/leases", headers=h(A), timeout=10).status_code == 503
    assert len(c.leases()) == 1


class Refusing(MemoryLeaseStore):
    """A store that stops taking writes, as etcd does for a replica that no longer leads."""

    refuse = False

    def apply(self, writes: Any) -> None:
        if self.refuse:
            raise StoreUnreachable("the leader key changed: the write was not applied")
        super().apply(writes)


def test_a_write_refused_inside_a_request_is_a_retryable_503_and_is_undone() -> None:
    store = Refusing()
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    app = create_app(c, tokens=TokenTable(TOKENS), tick_s=0.05)
    with running(app) as url:
        body = {"vram_mib": 81920, "ttl_s": 600, "gpu_id": "gpu-c/0"}
        first = httpx.post(f"{url}/v1/leases", headers=h(A), json=body, timeout=10)
        assert first.status_code == 201, first.text
        wait = {**body, "queue_timeout_s": 60}
        queued = httpx.post(f"{url}/v1/leases", headers=h(A), json=wait, timeout=10)
        assert queued.status_code == 202, queued.text
        store.refuse = True
        # the release frees the GPU, the queue grants the ticket, and that write is refused at once
        r = httpx.delete(f"{url}/v1/leases/{first.json()['id']}", headers=h(A), timeout=10)
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text
        assert r.headers["retry-after"] == "1"
    assert c.get(first.json()["id"]).state.value == "active"  # undone: as durable, nothing granted
    assert [x.id for x in c.leases()] == [first.json()["id"]]
