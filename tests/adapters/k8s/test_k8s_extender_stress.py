"""Concurrency and bad input against the real extender HTTP server and a fake API server."""

from __future__ import annotations

import json
import random
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod
from tests.adapters.k8s.k8s_helpers import Client, fixture_json, make_pool

from gpupool.adapters.k8s.annotations import decode_placement
from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.kubeapi import KubeApi

TEN_NODES = {
    "nodes": [{"name": f"n{i:02d}", "gpus": [{"model": "A100-SXM4-80GB", "count": 2}]} for i in range(10)]
}


def test_200_pods_bound_in_parallel_never_overcommit_a_card(fake_api: FakeApiServer) -> None:
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    ext = Extender(make_pool(TEN_NODES), api=KubeApi.for_host(fake_api.url))
    server = ExtenderServer(ext).start()
    nodes = [f"n{i:02d}" for i in range(10)]
    rng = random.Random(42)
    pods = [
        make_pod(
            f"p{i:03d}",
            vram_mib=rng.randrange(2000, 16000),
            compute_pct=rng.randrange(5, 40),
            priority=rng.choice([100, 50, -1]),
        )
        for i in range(200)
    ]
    for p in pods:
        fake_api.add_pod(p)
    local = threading.local()

    def run(pod: dict[str, Any]) -> bool:
        if not hasattr(local, "client"):
            local.client = Client(server)
        c: Client = local.client
        out = c.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
        if out["Error"] or not out["NodeNames"]:
            return False
        scores = c.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": out["NodeNames"]})
        order = sorted(scores, key=lambda s: (-s["Score"], s["Host"]))
        meta = pod["metadata"]
        for s in order[:3]:
            bound = c.post(
                "bind",
                {
                    "PodName": meta["name"],
                    "PodNamespace": meta["namespace"],
                    "PodUID": meta["uid"],
                    "Node": s["Host"],
                },
            )
            if bound["Error"] == "":
                return True
        return False

    try:
        with ThreadPoolExecutor(max_workers=24) as pool:
            results = list(pool.map(run, pods))
    finally:
        server.stop()
    assert 20 < sum(results) < 200
    slices = ext.pool.slices()
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    bound = 0
    for p in pods:
        live = fake_api.pod("default", p["metadata"]["name"])
        text = live["metadata"]["annotations"].get("gpupool.io/placement")
        assert (text is not None) == bool(live["spec"].get("nodeName"))
        if text is None:
            assert ext.pool.lease_of(p["metadata"]["uid"]) is None
            continue
        bound += 1
        placement = decode_placement(text)
        assert placement.node == live["spec"]["nodeName"]
        for g in placement.grants:
            used[g.slice_id][0] += g.vram_mib
            used[g.slice_id][1] += g.compute_milli
    assert bound == sum(results) == len(ext.pool.pod_uids())
    for sid, (vram, compute) in used.items():
        cap = slices[sid].capacity
        assert vram <= cap.vram_mib and compute <= cap.compute_milli, sid
    ext.pool.check()


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[1, 2]", b"null", b'"text"', b"\xff\xfe", b'{"Pod": 5'],
)
def test_malformed_json_is_a_400_with_error(extender: Any, body: bytes) -> None:
    _, _, client = extender
    for verb in ("filter", "prioritize", "bind", "preempt"):
        status, out = client.raw(verb, body)
        assert status == 400 and out["Error"], (verb, out)


def _pod_with(limits: dict[str, Any]) -> dict[str, Any]:
    pod = fixture_json("filter_nodenames.json")["Pod"]
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    return pod


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        (_pod_with({"gpupool.io/vram-mib": "20Gi"}), "gpupool.io/vram-mib"),
        (_pod_with({"gpupool.io/vram-mib": "-5"}), "gpupool.io/vram-mib"),
        (
            _pod_with({"gpupool.io/vram-mib": "100", "gpupool.io/compute-pct": "150"}),
            "gpupool.io/compute-pct",
        ),
        (_pod_with({"gpupool.io/compute-pct": "50"}), "gpupool.io/vram-mib"),
        (_pod_with({"gpupool.io/vram-mib": "100", "gpupool.io/gpu": "0"}), "gpupool.io/gpu"),
        ("not a pod", "Pod"),
        ({"metadata": {"name": "x"}, "spec": {"containers": "nope"}}, "Pod.spec.containers"),
        (
            {
                "metadata": {"name": "x", "annotations": {"gpupool.io/slice-kind": "fpga"}},
                "spec": {
                    "containers": [{"name": "c", "resources": {"limits": {"gpupool.io/vram-mib": "1"}}}]
                },
            },
            "slice-kind",
        ),
        (
            {
                "metadata": {"name": "x"},
                "spec": {
                    "containers": [
                        {"name": "a", "resources": {"limits": {"gpupool.io/vram-mib": "1"}}},
                        {"name": "b", "resources": {"limits": {"gpupool.io/vram-mib": "1"}}},
                    ]
                },
            },
            "Pod.spec.containers",
        ),
        (
            {
                "metadata": {"name": "x"},
                "spec": {
                    "initContainers": [{"name": "i", "resources": {"limits": {"gpupool.io/gpu": "1"}}}],
                    "containers": [],
                },
            },
            "initContainers",
        ),
    ],
)
def test_invalid_pods_get_an_error_naming_the_field(extender: Any, pod: Any, field: str) -> None:
    _, _, client = extender
    out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
    assert field in out["Error"], out
    assert client.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]}) == [
        {"Host": "gpu-a", "Score": 0}
    ]
    assert client.post("preempt", {"Pod": pod, "NodeNameToMetaVictims": {"gpu-a": {"Pods": []}}}) == {
        "NodeNameToMetaVictims": {}
    }


