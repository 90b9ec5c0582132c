"""A P2 lease that names its Kubernetes pod (``gpupool.io/pod``) is ended by the gateway: the agent
evicts the pod through the Eviction API (the fake API server records it and deletes the pod) in the
tick that saw the lease go, signals the pod's process, and confirms from the simulated device that
its VRAM came back. Without the hook, or for a lease without a pod, no pod is evicted; a failing
Eviction is reported and the process is still signalled."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.pause import default_pausers
from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.holder import start_holder
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.evict import EvictionPolicy
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.core.clock import ManualClock
from gpupool.hardware.spec import load_cluster_spec
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod
from tests.agent.test_evict_frees_vram import P0, Feed, drive, p2, used

GPU = "n1/0"


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    api = FakeApiServer().start()
    yield api
    api.stop()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[SimulatedCluster, Path, list[subprocess.Popen[str]]]]:
    spec = load_cluster_spec({"nodes": [{"name": "n1", "gpus": [{"model": "L40S-48GB", "count": 1}]}]})
    procs: list[subprocess.Popen[str]] = []
    yield SimulatedCluster(spec, vram_registry=tmp_path / "vram"), tmp_path / "vram", procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def agent_for(sim: SimulatedCluster, feed: Feed, evict_pod: object) -> tuple[NodeAgent, list[AgentEvent]]:
    clock = ManualClock(0.0)
    agent = NodeAgent(
        AgentConfig("n1"),
        SnapshotSource(sim.source("n1"), node="n1"),
        default_pausers(clock=clock),
        clock=clock,
        ledger=feed,
        eviction=EvictionPolicy(grace_s=5.0, deadline_s=30.0),
        evict_pod=evict_pod,  # type: ignore[arg-type]
    )
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    return agent, events


def pod_lease(lease_id: str, pgid: int, mib: int, pod: str) -> dict[str, object]:
    lease = p2(lease_id, pgid, mib)
    lease["labels"] = {**lease["labels"], "gpupool.io/pod": pod}  # type: ignore[dict-item]
    return lease


def test_a_preempted_pod_is_evicted_and_its_memory_confirmed_free(sim, kube: FakeApiServer) -> None:
    cluster, reg, procs = sim
    kube.add_pod(make_pod("batch", node="n1", phase="Running"))
    job, _ = start_holder(reg, GPU, 30000)
    other, _ = start_holder(reg, GPU, 10000)
    procs += [job, other]
    feed = Feed()
    agent, events = agent_for(cluster, feed, KubeApi.for_host(kube.url).evict_pod)
    feed.set([pod_lease("job", job.pid, 30000, "default/batch"), p2("plain", other.pid, 10000)])
    agent.tick()
    assert kube.evictions == []
    feed.set([P0])  # the gateway preempted both
    agent.tick()
    assert kube.evictions == [("default", "batch")]  # in the tick that saw the lease go
    assert ("default", "batch") not in kube.pods
    drive(agent, lambda: agent.grant_state("p0") == "usable")
    assert job.wait(10) == 0 and other.wait(10) == 0 and used(cluster) == 0
    freed = {e.lease_id: e.reason for e in events if e.kind == "vram_freed"}
    assert "pod default/batch evicted" in freed["job"] and "freed_mib=30000" in freed["job"]
    assert "evicted" not in freed["plain"]  # a lease without a pod: signals only
    assert kube.evictions == [("default", "batch")]


def test_a_failed_eviction_is_reported_and_the_process_still_signalled(sim, kube: FakeApiServer) -> None:
    cluster, reg, procs = sim
    job, _ = start_holder(reg, GPU, 20000)
    procs.append(job)
    feed = Feed()
    agent, events = agent_for(cluster, feed, KubeApi.for_host(kube.url).evict_pod)
    feed.set([pod_lease("job", job.pid, 20000, "default/gone")])  # no such pod: 404
    agent.tick()
    feed.set([P0])
    agent.tick()
    drive(agent, lambda: agent.grant_state("p0") == "usable")
    assert job.wait(10) == 0 and used(cluster) == 0
    (freed,) = [e for e in events if e.kind == "vram_freed"]
    assert "pod default/gone eviction failed" in freed.reason
