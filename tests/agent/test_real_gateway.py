"""The agent against the real gateway app (`gpupool.adapters.http.create_app`) over HTTP: readings in
its schema drive its watermarks, the admin lease list is the agent's ledger, XID health revokes the
GPU's leases, and a relief revocation reaches it through the fallback (it has no events route)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.pause import SignalPauser
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.agent.gateway_client import GatewayReporter
from gpupool.agent.loop import AgentConfig, NodeAgent
from gpupool.agent.source import GpuSample, ScriptedSource
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.core.pausers import Workload
from tests.adapters.http.servers import running
from tests.agent.agent_helpers import stopped, wait_for

ADMIN, TENANT = "agent-admin-token-01", "tenant-a-token-0001"
GPU = "gpu-c/0"  # the seed pool's whole H100 on node gpu-c


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    store = SqliteLeaseStore(tmp_path / "leases.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (TENANT, "a", "tenant")])
    with running(create_app(c, tokens=tokens, tick_s=0.05)) as url:
        yield url
    store.close()


def acquire_p2(url: str, vram_mib: int) -> str:
    r = httpx.post(
        f"{url}/v1/leases",
        headers={"Authorization": f"Bearer {TENANT}"},
        json={"priority": "P2", "vram_mib": vram_mib, "compute_pct": 10, "kinds": ["whole"], "ttl_s": 600},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    lease = r.json()
    assert lease["gpu_id"] == GPU
    return str(lease["id"])


def lease_state(url: str, lease_id: str) -> str:
    r = httpx.get(f"{url}/v1/leases/{lease_id}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    return str(r.json()["state"])


def pool(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/pool", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def gpu_view(url: str, gpu_id: str) -> dict[str, Any]:
    for n in pool(url)["nodes"]:
        for g in n["gpus"]:
            if g["gpu_id"] == gpu_id:
                return dict(g)
    raise KeyError(gpu_id)


def build(url: str, **cfg: object) -> tuple[NodeAgent, ScriptedSource, GatewayReporter, ManualClock]:
    clock = ManualClock()
    source = ScriptedSource([GpuSample(GPU, 0, 0, 81920, uuid="GPU-c0", temperature_c=45, util_pct=10)])
    reporter = GatewayReporter(url, node="gpu-c", token=ADMIN, ledger_every_s=0.0, config_every_s=0.0)
    agent = NodeAgent(
        AgentConfig("gpu-c", **cfg),  # type: ignore[arg-type]
        source,
        {"signal": SignalPauser(clock=clock)},
        clock=clock,
        ledger=reporter,
    )
    agent.observers.append(reporter)
    return agent, source, reporter, clock


def tick(agent: NodeAgent, clock: ManualClock) -> None:
    clock.advance(0.2)
    agent.tick()


def test_readings_pause_the_gateway_and_ledger_flows_back(
    gateway: str, batch_job: subprocess.Popen[bytes]
) -> None:
    url = gateway
    lease_id = acquire_p2(url, 8192)
    agent, source, reporter, clock = build(url, revoke_after_s=None)
    agent.register(Workload(lease_id, GPU, "signal", vram_mib=8192, pgid=batch_job.pid))
    tick(agent, clock)
    assert reporter.flush_once(), reporter.last_error
    tick(agent, clock)  # picks up the ledger fetched by the flush
    assert agent.ledger_mib == {GPU: 8192}
    assert reporter.flush_once()  # the ledger floors the effective use the gateway is told
    assert gpu_view(url, GPU)["reading"]["vram_used_mib"] == 8192
    source.set(GPU, vram_used_mib=76000)  # 92.8 %
    tick(agent, clock)
    assert wait_for(lambda: stopped(batch_job.pid))
    assert reporter.flush_once(), reporter.last_error
    assert pool(url)["paused_gpus"] == [GPU]
    assert reporter.events_supported is False  # this gateway has no events route: fallback mode
    source.set(GPU, vram_used_mib=20000)
    tick(agent, clock)
    assert reporter.flush_once()
    assert pool(url)["paused_gpus"] == []
    assert lease_state(url, lease_id) == "active"
    reporter.stop(final_flush=False)


def test_xid_marks_the_gpu_failed_and_the_gateway_revokes(gateway: str) -> None:
    url = gateway
    lease_id = acquire_p2(url, 4096)
    agent, source, reporter, clock = build(url)
    tick(agent, clock)
    assert reporter.flush_once()
    source.inject_xid(GPU, 79)
    tick(agent, clock)
    assert reporter.flush_once(), reporter.last_error
    assert gpu_view(url, GPU)["health"] == "failed"
    assert lease_state(url, lease_id) == "revoked"
    reporter.stop(final_flush=False)


def test_relief_revocation_reaches_the_gateway(gateway: str, batch_job: subprocess.Popen[bytes]) -> None:
    url = gateway
    lease_id = acquire_p2(url, 8192)
    agent, source, reporter, clock = build(url, revoke_after_s=0.4)
    agent.register(Workload(lease_id, GPU, "signal", vram_mib=8192, pgid=batch_job.pid))
    source.set(GPU, vram_used_mib=80000)
    for _ in range(3):
        tick(agent, clock)
    assert batch_job.wait(timeout=10) != 0
    assert reporter.flush_once(), reporter.last_error
    assert lease_state(url, lease_id) in ("released", "revoked")
    assert reporter.pending() == 0
    reporter.stop(final_flush=False)


def test_one_simulated_agent_per_node_reports_to_the_gateway(gateway: str) -> None:
    from gpupool.agent.runtime import start_simulated_agents

    url = gateway
    agents = start_simulated_agents(url, token=ADMIN, slices=seed_example_pool(), period_s=0.05)
    try:
        assert [rt.agent.config.node for rt in agents] == ["gpu-a", "gpu-b", "gpu-c"]
        gpus = ("gpu-a/0", "gpu-b/0", "gpu-c/0")
        assert wait_for(lambda: all(gpu_view(url, g)["reading"] is not None for g in gpus))
        assert gpu_view(url, "gpu-a/0")["reading"]["vram_total_mib"] == 80 * 1024
        assert all(rt.reporter is not None and rt.reporter.last_error == "" for rt in agents)
        mig = agents[0].gauges().gpus
        want = sorted((x.id, x.profile) for x in seed_example_pool() if x.kind.value == "mig")
        assert [g.mig_profile for g in mig] == ["", *[prof for _id, prof in want]]
    finally:
        for rt in agents:
            rt.stop()


def test_watermarks_set_at_the_gateway_are_enforced_by_the_agent(
    gateway: str, batch_job: subprocess.Popen[bytes]
) -> None:
    url = gateway
    agent, source, reporter, clock = build(url, revoke_after_s=None)
    agent.register(Workload("p2", GPU, "signal", vram_mib=10, pgid=batch_job.pid))
    r = httpx.put(
        f"{url}/v1/admin/watermarks",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"vram_high": 0.5, "vram_low": 0.3, "temp_high_c": 80, "temp_low_c": 75, "early_warning": 0.45},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    tick(agent, clock)
    assert reporter.flush_once()
    source.set(GPU, vram_used_mib=45000)  # 55 %: under the default 88 %, over the gateway's 50 %
    tick(agent, clock)
    assert agent.bank.config.vram_high == 0.5
    assert wait_for(lambda: stopped(batch_job.pid))
    reporter.stop(final_flush=False)
