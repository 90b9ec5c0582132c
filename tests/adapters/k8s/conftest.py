"""Fixtures for the Kubernetes adapter: a fake API server and the real extender over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer
from tests.adapters.k8s.k8s_helpers import Client, make_pool

from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.kubeapi import KubeApi


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    api = FakeApiServer().start()
    yield api
    api.stop()


@pytest.fixture
def extender(fake_api: FakeApiServer) -> Iterator[tuple[Extender, ExtenderServer, Client]]:
    ext = Extender(make_pool(), api=KubeApi.for_host(fake_api.url), wall_clock=lambda: 1_764_000_000.0)
    server = ExtenderServer(ext, prefix="/gpupool").start()
    client = Client(server)
    yield ext, server, client
    client.close()
    server.stop()
