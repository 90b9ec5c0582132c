"""`gpupool bench preempt`: from a P0 grant's arrival on a full simulated GPU to the memory of the
preempted P2 holders confirmed free, per freeing path.

Method: one simulated L40S-48GB (`SimulatedCluster` with a VRAM registry) filled by ``holders`` real
child processes (`gpupool.adapters.simulated.holder`), each in its own process group, holding an
equal share of the card. A `NodeAgent` with an eviction policy runs its loop on its own thread on the
real clock (``period_ms``), fed a lease ledger directly (what the gateway reporter hands it): first the
holders' P2 leases, then -- at t0, a seeded random phase of the period -- a ledger where those leases
are gone (preempted) and a P0 lease for the card is there. t1 is when the agent declares the P0 grant
usable: every holder's memory confirmed back from the device readings and the card shows room for
the grant. ``ms = t1 - t0``. After each run the bench checks the reading itself (no held memory left
beyond what the path keeps) and reaps the children.

Paths:
- ``signal-kill``: holders ignore SIGTERM, so the agent's SIGKILL after ``grace_ms`` frees them (the
  worst case of the signal path);
- ``sigterm``: holders exit on SIGTERM (a well-behaved job);
- ``sleep``: holders are engines with vLLM's sleep API; ``vllm-sleep`` shrinks them to 512 MiB each.
cuda-checkpoint needs a GPU and its binary: it is not measured on simulated devices.

Output: ``{"paths": {path: {"p50_ms", "p99_ms"}}, "runs"}`` (runs per path).
"""

from __future__ import annotations

import random
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpupool.adapters.pause import default_pausers
from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.holder import start_holder
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.evict import EvictionPolicy
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent, NodeSnapshot
from gpupool.core.clock import FunctionClock
from gpupool.hardware.spec import load_cluster_spec

PATHS = ("signal-kill", "sigterm", "sleep")
NODE, GPU, SLEEP_MIB = "bench", "bench/0", 512


class _Feed:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: Sequence[Mapping[str, object]] | None = None

    def set(self, leases: Sequence[Mapping[str, object]]) -> None:
        with self._lock:
            self._next = leases

    def take_ledger(self) -> Sequence[Mapping[str, object]] | None:
        with self._lock:
            out, self._next = self._next, None
            return out


def _percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def _lease(lid: str, proc: subprocess.Popen[str], mib: int, path: str, port: int) -> dict[str, object]:
    labels = {"gpupool.io/pgid": str(proc.pid)}
    if path == "sleep":
        labels |= {"gpupool.io/pauser": "vllm-sleep", "gpupool.io/endpoint": f"http://127.0.0.1:{port}"}
    else:
        labels["gpupool.io/pauser"] = "signal"
    return {"lease_id": lid, "gpu_id": GPU, "priority": -1, "vram_mib": mib, "labels": labels}


def _wait(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"preempt bench: {what} not reached within {timeout_s:g} s")
        time.sleep(0.002)


def run_path(path: str, *, runs: int, holders: int, grace_ms: int, period_ms: int, seed: int) -> list[float]:
    spec = load_cluster_spec({"nodes": [{"name": NODE, "gpus": [{"model": "L40S-48GB", "count": 1}]}]})
    rng = random.Random(seed)
    out: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpupool-preempt-") as tmp:
        sim = SimulatedCluster(spec, vram_registry=Path(tmp))
        card_mib = sim.read(NODE).gpu(0).memory_total_mib
        share = (card_mib - 1024) // holders
        clock = FunctionClock(time.monotonic)
        feed = _Feed()
        agent = NodeAgent(
            AgentConfig(NODE, period_s=period_ms / 1000),
            SnapshotSource(sim.source(NODE), node=NODE),
            default_pausers(clock=clock),
            clock=clock,
            ledger=feed,
            eviction=EvictionPolicy(grace_s=grace_ms / 1000, deadline_s=30.0),
        )
        usable: dict[str, float] = {}
        failed: list[str] = []

        def observe(_snap: NodeSnapshot, events: Sequence[AgentEvent]) -> None:
            for e in events:
                if e.kind == "grant_usable":
                    usable[e.lease_id] = time.monotonic()
                elif e.kind in ("evict_failed", "grant_free_failed"):
                    failed.append(f"{e.kind} {e.lease_id}: {e.reason}")

        agent.observers.append(observe)
        stop = threading.Event()
        loop = threading.Thread(target=agent.run, args=(stop,), name="preempt-bench-agent", daemon=True)
        loop.start()
        try:
            for r in range(runs):
                procs: list[subprocess.Popen[str]] = []
                try:
                    leases = []
                    for h in range(holders):
                        proc, port = start_holder(
                            Path(tmp),
                            GPU,
                            share,
                            on_term="ignore" if path == "signal-kill" else "exit",
                            sleep_api=path == "sleep",
                            sleep_mib=SLEEP_MIB,
                        )
                        procs.append(proc)
                        leases.append(_lease(f"r{r}-p2-{h}", proc, share, path, port))
                    ids = {str(x["lease_id"]) for x in leases}
                    feed.set(leases)
                    _wait(
                        lambda ids=ids: ids <= {w[0] for w in agent.snapshot().workloads},
                        30,
                        "P2 leases adopted",
                    )
                    time.sleep(rng.uniform(0, period_ms / 1000))  # random phase of the period
                    p0 = f"r{r}-p0"
                    need = card_mib - holders * (SLEEP_MIB if path == "sleep" else 0) - 1024
                    t0 = time.monotonic()
                    feed.set([{"lease_id": p0, "gpu_id": GPU, "priority": 2, "vram_mib": need, "labels": {}}])
                    _wait(lambda p0=p0: p0 in usable or bool(failed), 60, "P0 grant usable")
                    if failed:
                        raise RuntimeError(f"preempt bench ({path}): {failed[0]}")
                    out.append((usable[p0] - t0) * 1000)
                    g = sim.read(NODE).gpu(0)
                    if card_mib - g.memory_used_mib < need:
                        raise RuntimeError(f"preempt bench ({path}): {g.memory_used_mib} MiB still used")
                finally:
                    for proc in procs:
                        if proc.poll() is None:
                            proc.kill()
                        proc.wait()
                    feed.set([])
        finally:
            stop.set()
            loop.join(10)
            agent.close()
    return out


def run(
    *,
    runs: int = 20,
    holders: int = 2,
    grace_ms: int = 500,
    period_ms: int = 200,
    paths: Sequence[str] = PATHS,
    seed: int = 1,
) -> dict[str, Any]:
    result: dict[str, dict[str, float]] = {}
    for i, path in enumerate(paths):
        ms = run_path(path, runs=runs, holders=holders, grace_ms=grace_ms, period_ms=period_ms, seed=seed + i)
        result[path] = {"p50_ms": round(_percentile(ms, 50), 1), "p99_ms": round(_percentile(ms, 99), 1)}
    return {"paths": result, "runs": runs}
