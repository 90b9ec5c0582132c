"""The gateway over real HTTP on a store that runs out of space: a refused write is a 503 carrying
SQLite's own error and Retry-After, memory stays equal to the store (nothing listed that is not
stored, a refused DELETE leaves the lease active), and /healthz recovers with the store. A store
whose write lock another connection holds: reads and /healthz go on, writes after the first are
refused at once, and everything answered 2xx is stored.

Two stores: a fault-injecting wrapper over real SQLite (always runs) and, where a tmpfs can be
mounted (root), the real ``gpupool serve`` on a 1 MiB filesystem that is filled up for real."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.metrics.gateway import GatewayMetrics
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.adapters.store.sqlite import HURRIED_BUSY_TIMEOUT_MS
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


# ------------------------------------------------------------------ a store locked by another process

LOCKED = "database is locked"


class ProbeGatedStore(SqliteLeaseStore):
    """Real SQLite whose /healthz probe write says ``probing`` and then waits for ``gate`` (set by
    the test) before it goes to SQLite: the test knows when a probe is in progress."""

    def __init__(self, path: Path, **options: int) -> None:
        super().__init__(path, **options)
        self.probing = threading.Event()
        self.probed = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def set_meta(self, key: str, value: str) -> None:
        if key == "health_probe":
            self.probing.set()
            self.gate.wait(30)
            self.probed.set()
        super().set_meta(key, value)


@contextlib.contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """A second connection holding the file's write lock (as a ``sqlite3`` shell or a backup would)."""
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_a_store_locked_by_another_connection_does_not_stall_the_gateway(tmp_path: Path) -> None:
    """It did: every write, and every /healthz probe write, waited the whole busy timeout on the
    event loop, and every request (reads included) waited behind it."""
    path = tmp_path / "leases.db"
    store = ProbeGatedStore(path, busy_timeout_ms=1000)
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (A, "a", "tenant")])
    app = create_app(c, tokens=tokens, metrics=GatewayMetrics(c), tick_s=0.05)
    with running(app) as url, httpx.Client(base_url=url, headers=h(A), timeout=20) as cl:
        kept = cl.post("/v1/leases", json=LEASE)
        assert kept.status_code == 201, kept.text
        kid = kept.json()["id"]
        with write_locked(path):
            r = cl.post("/v1/leases", json=LEASE)  # the first write waits the busy timeout once
            assert r.status_code == 503 and LOCKED in r.text and int(r.headers["Retry-After"]) >= 1, r.text
            assert store.busy_timeout_ms == HURRIED_BUSY_TIMEOUT_MS  # the next ones do not
            store.gate.clear()
            with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=url, timeout=20) as other:
                health = pool.submit(other.get, "/healthz")
                assert store.probing.wait(20)
                # the probe write is in progress (held at the gate): reads are answered meanwhile
                assert cl.get(f"/v1/leases/{kid}").json()["state"] == "active"
                assert cl.get("/v1/pool").status_code == 200
                assert cl.get("/metrics").status_code == 200
                assert not store.probed.is_set()
                store.gate.set()
                answer = health.result(timeout=20).json()
            assert answer["ok"] is False and LOCKED in answer["store_error"], answer
            answer = cl.get("/healthz").json()  # this probe reached SQLite: its own error
            assert answer["ok"] is False and LOCKED in answer["store_error"], answer
            r = cl.delete(f"/v1/leases/{kid}")
            assert r.status_code == 503 and LOCKED in r.text and "Retry-After" in r.headers, r.text
            assert [x.id for x in c.leases()] == [kid] and c.get(kid).state.value == "active"
            c.check_invariants()
        assert stored_active(path) == [kid]
        assert cl.get("/healthz").json() == {"ok": True}
        assert store.busy_timeout_ms == 1000
        again = cl.post("/v1/leases", json=LEASE)
        assert again.status_code == 201, again.text
        assert stored_active(path) == sorted([kid, again.json()["id"]]) == sorted(x.id for x in c.leases())
    store.close()


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
        assert sorted(p.name for p in data.iterdir()) == []  # (no store opened: no lock file either)
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
