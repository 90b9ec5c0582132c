"""Error messages show the offending value as JSON, as the client sent it (``true``, ``null``,
``"x"``), never as a Python repr (``True``, ``None``, ``'x'``): over real HTTP on loopback and
through the real CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx

from gpupool.cli.serve import build
from gpupool.cli.tidalplane import attach_tidal
from gpupool.core import ManualClock
from gpupool.core.ports import Backend
from gpupool.core.tidal.plane import plane_config
from tests.adapters.http.servers import served

TOKEN = "error-values-admin"
HDR = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "qwen2.5-0.5b"
PY_FORMS = ("True", "None", "'")
CLI = (sys.executable, "-m", "gpupool.cli.main")


async def _http_errors(tmp_path: Path) -> None:
    bundle = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    be = Backend("be", MODEL, "http://127.0.0.1:9", node="gpu-a", gpu_id="gpu-a/0", kv_budget_mib=4096)
    bundle.controller.register_backend(be)
    noon = datetime(2026, 3, 2, 12, tzinfo=ZoneInfo("UTC")).timestamp()
    cfg = plane_config({"timezone": "UTC"})
    rt = attach_tidal(bundle, config=cfg, data_dir=tmp_path, clock=ManualClock(noon))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with served(bundle.app) as url, httpx.AsyncClient(base_url=url, headers=HDR, timeout=10) as cl:
            r = await cl.post("/v1/leases", json={"priority": True, "vram_mib": 1024})
            assert r.status_code == 422 and "priority" in r.json()["field"], r.text
            assert "=true:" in r.json()["error"] and "True" not in r.json()["error"], r.text
            r = await cl.post("/v1/chat/completions", json={**chat, "max_tokens": True})
            msg = r.json()["error"]["message"]
            assert r.status_code == 400 and msg.endswith("got true"), r.text  # before: got True
            r = await cl.post("/v1/chat/completions", json=chat, headers={"x-gpupool-priority": "P7"})
            msg = r.json()["error"]["message"]
            assert r.status_code == 400 and 'x-gpupool-priority="P7"' in msg, r.text  # before: 'P7'
            job = {"id": "j1", "command": [sys.executable, "-c", "pass"], "vram_mib": 1024}
            r = await cl.post("/v1/batch/jobs", json=job)
            assert r.status_code == 201, r.text
            r = await cl.post("/v1/batch/jobs", json=job)
            assert r.status_code == 409 and r.json()["error"] == 'invalid id="j1": already exists', r.text
            for bad in ({**job, "id": "j2", "checkpointable": None}, {**job, "id": "j3", "tenant": True}):
                r = await cl.post("/v1/batch/jobs", json=bad)
                assert r.status_code == 422, r.text
                assert not any(p in r.json()["error"] for p in PY_FORMS), r.text
            jobs = (await cl.get("/v1/batch/jobs")).json()["jobs"]
            assert [j["id"] for j in jobs] == ["j1"]  # nothing else was kept
    finally:
        if rt.batch is not None:
            rt.batch.close()
        bundle.controller.store.close()


def test_json_values_in_http_error_messages(tmp_path: Path) -> None:
    asyncio.run(_http_errors(tmp_path))


def test_cli_shows_a_config_files_values_as_json(tmp_path: Path) -> None:
    """``priority: true`` in an objectives file: exit 2, the message shows ``true``. Before: True."""
    bad = tmp_path / "objectives.json"
    bad.write_text(json.dumps({"objectives": [{"name": "chat", "priority": True}]}))
    r = subprocess.run(
        [*CLI, "serve", "--objectives", str(bad), "--data-dir", str(tmp_path / "d"), "--port", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "invalid objectives[0].priority=true: expected P0, P1, P2 or an integer" in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()
