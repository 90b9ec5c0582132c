"""What only the etcd engine has, on a real etcd server: watch, fencing, compaction, Txn limits,
endpoint failover, URL parsing, and durability across a kill -9 of etcd itself.

Proves:
- a follower that takes a `snapshot` and watches from its revision + 1 sees every later change of
  every writer exactly once, in revision order, deletes included, and nothing after `cancel`;
- a watch from a compacted revision fails with the compaction named (it never silently skips);
- purging ended leases also compacts etcd's history (the deleted bytes are gone for good);
- a fenced store refuses to write once the leader key changed (`NotLeader`), landing nothing
  (leases, meta and batch jobs alike);
- a batch larger than ``max_txn_ops`` is refused before sending, naming the number;
- a dead first endpoint does not stop the store (the next one answers); no endpoint: `EtcdError`;
- bad URLs name the value; the etcd options are checked in pairs;
- every commit that returned is still there after etcd is killed with SIGKILL and restarted, and a
  watch resumes across the restart without losing or repeating a change;
- with auth on, user + password authenticate (a dropped token is renewed once, on the pipelined
  group commit's gRPC and JSON wires too), and no or wrong credentials are refused with etcd's
  reason; a user granted only its prefix can run the store; with TLS and client certificates both
  pipelined wires write too.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.adapters.store import open_store
from gpupool.adapters.store.etcd import (
    EtcdLeaseStore,
    NotLeader,
    StoreChange,
    open_etcd_store,
    parse_etcd_url,
)
from gpupool.adapters.store.etcd_client import GRPC_OUT_OF_RANGE, EtcdClient, EtcdError, b64, prefix_end
from gpupool.adapters.store.etcd_jobs import EtcdJobQueue
from gpupool.adapters.store.etcd_server import LocalEtcd, find_etcd, free_port
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.core.ports import StoreWrite, TicketRecord
from gpupool.core.tidal.jobs import BatchJobSpec
from gpupool.hardware.units import Resources

pytestmark = pytest.mark.etcd


def lease(lid: str, *, rev: int = 1) -> Lease:
    req = Request(id=f"r-{lid}", tenant="t", priority=1, demand=Resources(512, 0), ttl_s=60.0)
    return Lease(
        id=lid,
        request=req,
        node="n1",
        grants=(Grant("n1/0/a", "n1/0", Resources(512, 0)),),
        granted_at=1.0,
        expires_at=61.0,
        revision=rev,
    )


def pipelined(store: EtcdLeaseStore, wire: str, lid: str) -> None:
    """Write lease ``lid`` through `apply_async` on ``wire`` (grpc | json) and read it back."""
    store.wire = wire
    store._aio = None
    asyncio.run(store.apply_async([StoreWrite(lease(lid), None)]))
    assert store.get(lid) == lease(lid)


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_snapshot_then_watch_sees_every_change_once_in_order(etcd_url: str) -> None:
    leader, other = open_etcd_store(etcd_url), open_etcd_store(etcd_url)
    leader.apply([StoreWrite(lease("a"), None), TicketRecord("t0", "queued", lease("a").request, 1.0, 9.0)])
    follower = open_etcd_store(etcd_url)
    snap = follower.snapshot()
    assert [x.id for x in snap.leases] == ["a"] and [t.ticket for t in snap.tickets] == ["t0"]
    seen: list[tuple[StoreChange, int]] = []
    lock = threading.Lock()

    def on_changes(changes: list[StoreChange], revision: int) -> None:
        with lock:
            seen.extend((c, revision) for c in changes)

    w = follower.watch(on_changes, start_revision=snap.revision + 1)
    assert w.created.wait(10)
    leader.apply([StoreWrite(lease("a", rev=2), 1), StoreWrite(lease("b"), None)])  # one Txn: one revision
    other.apply([StoreWrite(lease("b", rev=2), 1)])
    other.set_meta("watermarks", "{}")
    ended = lease("a", rev=2).with_state(LeaseState.RELEASED, at=5.0)  # (revision 3)
    leader.apply([StoreWrite(ended, 2)])
    assert leader.purge_ended(before_s=6.0) == 1
    wait_for(lambda: len(seen) == 6, "6 changes")
    w.cancel()
    leader.set_meta("after", "cancel")
    time.sleep(0.2)  # (not a timing assertion: a late delivery would show up in `seen`)
    got = [(c.kind, c.id, getattr(c.value, "revision", c.value)) for c, _ in seen]
    assert got == [
        ("lease", "a", 2),
        ("lease", "b", 1),
        ("lease", "b", 2),
        ("meta", "watermarks", "{}"),
        ("lease", "a", 3),
        ("lease", "a", None),  # the purge's delete
    ]
    revisions = [c.mod_revision for c, _ in seen]
    assert revisions == sorted(revisions) and revisions[0] == revisions[1] > snap.revision
    assert follower.get("b") == lease("b", rev=2)  # the follower's view can write on: it saw b at 2
    follower.apply([StoreWrite(lease("b", rev=3), 2)])
    for s in (leader, other, follower):
        s.close()


def test_purge_compacts_history_and_a_watch_from_before_it_fails_named(etcd_url: str) -> None:
    s = open_etcd_store(etcd_url)
    s.history_revisions = 0
    s.apply([StoreWrite(lease("a"), None)])
    before = s.revision()
    s.apply([StoreWrite(lease("a").with_state(LeaseState.EXPIRED, at=1.0), 1)])
    assert s.purge_ended(before_s=2.0) == 1
    assert s.get("a") is None
    with pytest.raises(EtcdError, match="compacted") as e:
        s.client.range(s._key("lease", "a"), revision=before)
    assert e.value.code == GRPC_OUT_OF_RANGE
    errors: list[BaseException] = []
    w = s.watch(lambda c, r: None, start_revision=before, on_error=errors.append)
    wait_for(lambda: bool(errors), "the watch error")
    w.cancel()
    assert isinstance(errors[0], EtcdError) and errors[0].code == GRPC_OUT_OF_RANGE
    s.close()


def test_a_fenced_store_stops_writing_once_the_leader_key_changed(etcd_url: str) -> None:
    s = open_etcd_store(etcd_url)
    leader_key = s.prefix + b"leader"
    s.client.put(leader_key, b"me")
    kvs, _ = s.client.range(leader_key)
    s.set_fence(leader_key, kvs[0].create_revision)
    s.apply([StoreWrite(lease("a"), None)])
    s.client.call("/v3/kv/deleterange", {"key": __import__("base64").b64encode(leader_key).decode()})
    s.client.put(leader_key, b"someone else")  # a new leader: a new create_revision
    with pytest.raises(NotLeader):
        s.apply([StoreWrite(lease("a", rev=2), 1), StoreWrite(lease("b"), None)])
    with pytest.raises(NotLeader):
        s.set_meta("k", "v")
    jobs = EtcdJobQueue(s)
    with pytest.raises(NotLeader):
        jobs.submit(BatchJobSpec(id="j", vram_mib=1, command=("true",)), now=1.0)
    assert s.get("a") == lease("a") and s.get("b") is None and s.get_meta("k") is None
    assert jobs.jobs() == []
    s.set_fence(None)
    s.apply([StoreWrite(lease("b"), None)])
    s.close()


def test_a_batch_over_max_txn_ops_is_refused_naming_the_number(etcd_url: str) -> None:
    s = open_etcd_store(etcd_url, max_txn_ops=4)
    with pytest.raises(EtcdError, match="batch of 5 writes exceeds max_txn_ops=4"):
        s.apply([StoreWrite(lease(f"l{i}"), None) for i in range(5)])
    assert s.leases() == []
    s.apply([StoreWrite(lease(f"l{i}"), None) for i in range(4)])
    assert len(s.active()) == 4
    s.close()


def test_a_dead_first_endpoint_is_skipped_and_no_endpoint_is_an_error(etcd_url: str) -> None:
    u = parse_etcd_url(etcd_url)
    dead = f"127.0.0.1:{free_port()}"
    s = EtcdLeaseStore(EtcdClient([dead, *u.endpoints], timeout_s=2.0), prefix=u.prefix)
    s.apply([StoreWrite(lease("a"), None)])
    assert s.get("a") == lease("a")
    s.close()
    with pytest.raises(EtcdError, match="no etcd endpoint answered"):
        EtcdLeaseStore(EtcdClient([dead], timeout_s=2.0))


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("etcd://", "endpoint ''"),
        ("etcd://host", "endpoint 'host'"),
        ("etcd://h:0", "port in [1, 65535]"),
        ("etcd://h:99999", "port in [1, 65535]"),
        ("etcd://h:1,:2", "endpoint ':2'"),
        ("etcd://h:x", "endpoint 'h:x'"),
        ("etcd://h:\u00b2", "endpoint 'h:\u00b2'"),  # '²': str.isdigit accepts it, int() does not
        ("etcdx://h:1", "expected etcd://"),
    ],
)
def test_bad_etcd_urls_name_the_value(url: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match="store") as e:
        parse_etcd_url(url)
    assert problem in str(e.value) and json.dumps(url, ensure_ascii=False) in str(e.value)  # as JSON


def test_etcd_urls_and_option_pairs() -> None:
    u = parse_etcd_url("etcds://a:1,[::1]:2/team-a/pool")
    assert u == type(u)(("a:1", "[::1]:2"), "/team-a/pool/", True)
    assert parse_etcd_url("etcd://h:2379").prefix == "/gpupool/"
    with pytest.raises(InvalidInput, match="etcd-key"):
        open_etcd_store("etcd://127.0.0.1:1", cert="c.pem")
    with pytest.raises(InvalidInput, match="etcd-password"):
        open_store("etcd://127.0.0.1:1", user="u")


@pytest.mark.slow
def test_every_returned_commit_survives_a_kill_9_of_etcd(tmp_path: object) -> None:
    if find_etcd() is None:
        pytest.skip("no etcd binary installed")
    with LocalEtcd() as server:
        s = open_etcd_store(server.url)
        seen: list[StoreChange] = []
        errors: list[BaseException] = []
        w = s.watch(lambda ch, rev: seen.extend(ch), start_revision=s.revision() + 1, on_error=errors.append)
        assert w.created.wait(10)
        s.apply([StoreWrite(lease(f"l{i}"), None) for i in range(20)])
        s.apply([StoreWrite(lease("l3", rev=2), 1)])
        wait_for(lambda: len(seen) == 21, "the 21 changes before the kill")
        server.kill()
        with pytest.raises(EtcdError):
            s.apply([StoreWrite(lease("l4", rev=2), 1)])
        server.start()
        assert len(s.active()) == 20 and s.get("l3") == lease("l3", rev=2) and s.get("l4") == lease("l4")
        s.apply([StoreWrite(lease("l4", rev=2), 1)])
        wait_for(lambda: len(seen) == 22, "the watch to resume after the restart")
        w.cancel()
        assert errors == [] and (seen[-1].id, seen[-1].value) == ("l4", lease("l4", rev=2))
        assert len(seen) == 22 and len({c.mod_revision for c in seen}) == 3  # nothing twice or lost
        s.close()


@pytest.mark.slow
def test_user_and_password_authenticate_and_are_required_once_auth_is_on() -> None:
    if find_etcd() is None:
        pytest.skip("no etcd binary installed")
    with LocalEtcd() as server:
        admin = EtcdClient([server.endpoint])
        admin.call("/v3/auth/user/add", {"name": "root", "password": "s3cret"})
        admin.call("/v3/auth/role/add", {"name": "root"})
        admin.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        admin.call("/v3/auth/enable", {})
        admin.close()
        s = open_etcd_store(server.url, user="root", password="s3cret")
        s.apply([StoreWrite(lease("a"), None)])
        s.client._token = "not-a-valid-token"  # as after etcd dropped the token: one re-authentication
        assert s.get("a") == lease("a")
        pipelined(s, "grpc", "j")  # the group commit's wires send the token too (and renew it)
        s.client._token = "not-a-valid-token"
        pipelined(s, "json", "k")
        s.client._token = "not-a-valid-token"
        pipelined(s, "grpc", "l")
        s.close()
        with pytest.raises(EtcdError, match=r"user name is empty|authentication|permission"):
            open_etcd_store(server.url)
        with pytest.raises(EtcdError, match="authentication failed"):
            open_etcd_store(server.url, user="root", password="wrong")
        # a user allowed only its prefix: the store works inside it, purges (its compaction is
        # skipped when etcd refuses it) and cannot open another prefix
        root = EtcdClient([server.endpoint], user="root", password="s3cret")
        root.call("/v3/auth/user/add", {"name": "pool", "password": "p00l"})
        root.call("/v3/auth/role/add", {"name": "pool-rw"})
        perm = {"permType": "READWRITE", "key": b64(b"/pool/"), "range_end": b64(prefix_end(b"/pool/"))}
        root.call("/v3/auth/role/grant", {"name": "pool-rw", "perm": perm})
        root.call("/v3/auth/user/grant", {"user": "pool", "role": "pool-rw"})
        root.close()
        p = open_etcd_store(f"{server.url}/pool/", user="pool", password="p00l")
        p.history_revisions = 0
        p.apply([StoreWrite(lease("a").with_state(LeaseState.EXPIRED, at=1.0), None)])
        assert p.purge_ended(before_s=2.0) == 1 and p.leases() == []
        p.close()
        with pytest.raises(EtcdError, match="permission denied"):
            open_etcd_store(f"{server.url}/other/", user="pool", password="p00l")


def make_certs(d: Path) -> dict[str, str]:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate (openssl CLI)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
    )  # (etcd's gateway dials itself with it)
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=gpupool-test-ca",
    )
    for name in ("server", "client"):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
        )
    return {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.slow
def test_tls_with_client_certificates_for_reads_writes_and_watch(tmp_path: Path) -> None:
    if find_etcd() is None or shutil.which("openssl") is None:
        pytest.skip("needs the etcd binary and the openssl CLI")
    c = make_certs(tmp_path)
    server = LocalEtcd(
        cert_file=c["server.pem"],
        key_file=c["server.key"],
        client_ca_file=c["ca.pem"],
        probe_cert=(c["client.pem"], c["client.key"]),
    )
    with server:
        s = open_etcd_store(
            f"etcd://{server.endpoint}", cacert=c["ca.pem"], cert=c["client.pem"], key=c["client.key"]
        )
        assert s.client.urls[0].startswith("https://")
        seen: list[StoreChange] = []
        w = s.watch(lambda ch, rev: seen.extend(ch), start_revision=s.revision() + 1)
        assert w.created.wait(10)
        s.apply([StoreWrite(lease("a"), None)])
        assert s.get("a") == lease("a")
        wait_for(lambda: len(seen) == 1, "the change over the TLS watch")
        pipelined(s, "grpc", "b")  # the group commit's wires: TLS with the client certificate
        pipelined(s, "json", "c")
        w.cancel()
        s.close()
        with pytest.raises(EtcdError, match="no etcd endpoint answered"):  # no client certificate
            open_etcd_store(f"etcd://{server.endpoint}", cacert=c["ca.pem"])
