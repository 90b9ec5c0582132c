"""The control loop on an injected clock with a scripted GPU and a real child process as the P2 job.

Deterministic: each `tick()` is driven by hand; the process state is read from /proc after the tick
that saw the crossing (the real-time reaction is measured in ``gpupool bench agent``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpupool.adapters.pause import CgroupFreezerPauser, SignalPauser
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.agent.source import ScriptedSource
from gpupool.agent.workloads import RunState
from gpupool.core.clock import ManualClock
from gpupool.core.pausers import Workload
from tests.agent.agent_helpers import running, stopped, wait_for

GPU = "n1/0"


def make_agent(clock: ManualClock, **cfg: object) -> tuple[NodeAgent, ScriptedSource, list[AgentEvent]]:
    source = ScriptedSource.uniform("n1", 1, vram_total_mib=10000)
    pausers = {"signal": SignalPauser(clock=clock), "cgroup": CgroupFreezerPauser(clock=clock)}
    agent = NodeAgent(AgentConfig("n1", **cfg), source, pausers, clock=clock)  # type: ignore[arg-type]
    events: list[AgentEvent] = []
    agent.observers.append(lambda _snap, evs: events.extend(evs))
    return agent, source, events


def step(agent: NodeAgent, clock: ManualClock) -> None:
    clock.advance(agent.config.period_s)
    agent.tick()


def kinds(events: list[AgentEvent]) -> list[str]:
    return [e.kind for e in events]


def test_sigstop_above_88_sigcont_below_70_no_flapping_at_80(batch_job: subprocess.Popen[bytes]) -> None:
    clock = ManualClock(100.0)
    agent, source, events = make_agent(clock)
    agent.register(Workload("lease-p2", GPU, "signal", vram_mib=2000, pgid=batch_job.pid))
    source.set_used_ratio(GPU, 0.50)
    step(agent, clock)
    assert events == [] and running(batch_job.pid)

    source.set_used_ratio(GPU, 0.89)
    step(agent, clock)  # the tick that sees the crossing sends SIGSTOP inside the tick
    assert kinds(events) == ["watermark_pause", "paused"]
    assert events[1].lease_id == "lease-p2" and events[1].frees == "compute"
    assert wait_for(lambda: stopped(batch_job.pid))
    assert agent.workloads.get("lease-p2").state is RunState.PAUSED  # type: ignore[union-attr]

    events.clear()
    for ratio in (0.80, 0.87, 0.72, 0.80, 0.71, 0.85) * 5:  # inside the hysteresis band
        source.set_used_ratio(GPU, ratio)
        step(agent, clock)
        assert stopped(batch_job.pid)
    assert events == []

    source.set_used_ratio(GPU, 0.69)
    step(agent, clock)
    assert kinds(events) == ["watermark_resume", "resumed"]
    assert wait_for(lambda: running(batch_job.pid))

    events.clear()
    for ratio in (0.80, 0.87, 0.75) * 5:
        source.set_used_ratio(GPU, ratio)
        step(agent, clock)
        assert not stopped(batch_job.pid)
    assert events == []


def test_cgroup_freezer_follows_the_watermarks(batch_job: subprocess.Popen[bytes], job_cgroup: Path) -> None:
    clock = ManualClock()
    agent, source, events = make_agent(clock)
    agent.register(Workload("lease-cg", GPU, "cgroup", vram_mib=2000, cgroup=str(job_cgroup)))

    def frozen() -> bool:
        return "frozen 1" in (job_cgroup / "cgroup.events").read_text()

    source.set_used_ratio(GPU, 0.90)
    step(agent, clock)
    assert kinds(events) == ["watermark_pause", "paused"]
    assert wait_for(frozen)
    events.clear()
    for ratio in (0.80, 0.75, 0.86) * 4:
        source.set_used_ratio(GPU, ratio)
        step(agent, clock)
        assert frozen()
    assert events == []
    source.set_used_ratio(GPU, 0.50)
    step(agent, clock)
    assert kinds(events) == ["watermark_resume", "resumed"]
    assert wait_for(lambda: not frozen())


def test_temperature_pauses_without_revoking(batch_job: subprocess.Popen[bytes]) -> None:
    clock = ManualClock()
    agent, source, events = make_agent(clock, revoke_after_s=0.5)
    agent.register(Workload("hot", GPU, "signal", vram_mib=2000, pgid=batch_job.pid))
    source.set(GPU, temperature_c=84)
    for _ in range(10):
        step(agent, clock)
    assert kinds(events) == ["watermark_pause", "paused"]
    assert wait_for(lambda: stopped(batch_job.pid))
    source.set(GPU, temperature_c=70)
    step(agent, clock)
    assert kinds(events)[-2:] == ["watermark_resume", "resumed"]


def test_compute_only_pause_escalates_to_revoke_when_vram_stays_high(
    batch_job: subprocess.Popen[bytes],
) -> None:
    clock = ManualClock()
    agent, source, events = make_agent(clock, revoke_after_s=1.0)
    agent.register(Workload("big", GPU, "signal", vram_mib=3000, pgid=batch_job.pid))
    source.set_used_ratio(GPU, 0.95)
    step(agent, clock)
    assert kinds(events) == ["watermark_pause", "paused"]
    for _ in range(4):  # 0.8 s after the crossing: still within the budget
        step(agent, clock)
    assert "revoke" not in kinds(events)
    step(agent, clock)  # 1.0 s: SIGSTOP froze compute but freed no VRAM -> revoke
    revoke = [e for e in events if e.kind == "revoke"]
    assert len(revoke) == 1 and revoke[0].lease_id == "big"
    assert "frees compute only" in revoke[0].reason
    assert batch_job.wait(timeout=10) != 0  # terminated (SIGKILL to the group)
    assert agent.workloads.get("big").state is RunState.REVOKED  # type: ignore[union-attr]


def test_new_workload_on_paused_gpu_is_paused_next_tick(batch_job: subprocess.Popen[bytes]) -> None:
    clock = ManualClock()
    agent, source, events = make_agent(clock)
    source.set_used_ratio(GPU, 0.92)
    step(agent, clock)
    assert kinds(events) == ["watermark_pause"]
    agent.register(Workload("late", GPU, "signal", vram_mib=10, pgid=batch_job.pid))
    step(agent, clock)
    assert kinds(events) == ["watermark_pause", "paused"]
    assert wait_for(lambda: stopped(batch_job.pid))


def test_xid_marks_gpu_unhealthy_and_revokes_its_batch_work(batch_job: subprocess.Popen[bytes]) -> None:
    clock = ManualClock()
    agent, source, events = make_agent(clock)
    agent.register(Workload("victim", GPU, "signal", vram_mib=10, pgid=batch_job.pid))
    source.inject_xid(GPU, 13)  # application-level XID: not a device fault
    step(agent, clock)
    assert events == []
    source.inject_xid(GPU, 79)  # fallen off the bus
    step(agent, clock)
    assert kinds(events) == ["unhealthy", "revoke"]
    assert events[0].reason == "XID 79"
    assert batch_job.wait(timeout=10) != 0
    snap = agent.snapshot()
    assert not snap.gpus[0].healthy and snap.gpus[0].problem == "XID 79"
    step(agent, clock)
    assert kinds(events) == ["unhealthy", "revoke"]  # reported once


def test_nvml_error_marks_unhealthy_and_broken_source_does_not_kill_the_loop() -> None:
    clock = ManualClock()
    agent, source, events = make_agent(clock)
    source.set(GPU, error="GPU is lost")
    step(agent, clock)
    assert kinds(events) == ["unhealthy"] and "GPU is lost" in events[0].reason

    class Broken:
        def read(self) -> list[object]:
            raise RuntimeError("NVML not initialised")

    agent.source = Broken()  # type: ignore[assignment]
    step(agent, clock)
    assert kinds(events)[-1] == "source_error"


def test_relief_counts_measured_process_memory(batch_job: subprocess.Popen[bytes]) -> None:
    from gpupool.agent.source import ProcessUsage

    clock = ManualClock()
    agent, source, events = make_agent(clock, revoke_after_s=0.2)
    agent.register(Workload("undeclared", GPU, "signal", pgid=batch_job.pid))  # vram_mib unknown (0)
    source.set(GPU, vram_used_mib=9500, processes=(ProcessUsage(batch_job.pid, 3000),))
    step(agent, clock)
    step(agent, clock)
    revoke = [e for e in events if e.kind == "revoke"]
    assert len(revoke) == 1 and "frees compute only" in revoke[0].reason


def test_refused_pause_is_reported_once_and_not_retried() -> None:
    from gpupool.adapters.pause import CudaCheckpointPauser
    from gpupool.adapters.pause.cuda_checkpoint import CheckpointSupport

    clock = ManualClock()
    agent, source, events = make_agent(clock, revoke_after_s=None)
    agent.pausers["cuda-checkpoint"] = CudaCheckpointPauser(
        support=CheckpointSupport(False, "", "", "'cuda-checkpoint' not found on PATH"), clock=clock
    )
    agent.register(Workload("ckpt", GPU, "cuda-checkpoint", vram_mib=100, pids=(4242,)))
    agent.register(Workload("typo", GPU, "sigstop", vram_mib=100, pgid=4243))
    source.set_used_ratio(GPU, 0.95)
    for _ in range(20):
        step(agent, clock)
    fails = sorted((e.lease_id, e.reason) for e in events if e.kind == "pauser_failure")
    assert len(fails) == 2
    assert "not found on PATH" in fails[0][1] and "unknown pauser 'sigstop'" in fails[1][1]


def test_restarted_agent_adopts_a_job_left_stopped_and_resumes_it(batch_job: subprocess.Popen[bytes]) -> None:
    import os
    import signal

    os.killpg(batch_job.pid, signal.SIGSTOP)  # a previous agent paused it and went away
    assert wait_for(lambda: stopped(batch_job.pid))
    clock = ManualClock()
    agent, source, events = make_agent(clock)
    entry = agent.register(Workload("left-over", GPU, "signal", vram_mib=10, pgid=batch_job.pid))
    assert entry.state is RunState.PAUSED  # probed, not assumed running
    source.set_used_ratio(GPU, 0.20)
    step(agent, clock)
    assert kinds(events) == ["resumed"]
    assert wait_for(lambda: running(batch_job.pid))


def test_a_persisting_failure_is_one_event_and_one_cleared_event_not_one_per_tick() -> None:
    clock = ManualClock()
    agent, source, events = make_agent(clock)
    good = {"vram_high": 0.88, "vram_low": 0.70}
    bad_pgid = {"gpupool.io/pauser": "signal", "gpupool.io/pgid": "zz"}

    class Feed:  # the gateway's answers, handed to the loop at every tick
        def __init__(self) -> None:
            self.watermarks: dict[str, object] = {"vram_high": 0.5, "vram_low": 0.9}
            self.leases: list[dict[str, object]] = [
                {"lease_id": "bad", "gpu_id": GPU, "priority": -1, "vram_mib": 10, "labels": bad_pgid}
            ]

        def take_watermarks(self) -> dict[str, object]:
            return self.watermarks

        def take_ledger(self) -> list[dict[str, object]]:
            return self.leases

    class Broken:
        def read(self) -> list[object]:
            raise RuntimeError("NVML not initialised")

    feed = Feed()
    agent.ledger = feed
    agent.source = Broken()  # type: ignore[assignment]
    for _ in range(50):  # 10 s of ticks
        step(agent, clock)
    assert sorted(kinds(events)) == ["config_error", "pauser_failure", "source_error"]
    events.clear()
    agent.source, feed.watermarks, feed.leases = source, good, []
    step(agent, clock)
    step(agent, clock)
    cleared = sorted(e.reason.split(" ", 1)[0] for e in events if e.kind == "failure_cleared")
    assert cleared == ["config_error", "pauser_failure", "source_error"]
    assert "seen 50 times" in events[0].reason and len(events) == 3
    agent.source = Broken()  # type: ignore[assignment]
    for _ in range(400):  # over a minute: one reminder, with the count of what it did not report
        step(agent, clock)
    again = [e.reason for e in events if e.kind == "source_error"]
    assert len(again) == 2 and again[1].endswith("(still failing: 299 repeats in 60 s unreported)")


def test_a_reading_with_more_vram_used_than_the_gpu_has_is_counted_full_and_reported() -> None:
    from gpupool.agent.gateway_client import readings_json

    clock = ManualClock()
    agent, source, events = make_agent(clock)
    source.set(GPU, vram_used_mib=12000)  # of 10000: a broken read
    for _ in range(5):
        step(agent, clock)
    bad = [e for e in events if e.kind == "source_error"]
    assert len(bad) == 1 and bad[0].gpu_id == GPU
    assert "vram_used_mib=12000 > vram_total_mib=10000" in bad[0].reason
    snap = agent.snapshot()
    assert snap.gpus[0].sample.vram_used_mib == 10000 and snap.gpus[0].paused  # fail closed: full
    assert readings_json(snap)["gpus"][0]["vram_used_mib"] == 10000
    source.set(GPU, vram_used_mib=1000)
    step(agent, clock)
    assert kinds(events)[-2:] == ["failure_cleared", "watermark_resume"]

    class Feed:  # a ledger granting more than the card has: the effective use is floored by it
        def take_ledger(self) -> list[dict[str, object]]:
            return [{"lease_id": "l", "gpu_id": GPU, "priority": 0, "vram_mib": 50000}]

    agent.ledger = Feed()
    step(agent, clock)
    snap = agent.snapshot()
    assert snap.gpus[0].reading.vram_used_mib == 50000  # type: ignore[union-attr]
    assert readings_json(snap)["gpus"][0]["vram_used_mib"] == 10000  # never published above the total
