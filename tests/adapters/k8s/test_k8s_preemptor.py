"""The preemptor evicts the minimal set of P2 pods for a pending P0 pod that fits nowhere."""

from __future__ import annotations

import threading
from typing import Any

from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod
from tests.adapters.k8s.k8s_helpers import Client

from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.preemptor import Preemptor
from gpupool.adapters.k8s.reconciler import PodReconciler


def bind(client: Client, api: FakeApiServer, pod: dict[str, Any], node: str) -> None:
    api.add_pod(pod)
    assert client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": [node]})["NodeNames"] == [node]
    m = pod["metadata"]
    out = client.post(
        "bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    )
    assert out == {"Error": ""}


def test_pending_p0_evicts_only_what_it_needs(extender: Any, fake_api: FakeApiServer) -> None:
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    ext, _, client = extender
    # gpu-b (one L4, 23034 MiB): two P2 pods and one P1 pod; gpu-c (L40S) holds a P1 pod
    bind(client, fake_api, make_pod("b-small", namespace="batch", vram_mib=3000, priority=-1), "gpu-b")
    bind(client, fake_api, make_pod("b-big", namespace="batch", vram_mib=12000, priority=-1), "gpu-b")
    bind(client, fake_api, make_pod("online", vram_mib=6000, priority=50), "gpu-b")
    bind(client, fake_api, make_pod("c-online", vram_mib=40000, priority=50), "gpu-c")
    bind(client, fake_api, make_pod("a0", vram_mib=80000, priority=50), "gpu-a")
    bind(client, fake_api, make_pod("a1", vram_mib=80000, priority=50), "gpu-a")
    p0 = fake_api.add_pod(make_pod("agent", vram_mib=14000, compute_pct=10, priority=100))
    p2 = fake_api.add_pod(make_pod("batch-new", namespace="batch", vram_mib=14000, priority=-1))
    never = make_pod("polite", vram_mib=14000, priority=100)
    never["spec"]["preemptionPolicy"] = "Never"
    fake_api.add_pod(never)

    api = KubeApi.for_host(fake_api.url)
    pre = Preemptor(ext.pool, cooldown_s=60.0)
    done = pre.run_once(api)
    assert [(e.for_pod, e.node, [v[2] for v in e.victims]) for e in done] == [
        ("default/agent", "gpu-b", ["b-big"])
    ]
    assert fake_api.evictions == [("batch", "b-big")]
    assert pre.run_once(api) == []  # cooldown: no second eviction while the victim terminates

    rec = PodReconciler(ext.pool)
    pods, _ = api.list_pods()
    ext.pool.allocator.clock.advance(1.0)  # type: ignore[attr-defined]
    rec.resync(pods, listed_at=ext.pool.allocator.clock.now())
    out = client.post("filter", {"Pod": p0, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b", "gpu-c"]})
    assert out["NodeNames"] == ["gpu-b"]
    out = client.post("filter", {"Pod": p2, "Nodes": None, "NodeNames": ["gpu-b"]})
    assert out["NodeNames"] == ["gpu-b"]  # the P2 pod fits too now, but it never evicted anyone
    ext.pool.check()


def test_nothing_is_evicted_when_only_protected_pods_block(extender: Any, fake_api: FakeApiServer) -> None:
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    ext, _, client = extender
    bind(client, fake_api, make_pod("p1", vram_mib=20000, priority=50), "gpu-b")
    bind(client, fake_api, make_pod("c", vram_mib=40000, priority=-1, compute_pct=10), "gpu-c")
    for i in range(2):
        bind(client, fake_api, make_pod(f"a{i}", vram_mib=80000, priority=100), "gpu-a")
    fake_api.add_pod(make_pod("agent", vram_mib=14000, priority=100))
    fake_api.add_pod(make_pod("big", vram_mib=47000, priority=100))
    pre = Preemptor(ext.pool)
    pods, _ = KubeApi.for_host(fake_api.url).list_pods(field_selector="spec.nodeName=")
    plans = pre.plan(pods)
    # agent: gpu-b is blocked by P1 only, gpu-a by P0; only the P2 pod on gpu-c can make room
    assert [(e.for_pod, e.node, [v[2] for v in e.victims]) for e in plans] == [
        ("default/agent", "gpu-c", ["c"])
    ]
    assert fake_api.evictions == []


def test_the_loop_outlives_a_failing_round(extender: Any, fake_api: FakeApiServer) -> None:
    """A round that raises (a bug, a pod the planner chokes on) is logged and the next round runs."""
    ext, _, _ = extender
    pre = Preemptor(ext.pool)
    rounds: list[int] = []
    stop = threading.Event()

    def run_once(api: KubeApi) -> list[Any]:
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("injected")
        if len(rounds) >= 3:
            stop.set()
        return []

    pre.run_once = run_once  # type: ignore[method-assign]
    t = threading.Thread(
        target=pre.run, args=(KubeApi.for_host(fake_api.url), stop), kwargs={"interval_s": 0.01}
    )
    t.start()
    t.join(timeout=10)
    assert not t.is_alive() and len(rounds) >= 3
