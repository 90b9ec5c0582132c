"""The gateway on the etcd store, end to end: the real app over HTTP, and `gpupool serve --store`.

Proves:
- leases granted over HTTP by a gateway on etcd are in etcd when the response is sent; a second
  gateway on the same etcd prefix (a restart, or the next leader) recovers them as they were and
  can release them; a released lease is ended in etcd too;
- ``gpupool serve --store etcd://...`` serves on etcd (a lease it grants is in etcd under the
  URL's prefix), and its bad store options are exit 2 naming the option and the value before
  anything starts (no data dir is created).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tests.adapters.http.servers import running

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store.etcd import open_etcd_store
from gpupool.adapters.store.etcd_server import LocalEtcd, free_port
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.errors import UserError
from gpupool.cli.store_options import store_settings
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.model import LeaseState

ADMIN, TENANT = "etcd-admin-token-001", "etcd-tenant-token-01"
AUTH = {"Authorization": f"Bearer {TENANT}"}


def gateway(url: str) -> tuple[LeaseController, object]:
    store = open_etcd_store(url)
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (TENANT, "a", "tenant")])
    return c, create_app(c, tokens=tokens, tick_s=0.05)


@pytest.mark.etcd
def test_leases_granted_over_http_are_in_etcd_and_a_second_gateway_recovers_them(etcd_url: str) -> None:
    c1, app1 = gateway(etcd_url)
    ids = []
    with running(app1) as url:
        for _ in range(3):
            r = httpx.post(
                f"{url}/v1/leases", headers=AUTH, json={"vram_mib": 1024, "ttl_s": 600}, timeout=10
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
    reader = open_etcd_store(etcd_url)
    assert sorted(x.id for x in reader.active()) == sorted(ids)
    c1.store.close()
    c2, app2 = gateway(etcd_url)  # a restart: the ledger is rebuilt from etcd
    with running(app2) as url:
        got = httpx.get(f"{url}/v1/leases/{ids[0]}", headers=AUTH, timeout=10)
        assert got.status_code == 200 and got.json()["state"] == "active"
        r = httpx.delete(f"{url}/v1/leases/{ids[0]}", headers=AUTH, timeout=10)
        assert r.status_code in (200, 204), r.text
    ended = reader.get(ids[0])
    assert ended is not None and ended.state is LeaseState.RELEASED
    assert sorted(x.id for x in reader.active()) == sorted(ids[1:])
    c2.store.close()
    reader.close()


def test_store_settings_check_the_options_in_pairs_and_name_them(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("x")
    assert store_settings(None) == {}
    assert store_settings("sqlite:///tmp/x.db") == {}
    ok = store_settings("etcd://h:1", cacert=pem, user="u", password="p")
    assert ok == {
        "cacert": str(pem),
        "cert": None,
        "key": None,
        "user": "u",
        "password": "p",
        "max_txn_ops": 128,
    }
    for args, kw, want in [
        ("etcd://h", {}, "invalid --store='etcd://h': endpoint 'h' is not host:port"),
        ("etcd://h:1,h:70000", {}, "invalid --store='etcd://h:1,h:70000': endpoint 'h:70000'"),
        ("mysql://h:1", {}, "invalid --store='mysql://h:1': expected sqlite:///PATH or etcd://"),
        ("sqlite:", {}, "invalid --store='sqlite:': no path"),
        ("sqlite:///x.db", {"user": "u"}, "--etcd-user needs --store etcd://"),
        ("etcd://h:1", {"cacert": tmp_path / "nope.pem"}, "invalid --etcd-cacert="),
        ("etcd://h:1", {"cert": pem}, "--etcd-cert and --etcd-key go together"),
        ("etcd://h:1", {"password": "p"}, "--etcd-user and --etcd-password go together"),
        ("etcd://h:1", {"max_txn_ops": 0}, "invalid --etcd-max-txn-ops=0: must be >= 1"),
        ("sqlite:///x.db", {"max_txn_ops": 256}, "--etcd-max-txn-ops needs --store etcd://"),
    ]:
        with pytest.raises(UserError) as e:
            store_settings(args, **kw)  # type: ignore[arg-type]
        assert want in str(e.value), str(e.value)


def gpupool(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_serve_refuses_a_bad_store_url_and_an_unreachable_etcd_with_exit_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = gpupool("serve", "--data-dir", str(data), "--store", "etcd://127.0.0.1:0")
    assert out.returncode == 2 and "invalid --store='etcd://127.0.0.1:0'" in out.stderr, out.stderr
    assert not data.exists()
    dead = f"etcd://127.0.0.1:{free_port()}"
    out = gpupool("serve", "--data-dir", str(data), "--port", "0", "--store", dead)
    assert out.returncode == 2, out.stderr
    assert f"cannot open the lease store {dead}" in out.stderr and "no etcd endpoint answered" in out.stderr


@pytest.mark.etcd
@pytest.mark.slow
def test_serve_with_store_etcd_grants_into_etcd(
    etcd_server: LocalEtcd, etcd_url: str, tmp_path: Path
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {TENANT}, tenant: a, role: tenant}}\n")
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    argv = ["serve", "--port", str(port), "--data-dir", str(tmp_path / "d"), "--auth-file", str(auth)]
    argv += ["--store", etcd_url, "--no-simulate-readings"]
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", *argv], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "gpupool serve did not come up"
            time.sleep(0.1)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/leases",
            headers=AUTH,
            json={"vram_mib": 1024, "ttl_s": 60},
            timeout=10,
        )
        assert r.status_code == 201, r.text
        reader = open_etcd_store(etcd_url)
        got = reader.get(r.json()["id"])
        assert got is not None and got.state is LeaseState.ACTIVE
        reader.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
