"""The loop over the hardware layer's simulated cluster (its force/xid hooks) with a real child process:
the same watermark behaviour as with the in-memory source, through the DeviceSnapshot adapter."""

from __future__ import annotations

import subprocess

from gpupool.adapters.pause import SignalPauser
from gpupool.adapters.simulated import embedded_default
from gpupool.agent.devices import open_source
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.agent.source import ScriptedSource
from gpupool.core.clock import ManualClock
from gpupool.core.pausers import Workload
from tests.agent.agent_helpers import running, stopped, wait_for

GPU = "gpu-a/2"  # an unpartitioned A100-80GB of the embedded seed platform


def test_simulated_cluster_drives_pause_resume_and_health(batch_job: subprocess.Popen[bytes]) -> None:
    cluster = embedded_default()
    clock = ManualClock()
    source = open_source("simulated", node="gpu-a", cluster=cluster)
    agent = NodeAgent(AgentConfig("gpu-a"), source, {"signal": SignalPauser(clock=clock)}, clock=clock)
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    agent.register(Workload("p2", GPU, "signal", vram_mib=1000, pgid=batch_job.pid))

    def step() -> None:
        clock.advance(0.2)
        agent.tick()

    step()
    snap = agent.snapshot()
    assert [g.sample.gpu_id for g in snap.gpus] == ["gpu-a/0", "gpu-a/1", "gpu-a/2", "gpu-a/3"]
    assert [i.mig_profile for i in snap.gpus[0].sample.instances] == ["3g.40gb", "3g.40gb"]
    assert not stopped(batch_job.pid)
    cluster.force(GPU, memory_used_mib=76000)  # 92.8 % of 81920
    step()
    assert wait_for(lambda: stopped(batch_job.pid))
    for used in (70000, 60000, 65000):  # 85 %, 73 %, 79 %: inside the band
        cluster.force(GPU, memory_used_mib=used)
        step()
        assert stopped(batch_job.pid)
    cluster.force(GPU, memory_used_mib=50000)  # 61 %
    step()
    assert wait_for(lambda: running(batch_job.pid))
    p2 = [e.kind for e in events if e.gpu_id == GPU]
    assert p2 == ["watermark_pause", "paused", "watermark_resume", "resumed"]
    cluster.xid("gpu-a/3", 79)
    step()
    bad = [e for e in events if e.kind == "unhealthy"]
    assert len(bad) == 1 and bad[0].gpu_id == "gpu-a/3" and "79" in bad[0].reason


def test_unknown_simulated_node_falls_back_to_an_in_memory_node() -> None:
    src = open_source("simulated", node="elsewhere", gpus=3, cluster=embedded_default())
    assert isinstance(src, ScriptedSource) and len(src.read()) == 3
