"""A `gpupool run` whose start is refused leaves the data directory as it was (real subprocesses).

Without ``--keep-state`` the previous run's ``leases.db`` and ``batch.db`` were deleted before the
start went through: a start refused afterwards (a ``batch.db`` that is a directory, a damaged
``admin.token``) had lost them. They are now set aside and moved back (`gpupool.cli.fresh_start`);
a start that goes through still removes them.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.cli.test_cli_options import assert_one_line_exit_2, gpupool

pytestmark = pytest.mark.timeout(180)

RUN = ("run", "--no-traffic", "--no-agents", "--no-kubernetes", "--port", "0")


def previous_run(data: Path) -> None:
    """What a stopped run leaves: a lease store with a row, a batch queue, the pid lock file."""
    data.mkdir()
    with contextlib.closing(sqlite3.connect(data / "leases.db")) as db, db:
        db.execute("CREATE TABLE leases (id TEXT PRIMARY KEY, body TEXT)")
        db.execute("INSERT INTO leases VALUES ('l-previous', '{}')")
    (data / "leases.db.lock").write_text("4242\n")


def contents(data: Path) -> dict[str, bytes | None]:
    """Every entry by name: a file's bytes (the pid lock file's excepted: a start writes its pid)."""
    return {
        p.name: None if p.is_dir() or p.name == "leases.db.lock" else p.read_bytes() for p in data.iterdir()
    }


@pytest.mark.parametrize("damage", ["batch.db is a directory", "admin.token is empty"])
def test_a_fresh_run_refused_at_start_deletes_nothing(tmp_path: Path, damage: str) -> None:
    data = tmp_path / "data"
    previous_run(data)
    if damage == "batch.db is a directory":
        (data / "batch.db").mkdir()
        want = f"batch queue: open {data / 'batch.db'}: unable to open database file"
    else:
        (data / "batch.db").write_bytes(b"the previous run's batch queue")
        (data / "admin.token").write_text("\n")
        want = f"{data / 'admin.token'}: empty"
    before = contents(data)
    out = gpupool(*RUN, "--data-dir", str(data))
    assert_one_line_exit_2(out, want)
    assert "fresh start" not in out.stdout  # nothing was removed, so nothing is said to be
    assert contents(data) == before


@pytest.mark.slow
def test_a_fresh_run_that_starts_removes_the_previous_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    previous_run(data)
    (data / "batch.db").write_bytes(b"the previous run's batch queue")
    stale = data / ".gpupool-previous-run-killed"  # what a fresh start killed mid-way leaves
    stale.mkdir()
    (stale / "leases.db").write_bytes(b"an older run's lease store")
    p = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", *RUN, "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert p.stdout is not None
        seen = []
        for line in p.stdout:  # (ends when the process does: a refused start fails the assert below)
            seen.append(line)
            if "fresh start: removed the previous run's lease store" in line:
                break
        assert any(str(data / "leases.db") in line for line in seen), "".join(seen)
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
    left = [q.name for q in data.iterdir() if q.name.startswith(".")]
    assert not left  # nothing set aside is left, old or new
    with contextlib.closing(sqlite3.connect(data / "leases.db")) as db:
        ids = {row[0] for row in db.execute("SELECT id FROM leases")}  # (the run's backends hold some)
    assert "l-previous" not in ids  # a new lease store: the previous run's lease is gone
