"""A backend named in ``gpupool serve --backends`` serves only while its model instance holds a
placement lease: after a drain that revoked that lease and an undrain, the real `gpupool serve`
places it again on its slice (the slice is not left free under a running instance for another
lease to take), and requests through the proxy are served again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gpupool.bench.httpload import stop, wait_http
from gpupool.cli.serving import free_port

ADMIN = "instance-admin-token-01"
TENANT = "instance-tenant-token-01"
MODEL = "qwen2.5-0.5b"
SLICE = "n0/0/mps-llm-0"


def _gpupool(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", *args],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=f,
            stderr=f,
        )


def _instance_leases(cl: httpx.Client) -> list[dict[str, Any]]:
    leases = cl.get("/v1/leases").json()["leases"]
    return [x for x in leases if x["labels"].get("instance") == "b0" and x["state"] == "active"]


def test_a_revoked_instance_lease_is_placed_again_after_the_undrain(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(
        "nodes:\n  - name: n0\n    gpus: [{model: H100-SXM5-80GB, count: 1}]\n"
    )
    (tmp_path / "workloads.yaml").write_text(
        f"workloads:\n  - {{name: llm, model: {MODEL}, priority: P1, replicas: 1, isolation: any}}\n"
    )
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {TENANT}, tenant: t, role: tenant}}\n"
    )
    bport, port = free_port(), free_port()
    (tmp_path / "backends.yaml").write_text(
        f"backends:\n  - {{id: b0, model: {MODEL}, url: 'http://127.0.0.1:{bport}', slice_id: {SLICE}}}\n"
    )
    log = tmp_path / "log.txt"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            _gpupool("emulate-backend", "--model", MODEL, "--port", str(bport), "--speed", "1000", log=log)
        )
        wait_http(f"http://127.0.0.1:{bport}/v1/models", procs[-1], what="backend")
        procs.append(
            _gpupool(
                "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"),
                "--cluster", str(tmp_path / "cluster.yaml"), "--workloads", str(tmp_path / "workloads.yaml"),
                "--auth-file", str(auth), "--backends", str(tmp_path / "backends.yaml"),
                "--no-simulate-readings", "--no-tidal", log=log,
            )
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/healthz", procs[-1], what="gateway")
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10) as cl:
            (first,) = _instance_leases(cl)
            assert [g["slice_id"] for g in first["grants"]] == [SLICE]
            r = cl.post("/v1/admin/gpus/n0/0/drain", json={"revoke": True, "reason": "maintenance"})
            assert r.status_code == 200 and first["id"] in r.json()["leases"], r.text
            assert _instance_leases(cl) == []
            r = cl.post("/v1/admin/gpus/n0/0/drain", json={"undo": True})
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + 30
            while not _instance_leases(cl) and time.monotonic() < deadline:
                time.sleep(0.1)
            (again,) = _instance_leases(cl)  # placed again by the gateway, on the same slice
            assert again["id"] != first["id"] and [g["slice_id"] for g in again["grants"]] == [SLICE]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {TENANT}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    finally:
        stop(procs[::-1])
