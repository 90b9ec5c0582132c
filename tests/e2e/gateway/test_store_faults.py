"""The gateway over real HTTP on a store that runs out of space: a refused write is a 503 carrying
SQLite's own error and Retry-After, memory stays equal to the store (nothing listed that is not
stored, a refused DELETE leaves the lease active), and /healthz recovers with the store.

Two stores: a fault-injecting wrapper over real SQLite (always runs) and, where a tmpfs can be
mounted (root), the real ``gpupool serve`` on a 1 MiB filesystem that is filled up for real."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.serving import free_port
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running
from tests.adapters.store.faulty import DISK_FULL, FaultyStore
from tests.e2e.gateway.serving import serve_argv, start_serve

ADMIN, A = "admin-token-0001", "tenant-a-token-1"
LEASE = {"priority": "P1", "vram_mib": 1024, "compute_pct": 5, "kinds": ["mig"]}


def h(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[tuple[str, LeaseController, FaultyStore, Path]]:
    path = tmp_path / "leases.db"
    store = FaultyStore(SqliteLeaseStore(path))
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (A, "a", "tenant")])
    with running(create_app(c, tokens=tokens, tick_s=0.05)) as url:
        yield url, c, store, path
    store.close()


def stored_active(path: Path) -> list[str]:
    s = SqliteLeaseStore(path)
    try:
        return [x.id for x in s.active()]
    finally:
        s.close()


def test_refused_writes_are_503_with_the_real_error_and_undone(
    gw: tuple[str, LeaseController, FaultyStore, Path],
) -> None:
    url, c, store, path = gw
    with httpx.Client(base_url=url, headers=h(A)) as cl:
        kept = cl.post("/v1/leases", json=LEASE)
        assert kept.status_code == 201, kept.text
        kid = kept.json()["id"]
        store.disk_full()
        r = cl.post("/v1/leases", json=LEASE)
        assert r.status_code == 503 and DISK_FULL in r.text, r.text
        assert "rollback" not in r.text and int(r.headers["Retry-After"]) >= 1
        assert [x["id"] for x in cl.get("/v1/leases").json()["leases"]] == [kid]
        d = cl.delete(f"/v1/leases/{kid}")
        assert d.status_code == 503 and DISK_FULL in d.text, d.text
        assert cl.get(f"/v1/leases/{kid}").json()["state"] == "active"
        health = cl.get("/healthz").json()
        assert health["ok"] is False and DISK_FULL in health["store_error"]
        c.check_invariants()
        assert [x.id for x in c.leases()] == stored_active(path) == [kid]
        store.heal()
        assert cl.get("/healthz").json() == {"ok": True}  # no write needed to notice the recovery
        d = cl.delete(f"/v1/leases/{kid}")
        assert d.status_code == 200 and d.json()["state"] == "released"
        assert cl.get(f"/v1/leases/{kid}").json()["state"] == "released"
        assert stored_active(path) == [] and c.leases() == []


def test_refused_watermark_change_keeps_the_old_thresholds(
    gw: tuple[str, LeaseController, FaultyStore, Path],
) -> None:
    url, c, store, _ = gw
    before = c.bank.config
    store.disk_full()
    with httpx.Client(base_url=url, headers=h(ADMIN)) as cl:
        r = cl.patch("/v1/admin/watermarks", json={"vram_high": 0.8})
        assert r.status_code == 503 and DISK_FULL in r.text, r.text
        assert c.bank.config == before and store.inner.get_meta("watermarks") is None
        store.heal()
        assert cl.patch("/v1/admin/watermarks", json={"vram_high": 0.8}).status_code == 200
        assert c.bank.config.vram_high == 0.8 and store.inner.get_meta("watermarks") is not None


# ------------------------------------------------------------------ a real full filesystem


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str = "1m") -> Iterator[Path]:
    where.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, check=False
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path) -> Path:
    """Write one file until the filesystem has no block left."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
def test_real_serve_on_a_full_tmpfs(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {A}, tenant: a, role: tenant}}\n")
    with tiny_tmpfs(tmp_path / "fs") as fs:
        data = fs / "data"
        port = free_port()
        p = start_serve(data, auth, port)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h(A), timeout=10) as cl:
                kept = cl.post("/v1/leases", json=LEASE)
                assert kept.status_code == 201, kept.text
                filler = fill(fs)
                refused = [cl.post("/v1/leases", json={**LEASE, "labels": {"n": str(i)}}) for i in range(200)]
                assert refused[-1].status_code == 503, refused[-1].text
                assert DISK_FULL in refused[-1].text and "rollback" not in refused[-1].text
                acked = {kept.json()["id"]} | {r.json()["id"] for r in refused if r.status_code == 201}
                listed = {x["id"] for x in cl.get("/v1/leases").json()["leases"]}
                assert listed == acked
                assert cl.get("/healthz").json()["ok"] is False
                filler.unlink()
                assert cl.get("/healthz").json() == {"ok": True}
                assert cl.post("/v1/leases", json=LEASE).status_code == 201
                listed = {x["id"] for x in cl.get("/v1/leases").json()["leases"]}
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            p = start_serve(data, auth, port)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h(A), timeout=10) as cl:
                assert {x["id"] for x in cl.get("/v1/leases").json()["leases"]} == listed
        finally:
            p.kill()
            p.wait(10)


