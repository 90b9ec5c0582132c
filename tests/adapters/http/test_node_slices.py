"""``PUT /v1/nodes/{node}/slices`` over real HTTP: a node agent's discovered slice list joins the pool,
vanished slices are revoked (holder told) and removed, health follows; bad input is a 4xx naming the
field and the value, with nothing changed; only the admin role may call it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running

ADMIN, A = "admin-token-0001", "tenant-a-token-1"


def h(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[tuple[str, LeaseController]]:
    store = SqliteLeaseStore(tmp_path / "l.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    tokens = TokenTable([(ADMIN, "ops", "admin"), (A, "a", "tenant")])
    with running(create_app(c, tokens=tokens, tick_s=0.05)) as url:
        yield url, c
    store.close()


def whole(gpu: str, *, healthy: bool = True, vram_mib: int = 46068) -> dict[str, Any]:
    return {
        "id": f"{gpu}/whole",
        "gpu_id": gpu,
        "kind": "whole",
        "vram_mib": vram_mib,
        "compute_milli": 1000,
        "index": int(gpu.rsplit("/", 1)[1]),
        "model": "L40S-48GB",
        "uuid": f"GPU-{gpu.replace('/', '-')}",
        "healthy": healthy,
    }


def put(url: str, node: str, slices: list[dict[str, Any]], tok: str = ADMIN) -> httpx.Response:
    return httpx.put(f"{url}/v1/nodes/{node}/slices", json={"slices": slices}, headers=h(tok), timeout=10)


def state(c: LeaseController) -> Any:
    return sorted((s.slice.id, s.healthy, s.num_leases) for s in c.allocator.states())


def test_a_new_node_joins_and_changes_follow(gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    r = put(url, "n9", [whole("n9/0"), whole("n9/1")])
    assert r.status_code == 200, r.text
    assert r.json() == {
        "node": "n9",
        "slices": 2,
        "added": ["n9/0/whole", "n9/1/whole"],
        "removed": [],
        "health": [],
        "revoked": [],
    }
    lease = httpx.post(
        f"{url}/v1/leases",
        headers=h(A),
        json={"priority": "P1", "vram_mib": 40000, "kinds": ["whole"], "ttl_s": 600, "gpu_id": "n9/1"},
        timeout=10,
    )
    assert lease.status_code == 201, lease.text
    lid = lease.json()["id"]
    assert lease.json()["gpu_id"] == "n9/1"
    again = put(url, "n9", [whole("n9/0"), whole("n9/1")]).json()
    assert (again["added"], again["removed"], again["revoked"]) == ([], [], [])

    r = put(url, "n9", [whole("n9/0", healthy=False)])  # n9/1 vanished, n9/0 failed
    assert r.status_code == 200, r.text
    assert r.json()["removed"] == ["n9/1/whole"] and r.json()["revoked"] == [lid]
    assert r.json()["health"] == ["n9/0/whole"]
    got = httpx.get(f"{url}/v1/leases/{lid}", headers=h(A), timeout=10).json()
    assert got["state"] == "revoked" and "n9/1/whole vanished" in got["reason"]
    assert ("n9/0/whole", False, 0) in state(c) and all(s[0] != "n9/1/whole" for s in state(c))

    r = put(url, "n9", [whole("n9/0", vram_mib=40000)])  # reshaped: replaced, healthy again
    assert r.json()["removed"] == ["n9/0/whole"] and r.json()["added"] == ["n9/0/whole"]
    assert ("n9/0/whole", True, 0) in state(c)


@pytest.mark.parametrize(
    ("slices", "field", "value"),
    [
        ([{**whole("n9/0"), "kind": "shared"}], "kind", "shared"),
        ([{**whole("n9/0"), "vram_mib": 0}], "vram_mib", "0"),
        ([{**whole("n9/0"), "compute_milli": 1001}], "compute_milli", "1001"),
        ([{**whole("n9/0"), "colour": "red"}], "colour", "red"),
        ([whole("n9/0"), whole("n9/0")], "slices[1].id", "n9/0/whole"),
        ([{**whole("n9/0"), "gpu_id": "gpu-a/0"}], "slices[0].gpu_id", "gpu-a/0"),
        ([{**whole("n9/0"), "id": "gpu-c/0", "gpu_id": "n9/0"}], "slices[0].id", "gpu-c/0"),
    ],
)
def test_bad_input_is_a_4xx_naming_field_and_value_and_changes_nothing(
    gw: tuple[str, LeaseController], slices: list[dict[str, Any]], field: str, value: str
) -> None:
    url, c = gw
    before = state(c)
    r = put(url, "n9", slices)
    assert 400 <= r.status_code < 500, r.text
    text = json.dumps(r.json())
    assert field in text and value in text, text
    assert state(c) == before


def test_only_admins_publish_slices(gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    before = state(c)
    assert put(url, "n9", [whole("n9/0")], tok=A).status_code == 403
    assert put(url, "n9", [whole("n9/0")], tok="nobody-token-000").status_code == 401
    assert state(c) == before
