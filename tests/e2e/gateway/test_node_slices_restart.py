"""Slices that node agents published (``PUT /v1/nodes/{node}/slices``) outlive a gateway restart:
`gpupool serve`'s builder, stopped and built again on the same data directory, still has a node
that only its agent announced, and the leases granted on its slices come back active (not revoked
as "unknown slice" before the agent publishes again), with and without simulated readings."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gpupool.cli.serve import build
from tests.adapters.http.servers import running

ADMIN, TENANT = "ns-admin-token-0001", "ns-tenant-token-001"


def whole(gpu: str) -> dict[str, object]:
    return {"id": f"{gpu}/whole", "gpu_id": gpu, "kind": "whole", "vram_mib": 81920, "compute_milli": 1000}


@pytest.mark.parametrize("simulate", [False, True])
def test_published_slices_and_their_leases_survive_a_restart(tmp_path: Path, simulate: bool) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {TENANT}, tenant: a, role: tenant}}\n"
    )
    data = tmp_path / "d"
    adm = {"Authorization": f"Bearer {ADMIN}"}
    with running(build(data_dir=data, auth_file=auth, simulate=simulate).app) as url:
        r = httpx.put(f"{url}/v1/nodes/n9/slices", json={"slices": [whole("n9/0")]}, headers=adm, timeout=10)
        assert r.status_code == 200, r.text
        r = httpx.post(
            f"{url}/v1/leases",
            headers={"Authorization": f"Bearer {TENANT}"},
            json={"priority": "P1", "vram_mib": 40000, "ttl_s": 600, "gpu_id": "n9/0"},
            timeout=10,
        )
        assert r.status_code == 201, r.text
        lease_id = r.json()["id"]

    bundle = build(data_dir=data, auth_file=auth, simulate=simulate)
    assert "n9/0/whole" in {st.slice.id for st in bundle.controller.allocator.states()}
    with running(bundle.app) as url:
        got = httpx.get(f"{url}/v1/leases/{lease_id}", headers=adm, timeout=10).json()
        assert got["state"] == "active", got
        assert got["slice_id"] == "n9/0/whole"
        # the agent publishing the same list again changes nothing
        body = {"slices": [whole("n9/0")]}
        again = httpx.put(f"{url}/v1/nodes/n9/slices", json=body, headers=adm, timeout=10)
        assert again.json() == {
            "node": "n9", "slices": 1, "added": [], "removed": [], "health": [], "revoked": [],
        }  # fmt: skip