@pytest.mark.slow
def test_real_serve_restarted_on_a_full_tmpfs_says_so_in_one_line(tmp_path: Path) -> None:
    """A gateway stopped and started again on a filesystem that filled up meanwhile: one line naming
    the file it could not open (exit 2), never a traceback; with space back it starts with its lease."""
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {A}, tenant: a, role: tenant}}\n")
    with tiny_tmpfs(tmp_path / "fs") as fs:
        data = fs / "data"
        port = free_port()
        p = start_serve(data, auth, port)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h(A), timeout=10) as cl:
                kept = cl.post("/v1/leases", json={**LEASE, "ttl_s": 600})
                assert kept.status_code == 201, kept.text
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
        filler = fill(fs)
        r = subprocess.run(
            serve_argv(data, auth, port),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert len(r.stderr.strip().splitlines()) == 1 and str(data) in line, r.stderr
        assert "full" in line or "I/O error" in line, line
        filler.unlink()
        p = start_serve(data, auth, port)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h(A), timeout=10) as cl:
                assert [x["id"] for x in cl.get("/v1/leases").json()["leases"]] == [kept.json()["id"]]
        finally:
            p.kill()
            p.wait(10)


@pytest.mark.parametrize("command", ["serve", "run"])
def test_a_first_start_on_a_full_filesystem_says_so_in_one_line(tmp_path: Path, command: str) -> None:
    """No --auth-file: the admin token could not be written. It was a traceback, and the empty
    ``admin.token`` it left made every later start fail on that file instead. The batch queue is
    now opened first (`gpupool.cli.batch_first`), so on a full disk that is what says so, and
    nothing is left behind."""
    with tiny_tmpfs(tmp_path / "fs") as fs:
        data = fs / "data"
        data.mkdir()
        filler = fill(fs)
        argv = [sys.executable, "-m", "gpupool.cli.main", command, "--port", "0", "--data-dir", str(data)]
        argv += ["--no-traffic", "--no-agents"] if command == "run" else []
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{data / 'batch.db'}: database or disk is full" in lines[0], r.stderr
        left = sorted(p.name for p in data.iterdir())  # (run takes the store's lock file first: a pid)
        assert left == ([] if command == "serve" else ["leases.db.lock"]), left
        filler.unlink()


def test_a_refused_health_mark_or_drain_changes_nothing(
    gw: tuple[str, LeaseController, FaultyStore, Path],
) -> None:
    """Marking a slice unhealthy (or draining its GPU) with ``revoke`` while the store refuses the
    revocations answered 503 and put the leases back, but left the slice unhealthy (the GPU drained,
    and stored as drained) in memory: a rejected request changed the pool."""
    from gpupool.adapters.http.context import stored_drained

    url, c, store, _ = gw
    with httpx.Client(base_url=url, headers=h(ADMIN)) as cl:
        lease = cl.post("/v1/leases", json=LEASE, headers=h(A))
        assert lease.status_code == 201, lease.text
        sid, gpu = lease.json()["grants"][0]["slice_id"], lease.json()["gpu_id"]
        store.disk_full()
        r = cl.post(f"/v1/admin/slices/{sid}/health", json={"healthy": False, "revoke": True})
        assert r.status_code == 503, r.text
        assert c.allocator.ledger.is_healthy(sid) and c.get(lease.json()["id"]).state.value == "active"
        store.disk_full(meta_ok=True)  # the drained list fits, the revocations do not
        r = cl.post(f"/v1/admin/gpus/{gpu}/drain", json={"revoke": True})
        assert r.status_code == 503, r.text
        assert gpu not in c.drained and c.allocator.ledger.is_healthy(sid)
        assert gpu not in stored_drained(c)
        assert c.get(lease.json()["id"]).state.value == "active"
        c.check_invariants()
        store.heal()
        assert cl.post(f"/v1/admin/gpus/{gpu}/drain", json={"revoke": True}).status_code == 200
        assert gpu in c.drained and gpu in stored_drained(c)
