"""Leader election on an etcd lease, with fencing: two real replica processes and a real etcd.

Each replica process campaigns, and while it leads it compare-and-set increments one lease (the
lease's ``node`` names the writer), printing every increment etcd acknowledged. The test pauses the
leader with SIGSTOP past the lease TTL (a partition as the old leader sees it: it cannot renew,
it does not know), waits for the standby to take over, then wakes the old leader.

Proves: only one replica leads at a time (the standby writes nothing while the leader is alive);
the standby takes over after the TTL; the woken old leader's next write is refused (`NotLeader`,
from etcd's Txn: the fence), so it writes nothing after the takeover; no acknowledged increment is
lost or applied twice (the acknowledged revisions of both replicas are disjoint, ordered leader
before successor, and contiguous up to the stored value). In-process: `resign` hands over at once;
bad arguments are named.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from gpupool.adapters.store.etcd import NotLeader, open_etcd_store
from gpupool.adapters.store.etcd_election import Election
from gpupool.core.errors import InvalidInput
from gpupool.core.ports import StoreWrite

pytestmark = pytest.mark.etcd

TTL_S = 2

CHILD = r"""
import signal, sys, threading, time
from gpupool.adapters.store.etcd import NotLeader, open_etcd_store
from gpupool.adapters.store.etcd_election import Election
from gpupool.core.model import Grant, Lease, Request
from gpupool.core.ports import RevisionConflict, StoreWrite
from gpupool.hardware.units import Resources

url, name, ttl = sys.argv[1], sys.argv[2], int(sys.argv[3])
stop = []
lock = threading.Lock()

def say(*words):  # one write per line: on_lost prints from the election's thread
    with lock:
        sys.stdout.write(" ".join(map(str, words)) + "\n")
        sys.stdout.flush()

signal.signal(signal.SIGTERM, lambda *a: stop.append(1))

def counter(rev):
    req = Request(id="r-counter", tenant="t", priority=1, demand=Resources(1, 0), ttl_s=60.0)
    return Lease(id="counter", request=req, node=name, grants=(Grant("n/0/a", "n/0", Resources(1, 0)),),
                 granted_at=0.0, expires_at=60.0, revision=rev)

store = open_etcd_store(url)
el = Election(store, candidate=name, ttl_s=ttl, on_lost=lambda: say("LOST"))
say("CANDIDATE")
while not el.campaign(timeout_s=0.5):
    if stop:
        sys.exit(0)
say("LEADER", el.revision)
while not stop:
    cur = store.get("counter")
    rev = 1 if cur is None else cur.revision + 1
    try:
        store.apply([StoreWrite(counter(rev), None if cur is None else cur.revision)])
        say("WROTE", rev)
    except NotLeader:
        say("NOTLEADER")
        break
    except RevisionConflict:
        say("CONFLICT")
    time.sleep(0.02)
say("BYE")
"""


class Replica:
    def __init__(self, url: str, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, url, name, str(TTL_S)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def has(self, word: str) -> bool:
        return any(x.split()[0] == word for x in list(self.lines) if x)

    def wrote(self) -> list[int]:
        return [int(x.split()[1]) for x in list(self.lines) if x.startswith("WROTE ")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


def wait_for(cond: Callable[[], bool], what: str, replicas: list[Replica], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what}: " + repr({r.name: r.lines[-8:] for r in replicas})
            )
        time.sleep(0.02)


@pytest.mark.slow
def test_a_paused_leader_is_replaced_and_cannot_write_after_waking(etcd_url: str) -> None:
    a = Replica(etcd_url, "a")
    wait_for(lambda: a.has("LEADER"), "a to lead", [a])
    b = Replica(etcd_url, "b")
    replicas = [a, b]
    try:
        wait_for(lambda: b.has("CANDIDATE"), "b to campaign", replicas)
        n = len(a.wrote())
        wait_for(lambda: len(a.wrote()) >= n + 10, "a to write on while b campaigns", replicas)
        assert not b.has("LEADER") and b.wrote() == []  # one leader at a time
        os.kill(a.proc.pid, signal.SIGSTOP)
        wait_for(lambda: b.has("LEADER"), "b to take over", replicas)
        wait_for(lambda: len(b.wrote()) >= 5, "b to write", replicas)
        a_before_wake = a.wrote()
        os.kill(a.proc.pid, signal.SIGCONT)
        wait_for(lambda: a.has("NOTLEADER") or a.has("LOST"), "a to notice", replicas)
        wait_for(lambda: a.has("BYE") or a.has("LOST"), "a to stop writing", replicas)
        n = len(b.wrote())
        wait_for(lambda: len(b.wrote()) >= n + 5, "b to write on after a woke", replicas)
    finally:
        for r in replicas:
            r.stop()
    ra, rb = a.wrote(), b.wrote()
    # (a may report one more write after waking than before the pause: its reply was in flight when
    # it stopped, or its line still in the pipe; such a write landed before the takeover. Any write
    # landing after b took over would carry a revision above b's first one.)
    assert len(ra) <= len(a_before_wake) + 1
    assert ra and rb and max(ra) < min(rb), ("the old leader wrote after the takeover", ra[-3:], rb[:3])
    final = open_etcd_store(etcd_url)
    stored = final.get("counter")
    final.close()
    assert stored is not None and stored.node == "b"
    assert sorted(ra + rb) == list(range(1, stored.revision + 1)), "an acknowledged write lost or doubled"


def test_resign_hands_over_at_once_and_the_resigned_store_is_fenced(etcd_url: str) -> None:
    s1, s2 = open_etcd_store(etcd_url), open_etcd_store(etcd_url)
    e1 = Election(s1, candidate="one", ttl_s=TTL_S)
    e2 = Election(s2, candidate="two", ttl_s=TTL_S)
    assert e1.try_acquire() and e1.is_leader and e1.leader() == "one"
    assert not e2.try_acquire() and not e2.is_leader
    from tests.contract.store.test_etcd_store import lease

    s1.apply([StoreWrite(lease("x"), None)])
    e1.resign()
    assert e2.try_acquire() and e2.leader() == "two" and e2.revision > e1.revision == 0
    with pytest.raises(NotLeader):
        s1.apply([StoreWrite(lease("x", rev=2), 1)])
    s2.apply([StoreWrite(lease("x", rev=2), 1)])
    e2.resign()
    for s in (s1, s2):
        s.close()


def test_bad_election_arguments_are_named(etcd_url: str) -> None:
    s = open_etcd_store(etcd_url)
    with pytest.raises(InvalidInput, match="ttl_s"):
        Election(s, candidate="x", ttl_s=1)
    with pytest.raises(InvalidInput, match="candidate"):
        Election(s, candidate="")
    s.close()
