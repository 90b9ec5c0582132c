"""`SqliteLeaseStore` survives a power loss, not only a process kill: the page cache is emulated.

A `kill -9` keeps every write the process made (the kernel's page cache still holds it), so it
cannot tell ``synchronous=FULL`` from ``OFF``. Here a child process runs the real store with an
``LD_PRELOAD`` shim (``powerloss_shim.c``, compiled by the test) that logs every write, truncate,
fsync and unlink to the store's files; the child commits leases, prints what returned, and kills
itself with SIGKILL. The test then rebuilds the disk as a power loss leaves it when the page cache
held everything not yet synced: per file, only the writes before that file's last sync. The
SQLite shared-memory index (``-shm``) is dropped (SQLite rebuilds it from the WAL on open).

Proves: every lease whose commit returned is there, at its last committed revision, with the
store's default durability (``synchronous=FULL``); with ``synchronous=OFF`` (or ``NORMAL``, which
in WAL mode syncs only at checkpoints) the same commits are lost, so the emulation can tell.
Skips where no C compiler or no ``/proc`` is available.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.adapters.store import SqliteLeaseStore

SHIM = Path(__file__).with_name("powerloss_shim.c")

CHILD = r"""
import json, os, signal, sys
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.core.ports import StoreWrite
from gpupool.hardware.units import Resources

path, mode = sys.argv[1], sys.argv[2]
store = SqliteLeaseStore(path, durable=(mode != "normal"))
if mode == "off":
    store._db.execute("PRAGMA synchronous=OFF")

def lease(i, rev, state=LeaseState.ACTIVE):
    req = Request(id=f"r{i}", tenant="t", priority=-1, demand=Resources(1024, 100), ttl_s=60.0)
    return Lease(id=f"l{i}", request=req, node="n0", grants=(Grant("n0/0", "n0/0", Resources(1024, 100)),),
                 granted_at=1.0, expires_at=61.0, state=state, revision=rev,
                 ended_at=None if state is LeaseState.ACTIVE else 2.0)

committed = {}
for i in range(6):                       # one commit per lease, as the gateway's group commit does
    store.apply([StoreWrite(lease(i, 1), None)])
    committed[f"l{i}"] = 1
store.apply([StoreWrite(lease(0, 2, LeaseState.RELEASED), 1), StoreWrite(lease(1, 2), 1)])
committed["l0"] = committed["l1"] = 2    # one batch of two updates (compare-and-set on revision)
print(json.dumps(committed), flush=True)
os.kill(os.getpid(), signal.SIGKILL)     # no close, no checkpoint: the machine goes down now
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not Path("/proc/self/fd").is_dir():
        pytest.skip("needs a C compiler and /proc to build the write-logging shim")
    out = tmp_path_factory.mktemp("shim") / "powerloss_shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SHIM), "-ldl"], check=True)
    return out


def _records(log: Path) -> list[tuple[str, str, int, bytes]]:
    buf = log.read_bytes() if log.exists() else b""
    out = []
    i = 0
    while i < len(buf):
        op = chr(buf[i])
        plen, a, dlen = struct.unpack_from("=Iqq", buf, i + 1)
        i += 1 + 4 + 8 + 8
        path = buf[i : i + plen].decode()
        i += plen
        out.append((op, path, a, buf[i : i + dlen]))
        i += dlen
    return out


def _after_power_loss(records: list[tuple[str, str, int, bytes]]) -> dict[str, bytes]:
    """File contents as the disk holds them: per file, the operations before its last sync."""
    durable: dict[str, bytearray] = {}
    pending: dict[str, list[tuple[str, int, bytes]]] = {}
    for op, path, a, data in records:
        if op in "WT":
            pending.setdefault(path, []).append((op, a, data))
        elif op == "S":
            img = durable.setdefault(path, bytearray())
            for kind, x, d in pending.pop(path, []):
                if kind == "W":
                    if len(img) < x:
                        img.extend(b"\0" * (x - len(img)))
                    img[x : x + len(d)] = d
                else:
                    del img[x:]
                    img.extend(b"\0" * (x - len(img)))
        elif op == "U":
            durable.pop(path, None)
            pending.pop(path, None)
    return {p: bytes(b) for p, b in durable.items()}


def _crash(shim: Path, tmp_path: Path, mode: str) -> tuple[dict[str, int], dict[str, int], int]:
    """Run the child; return (what it committed, what the store holds after the power loss, syncs)."""
    live = (tmp_path / "live").resolve()
    live.mkdir()
    log = tmp_path / "writes.log"
    env = dict(os.environ, LD_PRELOAD=str(shim), POWERLOSS_DIR=str(live) + os.sep, POWERLOSS_LOG=str(log))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(live / "leases.db"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    committed: dict[str, int] = json.loads(proc.stdout)
    records = _records(log)
    assert any(op == "W" for op, *_ in records), "the shim saw no write to the store's files"
    crashed = tmp_path / "after"
    crashed.mkdir()
    for path, content in _after_power_loss(records).items():
        (crashed / Path(path).name).write_bytes(content)
    store = SqliteLeaseStore(crashed / "leases.db")
    try:
        held = {x.id: x.revision for x in store.leases()}
    finally:
        store.close()
    return committed, held, sum(1 for op, *_ in records if op == "S")


def test_committed_leases_survive_a_power_loss(shim: Path, tmp_path: Path) -> None:
    committed, held, syncs = _crash(shim, tmp_path, "full")
    assert syncs >= len(committed), "synchronous=FULL syncs the WAL on every commit"
    assert held == committed


@pytest.mark.parametrize("mode", ["off", "normal"])
def test_without_a_sync_per_commit_a_power_loss_loses_commits(shim: Path, tmp_path: Path, mode: str) -> None:
    committed, held, _ = _crash(shim, tmp_path, mode)
    lost = {lid for lid, rev in committed.items() if held.get(lid) != rev}
    assert lost, f"synchronous={mode.upper()} kept every commit through a power loss: {held}"
