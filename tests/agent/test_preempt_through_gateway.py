"""A P0 preempts a P2 through the real gateway, and the P2's process really exits and frees its
memory: a real holder child holds 60 GB of a simulated H100 (VRAM registry); its P2 lease names its
process group. The gateway grants the P0 by preempting it; the agent sees the lease go in its ledger,
SIGTERMs the holder, confirms from the device readings that the memory is back, and only then does
the P0's ``device_state`` in the lease API turn from ``granted-pending-free`` to ``usable``.
Waits are liveness bounds, not timing assertions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.pause import default_pausers
from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.holder import start_holder
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.evict import EvictionPolicy
from gpupool.agent.gateway_client import GatewayReporter
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.hardware.spec import load_cluster_spec
from tests.adapters.http.servers import running

ADMIN, TENANT = "agent-admin-token-01", "tenant-a-token-0001"
GPU = "gpu-c/0"  # the seed pool's whole H100 on node gpu-c


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    store = SqliteLeaseStore(tmp_path / "leases.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (TENANT, "a", "tenant")])
    with running(create_app(c, tokens=tokens, tick_s=0.05, agent_events=True)) as url:
        yield url
    store.close()


def acquire(url: str, priority: str, mib: int, labels: dict[str, str]) -> dict[str, object]:
    """Only the seed pool's H100 holds 60 GB: the P2 lands there, the P0 must preempt it. As the
    platform's job launcher: ``gpupool.io/`` labels (whom the agent signals) need role admin."""
    body = {"priority": priority, "vram_mib": mib, "labels": labels, "ttl_s": 600}
    r = httpx.post(f"{url}/v1/leases", headers={"Authorization": f"Bearer {ADMIN}"}, json=body, timeout=10)
    assert r.status_code == 201, r.text
    return dict(r.json())


def lease(url: str, lease_id: str) -> dict[str, object]:
    r = httpx.get(f"{url}/v1/leases/{lease_id}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    return dict(r.json())


def test_p0_lands_only_after_the_preempted_process_freed_its_memory(gateway: str, tmp_path: Path) -> None:
    url = gateway
    spec = load_cluster_spec(
        {"nodes": [{"name": "gpu-c", "gpus": [{"model": "H100-SXM5-80GB", "count": 1}]}]}
    )
    sim = SimulatedCluster(spec, vram_registry=tmp_path / "vram")
    holder, _ = start_holder(tmp_path / "vram", GPU, 60000)
    try:
        clock = ManualClock()
        reporter = GatewayReporter(url, node="gpu-c", token=ADMIN, ledger_every_s=0.0, config_every_s=0.0)
        agent = NodeAgent(
            AgentConfig("gpu-c"),
            SnapshotSource(sim.source("gpu-c"), node="gpu-c"),
            default_pausers(clock=clock),
            clock=clock,
            ledger=reporter,
            eviction=EvictionPolicy(grace_s=5.0, deadline_s=60.0),
        )
        events: list[AgentEvent] = []
        agent.observers += [reporter, lambda _s, evs: events.extend(evs)]
        p2 = acquire(url, "P2", 60000, {"gpupool.io/pauser": "signal", "gpupool.io/pgid": str(holder.pid)})
        agent.tick()
        assert reporter.flush_once(), reporter.last_error
        agent.tick()  # adopts the P2 from the ledger
        assert agent.workloads.get(str(p2["id"])) is not None
        assert p2["gpu_id"] == GPU
        p0 = acquire(url, "P0", 60000, {})
        assert p0["victims"] == [p2["id"]] and p0["gpu_id"] == GPU
        assert reporter.flush_once(), reporter.last_error  # fetches the ledger: P2 gone, P0 there
        clock.advance(0.2)
        agent.tick()
        assert [e.kind for e in events if e.lease_id == p2["id"]] == ["evict"]
        assert reporter.flush_once(), reporter.last_error
        assert lease(url, str(p0["id"]))["device_state"] == "granted-pending-free"
        for _ in range(500):
            if agent.grant_state(str(p0["id"])) == "usable":
                break
            threading.Event().wait(0.02)
            clock.advance(0.02)
            agent.tick()
        assert holder.wait(10) == 0  # the process really exited on SIGTERM
        assert sim.read("gpu-c").gpu(0).memory_used_mib == 0
        freed = [e for e in events if e.kind == "vram_freed"]
        assert [e.lease_id for e in freed] == [p2["id"]] and "freed_mib=60000" in freed[0].reason
        assert reporter.flush_once(), reporter.last_error
        assert lease(url, str(p0["id"]))["device_state"] == "usable"
        reporter.stop(final_flush=False)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
