"""One control plane, one ledger: the real ``gpupool serve --kubernetes`` process, with extender binds
(retried, concurrent, re-bound) and lease-API acquires / releases racing over real HTTP.

Checked afterwards, from the API and from the SQLite store the process wrote:
- no card is over-committed (per slice, the grants of all active leases, pods and lease-API leases
  alike, fit its capacity);
- every pod holds at most one active lease, a pod holds one exactly when some bind of it answered
  success, and it is on a node that one of those binds named (binds of one pod race from three
  threads: the same node, an idempotent retry; or different nodes, a re-bind, which keeps the first
  lease when the second node has no room);
- the pods' leases are in the same store as the lease-API leases and survive a restart (recovered
  from the store: the process runs with ``--no-kube``, so no annotation could bring them back).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core.binds import bind_key
from gpupool.hardware.slices import Slice

pytestmark = pytest.mark.slow

ADMIN = "e2e-admin-token-one-ledger"
TENANT = "e2e-tenant-token-one-ledger"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data: Path, auth: Path, port: int, ext_port: int, kube_api: str = "") -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "serve", "--port", str(port), "--data-dir", str(data)]
    cmd += ["--auth-file", str(auth), "--no-simulate-readings", "--kubernetes"]
    cmd += ["--kube-api", kube_api] if kube_api else ["--no-kube"]
    cmd += ["--extender-port", str(ext_port)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"serve exited {p.returncode}: {p.stderr.read().decode() if p.stderr else ''}")
        try:
            ok = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200
            if ok and httpx.get(f"http://127.0.0.1:{ext_port}/state", timeout=0.5).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("serve --kubernetes did not come up")


def _stop(p: subprocess.Popen[bytes]) -> None:
    os.kill(p.pid, signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


def _pod(uid: str, vram_mib: int, pct: int, priority: int) -> dict[str, Any]:
    limits = {"gpupool.io/gpu": "1", "gpupool.io/vram-mib": str(vram_mib), "gpupool.io/compute-pct": str(pct)}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": f"p-{uid[:8]}", "namespace": "team", "uid": uid},
        "spec": {
            "priority": priority,
            "containers": [{"name": "c", "resources": {"limits": limits, "requests": limits}}],
        },
        "status": {"phase": "Pending"},
    }


class _Ext:
    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, verb: str, body: Any) -> Any:
        self.conn.request(
            "POST", f"/{verb}", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        r = self.conn.getresponse()
        data = r.read()
        assert r.status == 200, (verb, r.status, data)
        return json.loads(data)


def _slices() -> dict[str, Slice]:
    from gpupool.cli.serve import DEFAULT_CLUSTER, DEFAULT_WORKLOADS, plan_cluster

    return {s.id: s for s in plan_cluster(DEFAULT_CLUSTER, DEFAULT_WORKLOADS)[3]}


def test_binds_and_lease_api_race_on_one_ledger(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {TENANT}, tenant: load, role: tenant}}\n"
    )
    data = tmp_path / "data"
    port, ext_port = _free_port(), _free_port()
    slices = _slices()
    nodes = sorted({s.node for s in slices.values()})
    proc = _start(data, auth, port, ext_port)
    lock = threading.Lock()
    bound: dict[str, set[str]] = {}  # pod uid -> nodes named by binds that answered success
    errors: list[str] = []
    pods = [str(uuid.UUID(int=i + 1)) for i in range(24)]
    try:

        def binder(k: int) -> None:
            ext = _Ext(ext_port)
            for i, uid in enumerate(pods):
                pod = _pod(uid, 2048 + 1024 * (i % 6), 10 + 5 * (i % 4), 100 if i % 2 else -1)
                out = ext.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
                if out["Error"] or not out["NodeNames"]:
                    continue
                for attempt in range(2):  # odd pods: each thread its own node (re-binds race)
                    node = out["NodeNames"][((k + attempt) * (i % 2)) % len(out["NodeNames"])]
                    meta = pod["metadata"]
                    args = {"PodName": meta["name"], "PodNamespace": "team", "PodUID": uid, "Node": node}
                    res = ext.post("bind", args)
                    if res["Error"] == "":
                        with lock:
                            bound.setdefault(uid, set()).add(node)

        def acquirer(k: int) -> None:
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TENANT}"}, timeout=20
            ) as cl:
                for n in range(25):
                    r = cl.post(
                        "/v1/leases",
                        json={"priority": "P1", "vram_mib": 1024 * (1 + (n + k) % 8), "ttl_s": 600},
                    )
                    if r.status_code >= 500:
                        with lock:
                            errors.append(f"acquire: {r.status_code} {r.text}")
                    if r.status_code == 201 and n % 2:
                        cl.delete(f"/v1/leases/{r.json()['id']}")

        threads = [threading.Thread(target=binder, args=(k,)) for k in range(3)]
        threads += [threading.Thread(target=acquirer, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert bound, "no bind succeeded"
        state = httpx.get(f"http://127.0.0.1:{ext_port}/state", timeout=5).json()
        assert sorted(state["pods"]) == sorted(bound)
    finally:
        _stop(proc)

    store = SqliteLeaseStore(data / "leases.db")
    try:
        active = store.active()
    finally:
        store.close()
    _assert_one_ledger(active, slices, bound)
    assert any(bind_key(x) is None for x in active), "no lease-API lease in the store"

    proc = _start(data, auth, port, ext_port)  # restart: the pods' leases come back from the store
    try:
        state = httpx.get(f"http://127.0.0.1:{ext_port}/state", timeout=5).json()
        assert sorted(state["pods"]) == sorted(bound)
    finally:
        _stop(proc)


def _assert_one_ledger(active: list[Any], slices: dict[str, Slice], bound: dict[str, set[str]]) -> None:
    used: dict[str, list[int]] = {}
    per_pod: dict[str, list[Any]] = {}
    for lease in active:
        for g in lease.grants:
            u = used.setdefault(g.slice_id, [0, 0])
            u[0] += g.resources.vram_mib
            u[1] += g.resources.compute_milli
        key = bind_key(lease)
        if key is not None:
            per_pod.setdefault(key, []).append(lease)
    for sid, (vram, compute) in used.items():
        cap = slices[sid].capacity
        assert vram <= cap.vram_mib and compute <= cap.compute_milli, (sid, vram, compute, cap)
    for uid, leases in per_pod.items():
        assert len(leases) == 1, (uid, leases)
    assert sorted(per_pod) == sorted(bound)
    for uid, leases in per_pod.items():
        assert leases[0].node in bound[uid], (uid, leases[0].node, bound[uid])


def test_kubernetes_binds_are_durable_in_the_gateway_store(tmp_path: Path) -> None:
    """With a (fake) Kubernetes API: bind writes the annotation and the Binding, the lease is in the
    gateway's store; after a restart it comes back from the store (the reconciler finds it held, it
    adopts nothing), and deleting the pod releases it there."""
    from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod

    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n")
    data = tmp_path / "data"
    port, ext_port = _free_port(), _free_port()
    nodes = sorted({s.node for s in _slices().values()})
    api = FakeApiServer().start()
    try:
        pod = api.add_pod(
            make_pod("llm-0", namespace="team", vram_mib=4096, compute_pct=20, gpus=1, priority=100)
        )
        uid = pod["metadata"]["uid"]
        proc = _start(data, auth, port, ext_port, kube_api=api.url)
        try:
            ext = _Ext(ext_port)
            out = ext.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
            node = out["NodeNames"][0]
            args = {"PodName": "llm-0", "PodNamespace": "team", "PodUID": uid, "Node": node}
            assert ext.post("bind", args) == {"Error": ""}
            bound = api.pod("team", "llm-0")
            assert bound["spec"]["nodeName"] == node
            assert "gpupool.io/placement" in bound["metadata"]["annotations"]
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as cl:
                leases = cl.get("/v1/leases", headers={"Authorization": f"Bearer {ADMIN}"}).json()["leases"]
            (mine,) = [x for x in leases if x["tenant"] == "team"]
            assert mine["node"] == node
        finally:
            _stop(proc)
        store = SqliteLeaseStore(data / "leases.db")
        try:
            (stored,) = [x for x in store.active() if bind_key(x) == uid]
        finally:
            store.close()
        assert stored.id == mine["id"]

        proc = _start(data, auth, port, ext_port, kube_api=api.url)
        try:
            state = httpx.get(f"http://127.0.0.1:{ext_port}/state", timeout=5).json()
            assert state["pods"] == [uid] and state["drift"] == []
            api.delete_pod("team", "llm-0")
            deadline = time.monotonic() + 20
            while httpx.get(f"http://127.0.0.1:{ext_port}/state", timeout=5).json()["pods"]:
                assert time.monotonic() < deadline, "the pod's lease was not released"
                time.sleep(0.1)
        finally:
            _stop(proc)
        store = SqliteLeaseStore(data / "leases.db")
        try:
            assert store.get(stored.id).state.value == "released"
        finally:
            store.close()
    finally:
        api.stop()
