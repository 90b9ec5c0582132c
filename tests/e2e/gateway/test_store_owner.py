"""One process at a time on a SQLite lease store, as real subprocesses: a second `gpupool serve` on
the same data dir (two in-memory ledgers over one file would each grant the same capacity), a
`gpupool run` (which starts from an empty store) and a `gpupool store repair` are refused with one
line while a gateway runs there, and leave its store and its leases as they were; after a
``kill -9`` of the gateway the lock is gone and a new one starts."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
from pathlib import Path

import httpx

from gpupool.cli.serving import free_port
from tests.e2e.gateway.serving import start_serve
from tests.e2e.gateway.test_store_cli import gpupool, one_line
from tests.e2e.gateway.test_store_faults import LEASE, A, h


def test_a_second_process_on_a_served_store_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {A}, tenant: a, role: tenant}}\n")
    data = tmp_path / "data"
    port = free_port()
    first = start_serve(data, auth, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h(A), timeout=10) as cl:
            kept = cl.post("/v1/leases", json={**LEASE, "ttl_s": 600})
            assert kept.status_code == 201, kept.text
            store = data / "leases.db"
            ended = cl.post("/v1/leases", json=LEASE).json()["id"]
            assert cl.delete(f"/v1/leases/{ended}").status_code == 200
            with contextlib.closing(sqlite3.connect(store)) as db, db:  # damage repair would quarantine
                db.execute("UPDATE leases SET body='{not json' WHERE id=?", (ended,))
            for args in (
                ("serve", "--port", str(free_port()), "--auth-file", str(auth)),
                ("run", "--port", str(free_port()), "--no-traffic", "--no-agents", "--no-kubernetes"),
                ("store", "repair"),
            ):
                r = gpupool(*args, "--data-dir", str(data), timeout_s=60)
                line = one_line(r)
                assert r.returncode == 2, (args, r.stdout, r.stderr)
                assert f"lease store {store} is in use by another gpupool process (pid {first.pid})" in line
                assert store.is_file()
                assert [x["id"] for x in cl.get("/v1/leases").json()["leases"]] == [kept.json()["id"]]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        first = start_serve(data, auth, port)  # the kernel dropped the dead gateway's lock
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h(A), timeout=10) as cl:
            assert [x["id"] for x in cl.get("/v1/leases").json()["leases"]] == [kept.json()["id"]]
    finally:
        first.kill()
        first.wait(10)
    assert gpupool("store", "check", "--data-dir", str(data)).returncode == 1
    r = gpupool("store", "repair", "--data-dir", str(data))  # the gateway is gone: now it may
    assert r.returncode == 0 and f"quarantined table leases, row id={ended!r}" in r.stdout, r.stderr


def test_store_check_reads_a_served_store(tmp_path: Path) -> None:
    """`check` only reads: it may look at the store of a running gateway."""
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {A}, tenant: a, role: tenant}}\n")
    port = free_port()
    p = start_serve(tmp_path / "data", auth, port)
    try:
        r = gpupool("store", "check", "--data-dir", str(tmp_path / "data"))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        p.kill()
        p.wait(10)


def test_a_sigterm_closes_the_store_and_its_write_ahead_log(tmp_path: Path) -> None:
    """A clean stop folds SQLite's write-ahead log into leases.db: a copy of that one file is the
    whole store (a lease granted before the stop is in it), and the next start finds no log."""
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {A}, tenant: a, role: tenant}}\n")
    data, port = tmp_path / "data", free_port()
    proc = start_serve(data, auth, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h(A), timeout=10) as cl:
            kept = cl.post("/v1/leases", json={**LEASE, "ttl_s": 600})
            assert kept.status_code == 201, kept.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait(10)
    assert not (data / "leases.db-wal").exists() and not (data / "leases.db-shm").exists()
    with contextlib.closing(sqlite3.connect(data / "leases.db")) as db:
        assert db.execute("SELECT count(*) FROM leases WHERE id=?", (kept.json()["id"],)).fetchone() == (1,)
