"""`gpupool bench extender`: filter + prioritize latency for one pod over 1,000 nodes x 8 GPUs.

Method:
1. The one ledger as ``gpupool serve --kubernetes`` runs it: a `LeaseController` over a SQLite lease
   store (a temporary file), owned by an asyncio loop in its own thread with the gateway's
   `GroupCommitter`; the extender's calls reach it through `LoopOwner`, exactly as in the server.
   ``nodes`` x ``gpus_per_node`` whole H100-80GB cards (81,559 MiB, 1000 mGPU each), pre-filled with
   seeded lease-API leases (``fill_per_card`` per card on average, 2-24 GiB x 5-40 % each, placed
   with ``LeaseController.place`` and committed to the store) so nodes differ and some cards are full.
2. The real extender HTTP server on loopback; a keep-alive ``http.client`` connection posts what
   kube-scheduler posts with ``nodeCacheCapable: true``: ``/filter`` with the pod JSON and all node
   names, then ``/prioritize`` with the nodes that passed. One timed sample = both round trips,
   including JSON encode / decode on both sides and the HTTP stack.
3. Every sample is a fresh pod (new UID) of a new shape (random VRAM MiB and compute %), so the
   extender's per-shape verdict memo never helps: the headline ``filter_prioritize_*`` figures are
   the cold path. Between samples one lease is granted and one released on random cards through the
   controller (untimed, committed to the store), so each timed filter also rebuilds the card index
   rows of the nodes that changed.
4. ``repeated_shapes_*``: the same, with pods drawn from 16 shapes (replicas of a few Deployments):
   the memo answers every node that did not change since the last pod of that shape.
5. ``filter_prioritize_cpu_p50_ms``: CPU time of this process (client and server threads) per cold
   sample, which contention from other jobs on the machine does not inflate the way it does wall time.
6. The cold samples are also timed in process (``Extender.filter`` + ``Extender.prioritize`` on dicts:
   no HTTP, no JSON, still the hop onto the controller's loop) to show what the protocol stack costs.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from gpupool.adapters.http.runtime import GroupCommitter
from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.owner import LoopOwner
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core import ManualClock, Request, Resources, Slice, SliceKind
from gpupool.core.controller import LeaseController
from gpupool.core.ids import seeded_lease_ids

H100_MIB = 81559


def _pod(rng: random.Random, *, distinct: bool = True) -> dict[str, Any]:
    if distinct:  # NOTE: a new shape nearly every time: the extender's per-shape memo cannot help
        vram, pct = rng.randrange(1024, 32768), rng.randrange(1, 60)
    else:
        vram, pct = rng.choice([4096, 8192, 20480, 32768]), rng.choice([10, 25, 30, 50])
    limits = {
        "cpu": "8",
        "memory": "32Gi",
        "gpupool.io/gpu": "1",
        "gpupool.io/vram-mib": str(vram),
        "gpupool.io/compute-pct": str(pct),
    }
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": f"agent-{rng.randrange(10**6)}",
            "namespace": "team-x",
            "uid": str(uuid.uuid4()),
            "labels": {"app": "agent-llm"},
            "annotations": {},
        },
        "spec": {
            "schedulerName": "gpupool-scheduler",
            "priority": 100,
            "priorityClassName": "gpupool-p0",
            "containers": [
                {
                    "name": "llm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "resources": {"limits": limits, "requests": limits},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def _pctl(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def build(
    nodes: int, gpus_per_node: int, fill_per_card: float, seed: int, store_dir: Path
) -> tuple[LeaseController, list[str]]:
    slices = [
        Slice(
            f"n{n:04d}/{g}",
            f"n{n:04d}",
            f"n{n:04d}/{g}",
            SliceKind.WHOLE,
            Resources(H100_MIB, 1000),
            gpu_index=g,
        )
        for n in range(nodes)
        for g in range(gpus_per_node)
    ]
    store = SqliteLeaseStore(store_dir / "leases.db")
    controller = LeaseController(
        slices, clock=ManualClock(0.0), store=store, lease_ids=seeded_lease_ids(seed), autoflush=False
    )
    rng = random.Random(seed)
    for i in range(round(len(slices) * fill_per_card)):
        s = rng.choice(slices)
        req = Request(
            id=f"fill-{i}",
            tenant="fill",
            priority=rng.choice([100, 50, -1]),
            demand=Resources(rng.randrange(2048, 24576), rng.randrange(50, 400)),
            ttl_s=10**6,
        )
        controller.place(req, (s.id,))
    controller.flush()
    return controller, [f"n{n:04d}" for n in range(nodes)]


def _owner_loop(controller: LeaseController) -> tuple[asyncio.AbstractEventLoop, LoopOwner, threading.Thread]:
    """The controller's owner loop in a thread, with the gateway's group committer."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-owner-loop", daemon=True)
    thread.start()

    async def make() -> LoopOwner:
        committer = GroupCommitter(controller)
        return LoopOwner(loop, durable=committer.durable, kick=committer.kick)

    return loop, asyncio.run_coroutine_threadsafe(make(), loop).result(), thread


