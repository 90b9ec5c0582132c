"""Fixtures for the Kubernetes adapter: a fake API server, a static pool, the real extender over HTTP."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_fakeapi import FakeApiServer

from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.inventory import whole_gpu_slices
from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.core.clock import ManualClock
from gpupool.core.ids import seeded_lease_ids

FIXTURES = Path(__file__).parent / "fixtures"

SMALL_CLUSTER = {
    "nodes": [
        {"name": "gpu-a", "gpus": [{"model": "A100-SXM4-80GB", "count": 2, "memory_mib": 81920}]},
        {"name": "gpu-b", "gpus": [{"model": "L4-24GB", "count": 1, "memory_mib": 23034}]},
        {"name": "gpu-c", "gpus": [{"model": "L40S-48GB", "count": 1, "memory_mib": 46068}]},
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


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    api = FakeApiServer().start()
    yield api
    api.stop()


def make_pool(spec: dict[str, Any] = SMALL_CLUSTER) -> ExtenderPool:
    return ExtenderPool(whole_gpu_slices(spec), clock=ManualClock(1000.0), lease_ids=seeded_lease_ids(7))


@pytest.fixture
def extender(fake_api: FakeApiServer) -> Iterator[tuple[Extender, ExtenderServer, Client]]:
    ext = Extender(make_pool(), api=KubeApi.for_host(fake_api.url), wall_clock=lambda: 1_764_000_000.0)
    server = ExtenderServer(ext, prefix="/gpupool").start()
    client = Client(server)
    yield ext, server, client
    client.close()
    server.stop()
