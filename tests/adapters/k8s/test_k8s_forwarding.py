"""A standby's extender (`Forwarder` in an `ExtenderServer`) relaying kube-scheduler's calls to the
leader's extender, both real HTTP servers on loopback.

Proves: filter, prioritize, bind and ``<prefix>/state`` through the standby get exactly the leader's
answers (status and body), and a bind through the standby commits once in the leader's ledger (a
retried bind through it grants nothing more); ``/healthz`` is the standby's own; with no leader, the
leader being this very replica, a relayed call arriving at a standby (no loops) or the leader
unreachable, the answer is a retryable 503 with ``Retry-After`` and ``Error`` naming why; `use` swaps
the role on the same port, and an extender whose gate is closed (the leader lost its etcd lease)
answers 503; a retried scheduling cycle of a pod that holds a lease passes filter on that lease's
node and scores it 10 there, even when the node is full.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from tests.adapters.k8s.k8s_helpers import Client, fixture_json, make_pool

from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.forwarding import FORWARDED_BY, Forwarder
from gpupool.adapters.store.etcd_server import free_port

PREFIX = "/gpupool"


def call(
    port: int, verb: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        method = "GET" if body is None else "POST"
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, verb, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, json.loads(r.read()), r.headers
    finally:
        conn.close()


@pytest.fixture
def pair() -> Iterator[tuple[Extender, ExtenderServer, ExtenderServer, list[str | None]]]:
    leader_ext = Extender(make_pool())  # (no Kubernetes API: bind commits the lease only)
    leader = ExtenderServer(leader_ext, prefix=PREFIX).start()
    where: list[str | None] = [leader.url]
    standby = ExtenderServer(
        Forwarder(lambda: where[0], self_url=f"http://127.0.0.1:{free_port()}{PREFIX}"), prefix=PREFIX
    ).start()
    yield leader_ext, leader, standby, where
    standby.stop()
    leader.stop()


def test_the_verbs_through_a_standby_are_the_leaders_answers_and_bind_commits_once(pair: Any) -> None:
    ext, leader, standby, _ = pair
    args = fixture_json("filter_nodenames.json")
    via = call(standby.port, f"{PREFIX}/filter", args)
    assert via[:2] == call(leader.port, f"{PREFIX}/filter", args)[:2] and via[0] == 200
    passed = via[1]["NodeNames"]
    assert passed
    scores = call(standby.port, f"{PREFIX}/prioritize", {**args, "NodeNames": passed})
    assert scores[:2] == call(leader.port, f"{PREFIX}/prioritize", {**args, "NodeNames": passed})[:2]
    meta = args["Pod"]["metadata"]
    bind = {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": passed[0],
    }
    for _ in range(2):  # the second is a retry: the same lease, nothing granted twice
        status, out, _ = call(standby.port, f"{PREFIX}/bind", bind)
        assert (status, out) == (200, {"Error": ""})
    assert ext.pool.pod_uids() == [meta["uid"]]
    assert len([x for x in ext.pool.controller.leases() if x.state.value == "active"]) == 1
    assert call(standby.port, f"{PREFIX}/state")[:2] == call(leader.port, f"{PREFIX}/state")[:2]
    assert call(standby.port, "/healthz")[:2] == (200, {"status": "ok"})
    assert standby._server.extender.relayed >= 5


def test_calls_that_cannot_be_relayed_are_a_retryable_503(pair: Any) -> None:
    _, leader, standby, where = pair
    args = fixture_json("filter_nodenames.json")
    where[0] = None
    status, out, headers = call(standby.port, f"{PREFIX}/filter", args)
    assert status == 503 and headers["Retry-After"] == "1" and "no leader" in out["Error"]
    where[0] = standby._server.extender.self_url  # elected, not serving yet
    status, out, _ = call(standby.port, f"{PREFIX}/bind", fixture_json("bind.json"))
    assert status == 503 and "starting" in out["Error"]
    where[0] = f"http://127.0.0.1:{free_port()}{PREFIX}"  # nobody listens there
    status, out, _ = call(standby.port, f"{PREFIX}/prioritize", args)
    assert status == 503 and "cannot reach the leader" in out["Error"]
    where[0] = leader.url
    status, out, _ = call(standby.port, f"{PREFIX}/filter", args, {FORWARDED_BY: "http://other:1"})
    assert status == 503 and "forwarded to a standby" in out["Error"]  # (no relay loops)
    # the leader serves a relayed call; a leader whose gate closed answers 503
    assert call(leader.port, f"{PREFIX}/filter", args, {FORWARDED_BY: "http://other:1"})[0] == 200
    leader.use(leader._server.extender, gate=lambda: False)
    status, out, _ = call(leader.port, f"{PREFIX}/filter", args)
    assert status == 503 and "no longer leads" in out["Error"]
    assert call(leader.port, "/healthz")[0] == 200


def test_use_swaps_the_role_on_the_same_port(pair: Any) -> None:
    ext, _, standby, _ = pair
    args = fixture_json("filter_nodenames.json")
    standby.use(Extender(make_pool()))  # (a take-over: this replica serves from its own ledger now)
    client = Client(standby)
    try:
        out = client.post("filter", args)
        assert out["NodeNames"]
    finally:
        client.close()
    assert ext.pool.demand_of(args["Pod"]["metadata"]["uid"]) is None  # (not relayed to the old leader)


def test_a_retried_cycle_of_a_pod_holding_a_lease_passes_and_prefers_its_node(pair: Any) -> None:
    ext, leader, *_ = pair
    client = Client(leader)
    try:
        args = fixture_json("filter_nodenames.json")
        meta = args["Pod"]["metadata"]
        node = client.post("filter", args)["NodeNames"][-1]
        bind = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        assert client.post("bind", bind) == {"Error": ""}
        # fill every node so that nothing else fits a second copy of the pod
        pool = ext.pool
        for sid in sorted(pool.slices()):
            pool.set_healthy(sid, False)
        again = client.post("filter", args)
        assert again["NodeNames"] == [node] and node not in again["FailedNodes"]
        assert node not in again["FailedAndUnresolvableNodes"]
        scores = client.post("prioritize", {**args, "NodeNames": args["NodeNames"]})
        assert {s["Host"]: s["Score"] for s in scores}[node] == 10
        assert client.post("bind", bind) == {"Error": ""}
        assert len([x for x in pool.controller.leases() if x.state.value == "active"]) == 1
    finally:
        client.close()