def run(
    *,
    nodes: int = 1000,
    gpus_per_node: int = 8,
    samples: int = 300,
    warmup: int = 20,
    fill_per_card: float = 5.0,
    seed: int = 1,
) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="gpupool-bench-extender-")
    controller, names = build(nodes, gpus_per_node, fill_per_card, seed, Path(tmp.name))
    loop, owner, loop_thread = _owner_loop(controller)
    pool = ExtenderPool(controller, owner=owner)
    ext = Extender(pool)
    server = ExtenderServer(ext).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    rng = random.Random(seed + 1)
    slice_ids = [f"{n}/{g}" for n in names for g in range(gpus_per_node)]
    churn: list[str] = []

    def mutate(i: int) -> None:
        if churn:
            lid = churn.pop(0)
            owner.write(lambda: controller.release(lid))
        req = Request(id=f"churn-{i}", tenant="c", priority=50, demand=Resources(1024, 10), ttl_s=10**6)
        sid = rng.choice(slice_ids)
        out = owner.write(lambda: controller.place(req, (sid,)))
        if out.lease is not None:
            churn.append(out.lease.id)

    def post(verb: str, body: bytes) -> Any:
        conn.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{verb}: HTTP {resp.status}: {data[:200]!r}")
        return json.loads(data)

    cpu_ms: list[float] = []

    def timed(distinct: bool, offset: int) -> tuple[list[float], list[float], list[float], list[int]]:
        total, filt, prio, passed = [], [], [], []
        for i in range(warmup + samples):
            mutate(offset + i)
            pod = _pod(rng, distinct=distinct)
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = post("filter", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode())
            t1 = time.perf_counter()
            post(
                "prioritize", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": out["NodeNames"]}).encode()
            )
            t2 = time.perf_counter()
            if i >= warmup:
                if distinct:
                    cpu_ms.append((time.process_time() - c0) * 1000)
                total.append((t2 - t0) * 1000)
                filt.append((t1 - t0) * 1000)
                prio.append((t2 - t1) * 1000)
                passed.append(len(out["NodeNames"]))
        return total, filt, prio, passed

    try:
        http_ms, filter_ms, prio_ms, passed = timed(True, 0)
        repeated_ms, _, _, _ = timed(False, warmup + samples)
    finally:
        conn.close()
        server.stop()
    inproc_ms: list[float] = []
    for i in range(warmup + samples):
        mutate(2 * (warmup + samples) + i)
        pod = _pod(rng)
        t0 = time.perf_counter()
        out = ext.filter({"Pod": pod, "Nodes": None, "NodeNames": names})
        ext.prioritize({"Pod": pod, "Nodes": None, "NodeNames": out["NodeNames"]})
        if i >= warmup:
            inproc_ms.append((time.perf_counter() - t0) * 1000)
    pool.check()
    granted = owner.read(lambda: sum(st.granted.vram_mib for st in controller.allocator.states()))
    loop.call_soon_threadsafe(loop.stop)
    loop_thread.join(timeout=5)
    controller.store.close()
    tmp.cleanup()
    total = nodes * gpus_per_node * H100_MIB
    return {
        "benchmark": "extender",
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "samples": samples,
        "timed_call": "POST /filter + POST /prioritize over loopback HTTP/1.1 keep-alive, JSON both ways, "
        "NodeNames mode",
        "filter_prioritize_p50_ms": round(statistics.median(http_ms), 3),
        "filter_prioritize_p99_ms": round(_pctl(http_ms, 0.99), 3),
        "filter_prioritize_cpu_p50_ms": round(statistics.median(cpu_ms), 3),
        "filter_p50_ms": round(statistics.median(filter_ms), 3),
        "prioritize_p50_ms": round(statistics.median(prio_ms), 3),
        "repeated_shapes_p50_ms": round(statistics.median(repeated_ms), 3),
        "repeated_shapes_p99_ms": round(_pctl(repeated_ms, 0.99), 3),
        "in_process_p50_ms": round(statistics.median(inproc_ms), 3),
        "in_process_p99_ms": round(_pctl(inproc_ms, 0.99), 3),
        "nodes_passing_mean": round(statistics.mean(passed), 1),
        "pool_vram_granted_pct": round(100 * granted / total, 1),
    }
