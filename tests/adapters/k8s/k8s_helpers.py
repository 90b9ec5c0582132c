"""Helpers for the Kubernetes adapter tests: spec fixtures, a static pool, a keep-alive extender client."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from gpupool.adapters.k8s.extender import ExtenderServer
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core.clock import Clock, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.core.ids import LeaseIdFactory, random_lease_id, seeded_lease_ids
from gpupool.hardware.planner import inventory_from_cluster
from gpupool.hardware.slices import Slice
from gpupool.hardware.spec import load_cluster_spec

FIXTURES = Path(__file__).parent / "fixtures"

SMALL_CLUSTER = {
    "nodes": [
        {"name": "gpu-a", "gpus": [{"model": "A100-SXM4-80GB", "count": 2}]},
        {"name": "gpu-b", "gpus": [{"model": "L4-24GB", "count": 1}]},
        {"name": "gpu-c", "gpus": [{"model": "L40S-48GB", "count": 1}]},
    ]
}


def fixture_json(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class Client:
    """A keep-alive JSON client for the extender, as kube-scheduler's HTTPExtender posts."""

    def __init__(self, server: ExtenderServer) -> None:
        self.port = server.port
        self.prefix = server.prefix
        self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def raw(self, verb: str, body: bytes, method: str = "POST") -> tuple[int, Any]:
        self._conn.request(
            method, f"{self.prefix}/{verb}", body=body, headers={"Content-Type": "application/json"}
        )
        resp = self._conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data)

    def post(self, verb: str, obj: Any) -> Any:
        status, out = self.raw(verb, json.dumps(obj).encode())
        assert status == 200, out
        return out

    def close(self) -> None:
        self._conn.close()


def pool_of(
    slices: Any = (),
    *,
    clock: Clock,
    lease_ids: LeaseIdFactory = random_lease_id,
    store: Any = None,
    policy: str = "bestfit",
) -> ExtenderPool:
    """An extender pool over its own in-process controller (the standalone extender's composition)."""
    controller = LeaseController(
        [s for s in slices if isinstance(s, Slice)],
        clock=clock,
        store=store if store is not None else MemoryLeaseStore(),
        lease_ids=lease_ids,
        policy=policy,
    )
    controller.recover()
    return ExtenderPool(controller)


def make_pool(spec: dict[str, Any] = SMALL_CLUSTER) -> ExtenderPool:
    slices = inventory_from_cluster(load_cluster_spec(spec))
    return pool_of(slices, clock=ManualClock(1000.0), lease_ids=seeded_lease_ids(7))


def wait_until(cond: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
