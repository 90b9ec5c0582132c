"""A damaged row the gateway reads while serving (an ended lease asked for after a restart) is a 503
naming the file, the row and the command to run, never a 500; the rest of the API keeps working."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running

ADMIN = "admin-token-0001"
LEASE = {"priority": "P1", "vram_mib": 1024, "compute_pct": 5, "kinds": ["mig"]}


def _app(db: Path):  # type: ignore[no-untyped-def]
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=SqliteLeaseStore(db))
    c.recover()
    return create_app(c, tokens=TokenTable([(ADMIN, "ops", "admin")]))


def test_a_damaged_ended_row_read_while_serving_is_503_naming_it(tmp_path: Path) -> None:
    db = tmp_path / "leases.db"
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with running(_app(db)) as url, httpx.Client(base_url=url, timeout=20) as cl:
        r = cl.post("/v1/leases", json=LEASE, headers=auth)
        assert r.status_code == 201, r.text
        lid = r.json()["id"]
        assert cl.delete(f"/v1/leases/{lid}", headers=auth).status_code == 200
    with sqlite3.connect(db) as con:
        con.execute("UPDATE leases SET body='{not json' WHERE id=?", (lid,))
    with running(_app(db)) as url, httpx.Client(base_url=url, timeout=20) as cl:
        r = cl.get(f"/v1/leases/{lid}", headers=auth)
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["code"] == "store_damaged"
        assert str(db) in body["error"] and "gpupool store repair" in body["error"]
        assert cl.post("/v1/leases", json=LEASE, headers=auth).status_code == 201  # the rest still works
