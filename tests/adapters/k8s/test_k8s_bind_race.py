"""Binds of one pod in flight at once (kube-scheduler retries), over real HTTP, against the fake API.

Whatever the interleaving and whatever the API answers, a pod ends with exactly one lease, on the
node it is bound to, and with none when it is not bound.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod
from tests.adapters.k8s.k8s_helpers import Client, make_pool, wait_until

from gpupool.adapters.k8s.annotations import decode_placement
from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.kubeapi import KubeApi

PLACEMENT = "gpupool.io/placement"


def _bind_args(pod: dict[str, Any], node: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def _bind_in_thread(
    server: ExtenderServer, args: dict[str, Any], out: list[dict[str, Any]]
) -> threading.Thread:
    def run() -> None:
        client = Client(server)
        try:
            out.append(client.post("bind", args))
        finally:
            client.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _leases_of(ext: Extender, uid: str) -> list[Any]:
    return [lease for lease in ext.pool.allocator.leases if lease.request.id == uid and not lease.state.ended]


def _assert_one_lease_where_bound(ext: Extender, api: FakeApiServer, pod: dict[str, Any]) -> str:
    """The pod's lease state equals its binding; returns the node it is bound to ("" if unbound)."""
    meta = pod["metadata"]
    now = api.pod(meta["namespace"], meta["name"])
    bound = now["spec"].get("nodeName") or ""
    leases = _leases_of(ext, meta["uid"])
    if bound:
        assert [lease.node for lease in leases] == [bound], (bound, leases)
        assert ext.pool.lease_of(meta["uid"]) == leases[0]
        placement = decode_placement(now["metadata"]["annotations"][PLACEMENT])
        assert placement.lease_id == leases[0].id and placement.node == bound
    else:
        assert leases == [], leases
        assert ext.pool.lease_of(meta["uid"]) is None
    ext.pool.check()
    return bound


def test_a_retry_to_another_node_while_the_first_bind_is_in_flight(
    extender: Any, fake_api: FakeApiServer
) -> None:
    """The defect: the retry released the first bind's lease, then its own after a 409, and the
    first bind succeeded: the pod ran on gpu-a with no lease and its card was given away again."""
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    ext, server, client = extender
    pod = fake_api.add_pod(make_pod("dup", vram_mib=40000, compute_pct=60))
    assert client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a", "gpu-c"]})["Error"] == ""
    fake_api.binding_gate.clear()
    first: list[dict[str, Any]] = []
    second: list[dict[str, Any]] = []
    t1 = _bind_in_thread(server, _bind_args(pod, "gpu-a"), first)
    with fake_api.lock:
        fake_api.lock.wait_for(lambda: fake_api.binding_arrivals >= 1, timeout=30)
    t2 = _bind_in_thread(server, _bind_args(pod, "gpu-c"), second)
    # the retry either reaches the API too or waits behind the first bind in the extender
    wait_until(
        lambda: fake_api.binding_arrivals >= 2 or ext.state().get("binds_in_flight", 0) >= 2,
        what="the second bind to be in flight",
    )
    fake_api.binding_gate.set()
    t1.join(30)
    t2.join(30)
    assert first == [{"Error": ""}]
    assert _assert_one_lease_where_bound(ext, fake_api, pod) == "gpu-a"
    assert "already bound to gpu-a" in second[0]["Error"]
    # the card really is held: what is left on gpu-a's cards is one free A100 and 40 % of the other
    big = fake_api.add_pod(make_pod("big", vram_mib=40000, compute_pct=50))
    out = client.post("filter", {"Pod": big, "Nodes": None, "NodeNames": ["gpu-a"]})
    assert out["NodeNames"] == ["gpu-a"]
    assert client.post("bind", _bind_args(big, "gpu-a")) == {"Error": ""}
    third = fake_api.add_pod(make_pod("third", vram_mib=1000, compute_pct=60))
    client.post("filter", {"Pod": third, "Nodes": None, "NodeNames": ["gpu-a"]})
    assert "no_capacity" in client.post("bind", _bind_args(third, "gpu-a"))["Error"]
    ext.pool.check()


def test_a_bind_whose_reply_is_lost_keeps_its_lease(extender: Any, fake_api: FakeApiServer) -> None:
    """The Binding was created but the API's reply was an error: the pod is bound, so is its lease."""
    ext, _, client = extender
    pod = fake_api.add_pod(make_pod("lost", vram_mib=2000, compute_pct=10))
    client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
    fake_api.binding_outcomes.append("lost")
    assert client.post("bind", _bind_args(pod, "gpu-a")) == {"Error": ""}
    assert _assert_one_lease_where_bound(ext, fake_api, pod) == "gpu-a"


def test_a_retry_to_the_same_node_after_success_calls_no_binding(
    extender: Any, fake_api: FakeApiServer
) -> None:
    ext, _, client = extender
    pod = fake_api.add_pod(make_pod("again", vram_mib=2000, compute_pct=10))
    client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
    assert client.post("bind", _bind_args(pod, "gpu-a")) == {"Error": ""}
    fake_api.binding_outcomes.append("fail")  # a retry that reached the API would fail
    assert client.post("bind", _bind_args(pod, "gpu-a")) == {"Error": ""}
    assert fake_api.binding_arrivals == 1
    assert _assert_one_lease_where_bound(ext, fake_api, pod) == "gpu-a"


# --------------------------------------------------------------------------- Hypothesis: interleavings


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[Extender, ExtenderServer, FakeApiServer]]:
    api = FakeApiServer().start()
    ext = Extender(make_pool(), api=KubeApi.for_host(api.url))
    server = ExtenderServer(ext).start()
    yield ext, server, api
    server.stop()
    api.stop()


_names = itertools.count()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    attempts=st.lists(
        st.tuples(st.sampled_from(["gpu-a", "gpu-b", "gpu-c"]), st.sampled_from(["ok", "fail", "lost"])),
        min_size=2,
        max_size=4,
    ),
    filtered=st.booleans(),
)
def test_concurrent_binds_of_one_pod_end_with_one_lease_where_it_is_bound(
    shared: tuple[Extender, ExtenderServer, FakeApiServer],
    attempts: list[tuple[str, str]],
    filtered: bool,
) -> None:
    ext, server, api = shared
    pod = api.add_pod(make_pod(f"race-{next(_names)}", vram_mib=1000, compute_pct=5))
    if filtered:  # else bind reads the pod from the API (an extender restarted between the verbs)
        client = Client(server)
        client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b", "gpu-c"]})
        client.close()
    with api.lock:
        api.binding_outcomes[:] = [outcome for _, outcome in attempts]
    start = threading.Barrier(len(attempts))
    answers: list[dict[str, Any]] = []

    def run(node: str) -> None:
        client = Client(server)
        start.wait()
        try:
            answers.append(client.post("bind", _bind_args(pod, node)))
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(node,), daemon=True) for node, _ in attempts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == len(attempts)
    bound = _assert_one_lease_where_bound(ext, api, pod)
    if bound:
        assert any(a == {"Error": ""} for a in answers)
    else:
        assert all(a["Error"] for a in answers)
    with api.lock:
        api.binding_outcomes.clear()
    ext.pool.release_pod(pod["metadata"]["uid"], reason="test done")
