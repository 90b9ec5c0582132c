"""An admin's drain outlives the gateway: the real `gpupool serve` is killed (-9) after a GPU was
drained and started again on the same data dir; the GPU is still drained (no new lease lands on it,
the lease it held is kept), and an undrain outlives the next restart the same way."""

from __future__ import annotations

from pathlib import Path

import httpx

from gpupool.cli.serving import free_port
from tests.e2e.gateway.serving import start_serve

ADMIN = "e2e-admin-token-0001"
GPU = "gpu-a/3"  # a whole A100 of the default cluster


def _drained(cl: httpx.Client) -> dict[str, bool]:
    return {g["gpu_id"]: g["drained"] for n in cl.get("/v1/pool").json()["nodes"] for g in n["gpus"]}


def test_a_drained_gpu_stays_drained_after_a_kill_and_restart(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n")
    data, port = tmp_path / "data", free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {ADMIN}"}
    proc = start_serve(data, auth, port, "--no-tidal")
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as cl:
            held = cl.post("/v1/leases", json={"vram_mib": 1024, "gpu_id": GPU, "ttl_s": 600})
            assert held.status_code == 201, held.text
            r = cl.post(f"/v1/admin/gpus/{GPU}/drain", json={"reason": "maintenance"})
            assert r.status_code == 200 and r.json()["drained"] is True, r.text
        proc.kill()
        proc.wait(10)
        proc = start_serve(data, auth, port, "--no-tidal")
        with httpx.Client(base_url=url, headers=headers, timeout=10) as cl:
            assert _drained(cl)[GPU] is True
            assert cl.get(f"/v1/leases/{held.json()['id']}").json()["state"] == "active"
            r = cl.post("/v1/leases", json={"vram_mib": 1024, "gpu_id": GPU})
            assert r.status_code == 503 and r.json()["code"] == "unresolvable", r.text
            r = cl.post(f"/v1/admin/gpus/{GPU}/drain", json={"undo": True})
            assert r.status_code == 200 and r.json()["drained"] is False, r.text
        proc.kill()
        proc.wait(10)
        proc = start_serve(data, auth, port, "--no-tidal")
        with httpx.Client(base_url=url, headers=headers, timeout=10) as cl:
            assert not any(_drained(cl).values())
            assert cl.post("/v1/leases", json={"vram_mib": 1024, "gpu_id": GPU}).status_code == 201
    finally:
        proc.kill()
        proc.wait(10)


def _healthy(cl: httpx.Client, sid: str) -> bool:
    return next(
        s["healthy"]
        for n in cl.get("/v1/pool").json()["nodes"]
        for g in n["gpus"]
        for s in g["slices"]
        if s["slice_id"] == sid
    )


def test_a_closed_slice_stays_closed_after_an_undrain_and_a_restart(tmp_path: Path) -> None:
    """An admin's slice mark is the admin's: an undrain of its GPU does not reopen it, a kill -9 and
    restart keep it closed, and only the admin's healthy mark reopens it (which outlives a restart)."""
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n")
    data, port = tmp_path / "data", free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {ADMIN}"}
    proc = start_serve(data, auth, port, "--no-tidal")
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as cl:
            sid = next(
                s["slice_id"]
                for n in cl.get("/v1/pool").json()["nodes"]
                for g in n["gpus"]
                if g["gpu_id"] == GPU
                for s in g["slices"]
            )
            r = cl.post(f"/v1/admin/slices/{sid}/health", json={"healthy": False, "reason": "bad fan"})
            assert r.status_code == 200, r.text
            assert cl.post(f"/v1/admin/gpus/{GPU}/drain", json={}).status_code == 200
            assert cl.post(f"/v1/admin/gpus/{GPU}/drain", json={"undo": True}).status_code == 200
            assert _healthy(cl, sid) is False  # the undrain reopened the GPU, not the admin's mark
        proc.kill()
        proc.wait(10)
        proc = start_serve(data, auth, port, "--no-tidal")
        with httpx.Client(base_url=url, headers=headers, timeout=10) as cl:
            assert _healthy(cl, sid) is False
            assert cl.post(f"/v1/admin/slices/{sid}/health", json={"healthy": True}).status_code == 200
            assert _healthy(cl, sid) is True
        proc.kill()
        proc.wait(10)
        proc = start_serve(data, auth, port, "--no-tidal")
        with httpx.Client(base_url=url, headers=headers, timeout=10) as cl:
            assert _healthy(cl, sid) is True
    finally:
        proc.kill()
        proc.wait(10)
