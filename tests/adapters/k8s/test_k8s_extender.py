"""The extender over real HTTP with requests shaped exactly as kube-scheduler sends them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod
from tests.adapters.k8s.k8s_helpers import Client, fixture_json

from gpupool.adapters.k8s.annotations import decode_placement
from gpupool.adapters.k8s.extender import Extender, ExtenderServer

NODES = ["gpu-a", "gpu-b", "gpu-c", "cpu-1"]


def _bind_args(pod: dict[str, Any], node: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def schedule(client: Client, api: FakeApiServer, pod: dict[str, Any], node: str) -> dict[str, Any]:
    api.add_pod(pod)
    out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": NODES})
    assert node in out["NodeNames"], out
    meta = pod["metadata"]
    return client.post(
        "bind",
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node},
    )


def test_filter_prioritize_preempt_bind_from_spec_fixtures(extender: Any, fake_api: FakeApiServer) -> None:
    ext, _, client = extender
    batch = make_pod(
        "batch-1", namespace="batch", vram_mib=8000, compute_pct=50, priority=-1, uid="victim-uid-1"
    )
    assert schedule(client, fake_api, batch, "gpu-b") == {"Error": ""}

    args = fixture_json("filter_nodenames.json")
    fake_api.add_pod(args["Pod"])
    out = client.post("filter", args)
    assert out["Error"] == ""
    assert out["Nodes"] is None
    assert out["NodeNames"] == ["gpu-a", "gpu-c"]
    assert set(out["FailedNodes"]) == {"gpu-b"}
    assert "20480 MiB and 30% compute" in out["FailedNodes"]["gpu-b"]
    assert set(out["FailedAndUnresolvableNodes"]) == {"cpu-1"}

    scores = client.post("prioritize", fixture_json("prioritize_nodenames.json"))
    assert scores == [{"Host": "gpu-a", "Score": 1}, {"Host": "gpu-c", "Score": 10}]

    victims = client.post("preempt", fixture_json("preempt_meta.json"))
    assert victims == {
        "NodeNameToMetaVictims": {"gpu-b": {"Pods": [{"UID": "victim-uid-1"}], "NumPDBViolations": 0}}
    }
    assert client.post("preempt", fixture_json("preempt_full.json")) == victims

    assert client.post("bind", fixture_json("bind.json")) == {"Error": ""}
    pod = fake_api.pod("team-x", "agent-7")
    assert pod["spec"]["nodeName"] == "gpu-a"
    placement = decode_placement(pod["metadata"]["annotations"]["gpupool.io/placement"])
    assert placement.node == "gpu-a" and placement.pod_uid == pod["metadata"]["uid"]
    assert placement.grants[0].vram_mib == 20480 and placement.grants[0].compute_milli == 300
    assert placement.grants[0].shared
    assert ext.pool.lease_of(pod["metadata"]["uid"]).id == placement.lease_id
    assert fake_api.bindings[-1]["metadata"]["uid"] == pod["metadata"]["uid"]
    ext.pool.check()


def test_filter_in_nodes_mode_returns_node_objects(extender: Any) -> None:
    _, _, client = extender
    out = client.post("filter", fixture_json("filter_nodes.json"))
    assert out["NodeNames"] is None
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-a", "gpu-b", "gpu-c"]
    assert out["Nodes"]["items"][0]["status"]["allocatable"]["cpu"] == "63"
    assert set(out["FailedAndUnresolvableNodes"]) == {"cpu-1"}
    scores = client.post("prioritize", fixture_json("filter_nodes.json"))
    assert [s["Host"] for s in scores] == ["gpu-a", "gpu-b", "gpu-c", "cpu-1"]
    assert scores[-1]["Score"] == 0 and all(1 <= s["Score"] <= 10 for s in scores[:3])


def test_filter_has_no_side_effects(extender: Any) -> None:
    ext, _, client = extender
    before = [st.free for st in ext.pool.allocator.states()]
    for _ in range(3):
        client.post("filter", fixture_json("filter_nodenames.json"))
        client.post("prioritize", fixture_json("prioritize_nodenames.json"))
    assert [st.free for st in ext.pool.allocator.states()] == before
    assert ext.pool.pod_uids() == []


def test_lost_race_returns_error_and_leaves_no_lease(extender: Any, fake_api: FakeApiServer) -> None:
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    ext, _, client = extender
    one = make_pod("one", vram_mib=40000, compute_pct=60)
    two = make_pod("two", vram_mib=40000, compute_pct=60)
    for p in (one, two):
        fake_api.add_pod(p)
        out = client.post("filter", {"Pod": p, "Nodes": None, "NodeNames": ["gpu-c"]})
        assert out["NodeNames"] == ["gpu-c"]
    assert client.post(
        "bind",
        {"PodName": "one", "PodNamespace": "default", "PodUID": one["metadata"]["uid"], "Node": "gpu-c"},
    ) == {"Error": ""}
    lost = client.post(
        "bind",
        {"PodName": "two", "PodNamespace": "default", "PodUID": two["metadata"]["uid"], "Node": "gpu-c"},
    )
    assert "no_capacity" in lost["Error"]
    assert ext.pool.lease_of(two["metadata"]["uid"]) is None
    assert "gpupool.io/placement" not in fake_api.pod("default", "two")["metadata"]["annotations"]
    assert not fake_api.pod("default", "two")["spec"].get("nodeName")


def test_failed_binding_rolls_back_lease_and_annotation(extender: Any, fake_api: FakeApiServer) -> None:
    ext, _, client = extender
    pod = make_pod("flaky", vram_mib=1000, compute_pct=10)
    fake_api.fail_bindings.add("flaky")
    out = schedule(client, fake_api, pod, "gpu-a")
    assert "500" in out["Error"]
    assert ext.pool.lease_of(pod["metadata"]["uid"]) is None
    assert "gpupool.io/placement" not in fake_api.pod("default", "flaky")["metadata"]["annotations"]
    fake_api.fail_bindings.clear()
    retry = client.post(
        "bind",
        {"PodName": "flaky", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "gpu-a"},
    )
    assert retry == {"Error": ""}
    ext.pool.check()


def test_bind_reads_the_pod_from_the_api_when_filter_was_not_seen(
    extender: Any, fake_api: FakeApiServer
) -> None:
    ext, _, client = extender
    pod = fake_api.add_pod(make_pod("restarted", vram_mib=2048, compute_pct=5))
    out = client.post(
        "bind",
        {
            "PodName": "restarted",
            "PodNamespace": "default",
            "PodUID": pod["metadata"]["uid"],
            "Node": "gpu-b",
        },
    )
    assert out == {"Error": ""}
    assert ext.pool.lease_of(pod["metadata"]["uid"]).node == "gpu-b"


def test_multi_gpu_pod_takes_whole_cards_of_one_node(extender: Any, fake_api: FakeApiServer) -> None:
    _, _, client = extender
    pod = make_pod("tp2", vram_mib=70000, gpus=2, priority=100)
    fake_api.add_pod(pod)
    out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": NODES})
    assert out["NodeNames"] == ["gpu-a"]
    assert set(out["FailedAndUnresolvableNodes"]) == {"gpu-b", "gpu-c", "cpu-1"}
    assert schedule(client, fake_api, pod, "gpu-a") == {"Error": ""}
    placement = decode_placement(
        fake_api.pod("default", "tp2")["metadata"]["annotations"]["gpupool.io/placement"]
    )
    assert sorted(g.slice_id for g in placement.grants) == ["gpu-a/0/whole", "gpu-a/1/whole"]
    assert not any(g.shared for g in placement.grants)


def test_pod_without_gpupool_resources_passes_every_node(extender: Any) -> None:
    _, _, client = extender
    pod = make_pod("web")
    out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": NODES})
    assert out["NodeNames"] == NODES and out["FailedNodes"] == {}


def test_busy_node_without_preemptible_work_is_unresolvable(extender: Any, fake_api: FakeApiServer) -> None:
    _, _, client = extender
    online = make_pod("online", vram_mib=20000, compute_pct=20, priority=50)
    assert schedule(client, fake_api, online, "gpu-b") == {"Error": ""}
    pod = make_pod("next", vram_mib=8000, priority=100)
    out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-b"]})
    assert "would not make room" in out["FailedAndUnresolvableNodes"]["gpu-b"]
    victims = client.post(
        "preempt",
        {
            "Pod": pod,
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {"gpu-b": {"Pods": [], "NumPDBViolations": 0}},
        },
    )
    assert victims == {"NodeNameToMetaVictims": {}}


def test_preempt_picks_the_minimal_set_of_lower_priority_preemptible_pods(
    extender: Any, fake_api: FakeApiServer
) -> None:
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    _, _, client = extender
    small = make_pod("small", namespace="batch", vram_mib=4000, priority=-1, uid="small-uid")
    big = make_pod("big", namespace="batch", vram_mib=30000, priority=-1, uid="big-uid")
    keep = make_pod("keep", vram_mib=10000, priority=50, uid="keep-uid")
    for p in (small, big, keep):
        assert schedule(client, fake_api, p, "gpu-c") == {"Error": ""}
    pod = make_pod("p0", vram_mib=25000, priority=100)
    meta = {"gpu-c": {"Pods": [{"UID": "small-uid"}, {"UID": "big-uid"}], "NumPDBViolations": 1}}
    out = client.post("preempt", {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta})
    assert out == {"NodeNameToMetaVictims": {"gpu-c": {"Pods": [{"UID": "big-uid"}], "NumPDBViolations": 1}}}


def test_prefix_and_routes(extender: tuple[Extender, ExtenderServer, Client]) -> None:
    _, server, client = extender
    assert server.url.endswith("/gpupool")
    status, body = client.raw("nosuchverb", b"{}")
    assert status == 404 and "no route" in body["Error"]
    status, body = client.raw("state", b"", method="GET")
    assert status == 200 and body["nodes"] == 3


def test_retried_bind_after_success_keeps_the_lease(extender: Any, fake_api: FakeApiServer) -> None:
    ext, _, client = extender
    pod = make_pod("twice", vram_mib=1000, compute_pct=5)
    assert schedule(client, fake_api, pod, "gpu-a") == {"Error": ""}
    args = {"PodName": "twice", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "gpu-a"}
    assert client.post("bind", args) == {"Error": ""}
    assert ext.pool.lease_of(pod["metadata"]["uid"]) is not None
    assert "gpupool.io/placement" in fake_api.pod("default", "twice")["metadata"]["annotations"]
    before = fake_api.pod("default", "twice")["metadata"]["annotations"]["gpupool.io/placement"]
    other = client.post("bind", {**args, "Node": "gpu-c"})
    assert "already bound to gpu-a" in other["Error"]
    assert ext.pool.lease_of(pod["metadata"]["uid"]).node == "gpu-a"
    assert fake_api.pod("default", "twice")["metadata"]["annotations"]["gpupool.io/placement"] == before
    ext.pool.check()


def test_a_pod_whose_quantities_the_api_server_canonicalised_is_scheduled(
    extender: Any, fake_api: FakeApiServer
) -> None:
    """A pod written with ``gpupool.io/vram-mib: 40000`` reaches the extender as "40k" (the API
    server's canonical form); it was refused in filter with "no unit suffix"."""
    ext, _, client = extender
    pod = make_pod("canon", vram_mib=40000, compute_pct=20)
    pod["spec"]["containers"][1]["resources"]["limits"]["gpupool.io/vram-mib"] = "40k"
    pod["spec"]["containers"][1]["resources"]["requests"]["gpupool.io/vram-mib"] = "40k"
    assert schedule(client, fake_api, pod, "gpu-a") == {"Error": ""}
    assert ext.pool.lease_of(pod["metadata"]["uid"]).request.demand.vram_mib == 40000


@pytest.mark.parametrize("field", ["PodName", "PodNamespace", "PodUID", "Node"])
def test_a_bind_naming_a_lone_surrogate_is_answered_not_a_500(
    extender: Any, fake_api: FakeApiServer, field: str
) -> None:
    """JSON can carry a lone surrogate (``"\\ud800"``), which no URL or UTF-8 text can: the pod read
    raised UnicodeEncodeError, an HTTP 500. Now it is the bind's ``Error`` naming the field."""
    ext, _, client = extender
    pod = fake_api.add_pod(make_pod("sur", vram_mib=1000))
    args = {**_bind_args(pod, "gpu-a"), field: "x\ud800"}
    status, out = client.raw("bind", json.dumps(args).encode())
    assert status == 200 and field in out["Error"] and "Unicode" in out["Error"], out
    assert ext.pool.pod_uids() == []
