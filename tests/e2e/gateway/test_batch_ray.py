"""Batch jobs on Ray through the real commands (opt-in: skipped with the reason when ray is not
installed; ``pip install 'gpupool[ray]'``). The test starts a local Ray head on loopback, then
``gpupool serve --ray-address`` as a child process, and drives the queue with ``gpupool batch``:

- a submitted job runs as a Ray task holding a P2 lease from the gateway's controller;
- when that lease is taken away (its GPU drained with revocation) the job is requeued (Ray cannot
  freeze a task in place) and runs again with a new lease once capacity is back;
- ``gpupool batch cancel`` stops the task and releases its lease; a second cancel exits 2.

Waits are liveness bounds, not timing assertions.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed here (pip install 'gpupool[ray]')")
httpx = pytest.importorskip("httpx")

from tests.ray_cluster import ray_head_cluster  # noqa: E402

pytestmark = pytest.mark.slow
TOKEN = "ray-e2e-admin-token-0001"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(pred: Callable[[], object], what: str, s: float = 90.0) -> None:
    end = time.monotonic() + s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"not reached within {s} s: {what}")


@pytest.fixture
def ray_head() -> Iterator[str]:
    tmp = Path(tempfile.gettempdir()) / f"ray-{os.getpid()}"  # Ray's socket paths must stay short
    try:
        with ray_head_cluster(tmp, force_stop=True) as address:
            yield address
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gpupool(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from gpupool.cli.main import main; main()", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def test_a_batch_job_runs_on_ray_with_a_p2_lease_is_requeued_and_cancelled(
    tmp_path: Path, ray_head: str
) -> None:
    data = tmp_path / "gw"
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {TOKEN}, tenant: ops, role: admin}}\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GPUPOOL_TOKEN": TOKEN}
    cmd = [sys.executable, "-c", "from gpupool.cli.main import main; main()", "serve", "--port", str(port)]
    cmd += ["--data-dir", str(data), "--auth-file", str(auth), "--ray-address", ray_head]
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    hdr = {"Authorization": f"Bearer {TOKEN}"}

    def job(job_id: str) -> dict[str, object]:
        out = gpupool("batch", "list", "--json", "--url", url, env=env).stdout
        return next(j for j in json.loads(out) if j["id"] == job_id)

    def lease(lease_id: object) -> dict[str, object]:
        return dict(httpx.get(f"{url}/v1/leases/{lease_id}", headers=hdr, timeout=10).json())

    try:
        _wait(lambda: _up(url), "the gateway is up", 60)
        sleeper = "import time\nwhile True: time.sleep(0.2)\n"
        argv = ("--vram-mib", "8192", "--", sys.executable, "-c", sleeper)
        r = gpupool("batch", "submit", "--url", url, "--id", "sleepy", *argv, env=env)
        assert r.stdout.split() == ["sleepy", "queued"]
        _wait(lambda: job("sleepy")["state"] == "running", "the job runs on Ray")
        first = job("sleepy")
        held = lease(first["lease_id"])
        assert held["priority"] == -1 and held["state"] == "active", held  # P2
        assert held["vram_mib"] == 8192, held

        # the lease is taken away: Ray cannot freeze the task, so the job is requeued
        gpu = held["grants"][0]["gpu_id"]  # type: ignore[index]
        r2 = httpx.post(f"{url}/v1/admin/gpus/{gpu}/drain", headers=hdr, json={"revoke": True}, timeout=10)
        assert r2.status_code == 200 and first["lease_id"] in r2.json()["leases"]
        _wait(
            lambda: job("sleepy")["attempts"] >= 2 or "requeued" in str(job("sleepy")["reason"]), "requeued"
        )
        _wait(
            lambda: job("sleepy")["state"] == "running" and job("sleepy")["lease_id"] != first["lease_id"],
            "rerun",
        )
        again = job("sleepy")
        assert lease(first["lease_id"])["state"] == "revoked"
        assert lease(again["lease_id"])["grants"][0]["gpu_id"] != gpu  # type: ignore[index]
        events = gpupool("batch", "list", "--url", url, env=env).stdout
        assert "sleepy\trunning" in events

        # cancel: the Ray task is cancelled and the lease released; a second cancel is refused
        r = gpupool("batch", "cancel", "sleepy", "--url", url, env=env)
        assert "cancelled" in r.stdout
        assert job("sleepy")["state"] == "cancelled"
        assert lease(again["lease_id"])["state"] == "released"
        r = gpupool("batch", "cancel", "sleepy", "--url", url, env=env, check=False)
        assert r.returncode == 2 and "409" in r.stderr
    finally:
        serve.terminate()
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        log.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_ray_address_ray_cannot_parse_stops_serve_with_one_line_naming_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = gpupool(
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "gw"),
        "--ray-address",
        "nosuch://x",
        env=env,
        check=False,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert lines[-1].startswith("gpupool: error: invalid --ray-address='nosuch://x': "), r.stderr