@pytest.mark.parametrize(
    "args",
    [
        {"Pod": {}, "Nodes": None, "NodeNames": None},
        {"Pod": {}, "NodeNames": "gpu-a"},
        {"Pod": {}, "NodeNames": [1, 2]},
        {"Pod": {}, "Nodes": []},
        {"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}},
        {"Pod": {}, "Nodes": {"items": "x"}},
    ],
)
def test_bad_node_lists_give_an_error(extender: Any, args: dict[str, Any]) -> None:
    _, _, client = extender
    out = client.post("filter", args)
    assert out["Error"] and ("Nodes" in out["Error"] or "NodeNames" in out["Error"])
    assert client.post("prioritize", args) == []


def test_impossible_requests_are_unresolvable_on_every_node(extender: Any) -> None:
    _, _, client = extender
    names = ["gpu-a", "gpu-b", "gpu-c"]
    for limits in (
        {"gpupool.io/vram-mib": "200000"},
        {"gpupool.io/vram-mib": "1000", "gpupool.io/gpu": "3"},
    ):
        out = client.post("filter", {"Pod": _pod_with(limits), "Nodes": None, "NodeNames": names})
        assert out["Error"] == "" and out["NodeNames"] == []
        assert set(out["FailedAndUnresolvableNodes"]) == set(names)
    mig = _pod_with({"gpupool.io/vram-mib": "1000"})
    mig["metadata"]["annotations"]["gpupool.io/slice-kind"] = "mig"
    out = client.post("filter", {"Pod": mig, "Nodes": None, "NodeNames": names})
    assert "of kind ['mig']" in out["FailedAndUnresolvableNodes"]["gpu-a"]


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"PodName": "x", "PodNamespace": "default", "PodUID": "u"},
        {"PodName": 5, "PodNamespace": "default", "PodUID": "u", "Node": "gpu-a"},
        {"PodName": "missing", "PodNamespace": "default", "PodUID": "u", "Node": "gpu-a"},
    ],
)
def test_bad_bind_args_give_an_error(extender: Any, args: dict[str, Any]) -> None:
    ext, _, client = extender
    out = client.post("bind", args)
    assert out["Error"]
    assert ext.pool.pod_uids() == []


def test_bind_to_a_node_outside_the_pool_is_an_error(extender: Any, fake_api: FakeApiServer) -> None:
    ext, _, client = extender
    pod = fake_api.add_pod(make_pod("lost", vram_mib=100))
    out = client.post(
        "bind",
        {"PodName": "lost", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "cpu-1"},
    )
    assert "no gpupool GPUs" in out["Error"]
    assert json.dumps(ext.pool.pod_uids()) == "[]"


def test_memoised_verdicts_follow_every_change() -> None:
    from gpupool.adapters.k8s.resources import PodDemand

    pool = make_pool(TEN_NODES)
    rng = random.Random(5)
    nodes = pool.nodes()
    shapes = [(v, c) for v in (2048, 20000, 40000, 81920) for c in (0, 300, 1000)]
    held: list[str] = []
    for step in range(300):
        v, c = rng.choice(shapes)
        demand = PodDemand(f"u{step}", "default", f"p{step}", rng.choice([100, -1]), v, c)
        before = pool.filter(demand, nodes)
        if rng.random() < 0.5 or not held:
            node = rng.choice(before.passed) if before.passed else rng.choice(nodes)
            if pool.reserve(demand, node).granted:
                held.append(demand.uid)
        else:
            pool.release_pod(held.pop(rng.randrange(len(held))), reason="test")
        if step % 10 == 0:
            pool.set_healthy(f"{rng.choice(nodes)}/{rng.randrange(2)}/whole", rng.random() < 0.7)
        pool.filter(demand, nodes)
        pool.check()
