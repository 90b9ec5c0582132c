"""Backpressure end to end on the simulated example cluster: a GPU pushed past 88 % VRAM makes P2
acquisitions on it get 429 (+ Retry-After) and P2 holders on it receive a pause event on /v1/events;
between 70 % and 88 % nothing changes (hysteresis); at <= 70 % they receive resume and P2 is admitted."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx

from gpupool.cli.serve import build
from tests.adapters.http.servers import running

ADMIN, BATCH, ONLINE = "bp-admin-token-0001", "bp-batch-token-0001", "bp-online-token-001"


def test_watermark_backpressure_pause_and_resume(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {BATCH}, tenant: batch, role: tenant}}\n"
        f"  - {{token: {ONLINE}, tenant: online, role: tenant}}\n"
    )
    bundle = build(data_dir=tmp_path / "d", auth_file=auth, simulate=True)
    sim = bundle.sim
    with running(bundle.app) as url:
        adm = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        bt = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {BATCH}"}, timeout=10)
        on = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ONLINE}"}, timeout=10)
        pool = adm.get("/v1/pool").json()
        node, gpu = next(
            (n["node"], g["gpu_id"])
            for n in pool["nodes"]
            for g in n["gpus"]
            if any(s["free"]["vram_mib"] >= 4096 and s["kind"] != "time-slice" for s in g["slices"])
        )
        held = bt.post("/v1/leases", json={"priority": "P2", "vram_mib": 1024, "gpu_id": gpu})
        assert held.status_code == 201, held.text
        lease_id = held.json()["id"]

        events: list[dict[str, Any]] = []
        ready = threading.Event()

        def listen() -> None:
            with (
                httpx.Client(base_url=url, timeout=15) as cl,
                cl.stream("GET", "/v1/events", headers={"Authorization": f"Bearer {BATCH}"}) as r,
            ):
                ready.set()
                kind = ""
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind in ("pause", "resume"):
                        events.append({"kind": kind, **json.loads(line[6:])})
                        if kind == "resume":
                            return

        t = threading.Thread(target=listen, daemon=True)
        t.start()
        assert ready.wait(5)

        def push(frac: float) -> dict[str, Any]:
            snap = sim.read(node)
            total = next(g.memory_total_mib for g in snap.gpus if f"{node}/{g.index}" == gpu)
            sim.force(gpu, memory_used_mib=int(total * frac))
            snap = sim.read(node)
            body = {
                "gpus": [
                    {
                        "gpu_id": f"{node}/{g.index}",
                        "vram_used_mib": g.memory_used_mib,
                        "vram_total_mib": g.memory_total_mib,
                        "temperature_c": g.temperature_c,
                    }
                    for g in snap.gpus
                ]
            }
            r = adm.post(f"/v1/nodes/{node}/readings", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        assert (
            bt.post(
                f"/v1/nodes/{node}/readings",
                json={"gpus": [{"gpu_id": gpu, "vram_used_mib": 1, "vram_total_mib": 2}]},
            ).status_code
            == 403
        )
        out = push(0.90)
        assert {"gpu_id": gpu, "signal": "pause", "lease_ids": [lease_id]} in out["signals"]
        p2 = bt.post("/v1/leases", json={"priority": "P2", "vram_mib": 1024, "gpu_id": gpu})
        assert p2.status_code == 429 and int(p2.headers["retry-after"]) >= 1
        assert p2.json()["code"] == "backpressure"
        assert (
            on.post("/v1/leases", json={"priority": "P1", "vram_mib": 1024, "gpu_id": gpu}).status_code == 201
        )
        assert gpu in adm.get("/v1/pool").json()["paused_gpus"]
        assert push(0.80)["signals"] == []  # hysteresis: still paused between 70 % and 88 %
        assert (
            bt.post("/v1/leases", json={"priority": "P2", "vram_mib": 1024, "gpu_id": gpu}).status_code == 429
        )
        out = push(0.65)
        assert any(s["signal"] == "resume" and s["gpu_id"] == gpu for s in out["signals"])
        assert (
            bt.post("/v1/leases", json={"priority": "P2", "vram_mib": 1024, "gpu_id": gpu}).status_code == 201
        )
        t.join(10)
        kinds = [(e["kind"], e["gpu_id"]) for e in events]
        assert kinds == [("pause", gpu), ("resume", gpu)]
        assert events[0]["lease_ids"] == [lease_id]
        metrics = httpx.get(url + "/metrics").text
        assert "gpupool_backpressure" in metrics and "gpupool_admission_total" in metrics
        for c in (adm, bt, on):
            c.close()
