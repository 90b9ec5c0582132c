"""`gpupool serve` on a damaged store and `gpupool store check|repair`, as real subprocesses; and
`serve` validating every other argument before it opens (or creates, or recovers) the store."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapters.store.damage import a_store, bad_json_row, overwrite, truncate
from tests.e2e.gateway.test_store_faults import fill, tiny_tmpfs


def gpupool(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def serve(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A `serve` that must refuse to start (one that starts anyway is killed: TimeoutExpired)."""
    return gpupool("serve", "--data-dir", str(data), "--port", "0", *args, timeout_s=40)


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_serve_on_a_bad_row_names_file_row_and_fix_then_repair_lets_it_start(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    a_store(path)
    bad_json_row(path, "lease-012")
    r = serve(tmp_path, "--auth-file", str(_auth(tmp_path)), "--port", "70000")
    assert r.returncode == 2 and "--port" in r.stderr  # (the port is checked before the store)
    r = serve(tmp_path)
    line = one_line(r)
    assert r.returncode == 2 and "recovered" not in r.stdout
    assert str(path) in line and "row id='lease-012'" in line and "gpupool store repair" in line

    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert r.returncode == 1 and "row id='lease-012'" in r.stdout and "not valid JSON" in r.stdout
    r = gpupool("store", "repair", "--data-dir", str(tmp_path))
    assert r.returncode == 0 and "quarantined table leases, row id='lease-012'" in r.stdout
    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == f"{path}: ok"
    db = sqlite3.connect(path)
    assert db.execute("SELECT id FROM quarantine").fetchall() == [("lease-012",)]
    db.close()


@pytest.mark.parametrize("damage", [truncate, overwrite])
def test_serve_on_a_damaged_file_is_one_line_naming_it(tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "leases.db"
    a_store(path)
    damage(path)
    r = serve(tmp_path)
    line = one_line(r)
    assert r.returncode == 2 and str(path) in line and "damaged" in line and "gpupool store check" in line
    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert r.returncode == 1 and f"{path}: file:" in r.stdout
    r = gpupool("store", "repair", "--data-dir", str(tmp_path))
    assert r.returncode == 0 and "moved to" in r.stdout and "salvaged" in r.stdout
    assert gpupool("store", "check", "--data-dir", str(tmp_path)).returncode == 0


def test_store_check_without_a_store_is_exit_2(tmp_path: Path) -> None:
    r = gpupool("store", "check", "--data-dir", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no lease store at" in one_line(r)


def _auth(tmp_path: Path) -> Path:
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  - {token: a-long-enough-token-01, tenant: a, role: tenant}\n")
    return auth


def test_serve_validates_its_arguments_before_opening_the_store(tmp_path: Path) -> None:
    data = tmp_path / "fresh"
    r = serve(data, "--auth-file", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "missing.yaml" in one_line(r)
    r = serve(data, "--backends", str(tmp_path / "no-backends.yaml"))
    assert r.returncode == 2 and "no-backends.yaml" in one_line(r)
    bad = tmp_path / "bad-auth.yaml"
    bad.write_text("tokens: 3\n")
    assert serve(data, "--auth-file", str(bad)).returncode == 2
    assert serve(data, "--port", "-1").returncode == 2
    assert not (data / "leases.db").exists()  # never opened, let alone created

    stocked = tmp_path / "stocked"
    stocked.mkdir()
    a_store(stocked / "leases.db")
    r = serve(stocked, "--auth-file", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "missing.yaml" in one_line(r) and "recovered" not in r.stdout


def test_a_data_dir_that_cannot_be_one_is_one_line_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    for data, why in ((blocker / "data", "cannot create it"), (blocker, "not a directory")):
        line = one_line(r := serve(data))
        assert r.returncode == 2 and f"invalid --data-dir={str(data)!r}: {why}" in line, r.stderr
    r = serve(blocker, "--auth-file", str(_auth(tmp_path)))
    assert r.returncode == 2 and f"invalid --data-dir={str(blocker)!r}: not a directory" in one_line(r)
    r = serve(blocker / "data", "--auth-file", str(_auth(tmp_path)))  # no token file either: still refused
    want = f"invalid --data-dir={str(blocker / 'data')!r}: cannot create it"
    assert r.returncode == 2 and want in one_line(r)


def test_a_store_that_cannot_be_opened_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "leases.db").mkdir()  # the data directory is fine; the store file cannot be a file
    r = serve(tmp_path, "--auth-file", str(_auth(tmp_path)))
    line = one_line(r)
    assert r.returncode == 2 and "lease store" in line and str(tmp_path / "leases.db") in line


def test_a_bad_ticket_row_is_named_at_start_and_repair_quarantines_it(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    a_store(path)
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO tickets(id, state, ended_at, body) VALUES ('t-7', 'queued', NULL, '{\"ticket\": 1}')"
    )
    db.commit()
    db.close()
    r = serve(tmp_path)
    line = one_line(r)
    assert r.returncode == 2 and "recovered" not in r.stdout
    assert str(path) in line and "table tickets, row id='t-7'" in line and "gpupool store repair" in line
    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert r.returncode == 1 and "table tickets, row id='t-7'" in r.stdout
    r = gpupool("store", "repair", "--data-dir", str(tmp_path))
    assert r.returncode == 0 and "quarantined table tickets, row id='t-7'" in r.stdout
    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == f"{path}: ok"
    db = sqlite3.connect(path)
    assert db.execute("SELECT tbl, id FROM quarantine").fetchall() == [("tickets", "t-7")]
    assert db.execute("SELECT count(*) FROM tickets").fetchone() == (0,)
    db.close()


def test_store_check_and_repair_with_a_bad_db_name_the_db_option(tmp_path: Path) -> None:
    (tmp_path / "a-dir.db").mkdir()
    cases = ((tmp_path / "missing.db", "no lease store there"), (tmp_path / "a-dir.db", "a directory"))
    for cmd in ("check", "repair"):
        for db, why in cases:
            line = one_line(r := gpupool("store", cmd, "--db", str(db)))
            assert r.returncode == 2 and f"invalid --db={str(db)!r}: {why}" in line, r.stderr
    (tmp_path / "data" / "leases.db").mkdir(parents=True)
    line = one_line(r := gpupool("store", "check", "--data-dir", str(tmp_path / "data")))
    assert r.returncode == 2 and "--data-dir" in line and "a directory" in line


def test_a_sqlite_file_of_another_schema_is_a_file_problem_that_repair_sets_aside(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE leases(id TEXT); CREATE TABLE meta(k, v); INSERT INTO leases VALUES ('a');"
    )
    db.close()
    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and f"{path}: file: table leases lacks column(s)" in r.stdout
    assert "'body'" in r.stdout and "table meta lacks column(s) ['key', 'value']" in r.stdout
    r = gpupool("store", "repair", "--data-dir", str(tmp_path))
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0 and "moved to" in r.stdout
    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == f"{path}: ok"


def test_check_reads_a_store_on_a_read_only_filesystem(tmp_path: Path) -> None:
    """A clean store on read-only media (no ``-shm`` can be made there) is clean, not "unreadable";
    a bad row on it is found."""
    with tiny_tmpfs(tmp_path / "fs") as fs:
        path = fs / "leases.db"
        a_store(path)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        r = gpupool("store", "check", "--data-dir", str(fs))
        assert r.returncode == 0 and r.stdout.strip() == f"{path}: ok", r.stdout + r.stderr
        subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True)
        bad_json_row(path, "lease-007")
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        r = gpupool("store", "check", "--data-dir", str(fs))
        assert r.returncode == 1 and "row id='lease-007'" in r.stdout and "file:" not in r.stdout, r.stdout


@pytest.mark.parametrize("damage", ["clean", "bad row", "truncated"])
def test_repair_on_read_only_media_is_one_line_and_changes_nothing(tmp_path: Path, damage: str) -> None:
    """A store on read-only media: a clean one has nothing to repair (no write is tried), a damaged
    one cannot be repaired there, said in one line naming the file, not a traceback."""
    with tiny_tmpfs(tmp_path / "fs") as fs:
        path = fs / "leases.db"
        a_store(path)
        if damage == "bad row":
            bad_json_row(path, "lease-003")
        elif damage == "truncated":
            truncate(path)
        before = sorted(p.name for p in fs.iterdir())
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        r = gpupool("store", "repair", "--data-dir", str(fs))
        if damage == "clean":
            assert r.returncode == 0 and r.stdout.strip() == f"{path}: nothing to repair", r.stdout + r.stderr
        else:
            line = one_line(r)
            assert r.returncode == 2 and f"cannot repair {path}: " in line, line
            assert "read-only" in line.lower() and "nothing was changed" in line, line
        assert sorted(p.name for p in fs.iterdir()) == before


def test_repair_of_a_damaged_file_on_a_full_disk_puts_it_back(tmp_path: Path) -> None:
    """The damaged file is set aside, the new store cannot be written: the damaged file is back in
    its place (a data dir without its store would start a gateway on an empty one), one line."""
    with tiny_tmpfs(tmp_path / "fs", size="2m") as fs:
        path = fs / "leases.db"
        a_store(path, n=300)
        truncate(path)
        before = path.read_bytes()
        filler = fill(fs)
        r = gpupool("store", "repair", "--data-dir", str(fs))
        line = one_line(r)
        assert r.returncode == 2 and f"cannot repair {path}: " in line and "full" in line, line
        filler.unlink()
        assert path.read_bytes() == before  # (beside it at most SQLite's own -wal/-shm and the lock)
        sides = {"leases.db", "leases.db-wal", "leases.db-shm", "leases.db.lock"}
        assert {p.name for p in fs.iterdir()} <= sides
        r = gpupool("store", "repair", "--data-dir", str(fs))
        assert r.returncode == 0 and "moved to" in r.stdout, r.stdout + r.stderr


def test_a_store_from_a_newer_gpupool_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """A store whose ``schema_version`` is above this version's (written by a newer gpupool, then
    started with an older one, e.g. after a rolled-back upgrade) was opened and written as if it were
    its own; `store repair` even rewrote the version down. Now serve exits 2 naming the file and both
    versions, repair refuses, and the file is not touched."""
    path = tmp_path / "leases.db"
    a_store(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    db.commit()
    db.close()
    before = path.read_bytes()
    r = serve(tmp_path, "--auth-file", str(_auth(tmp_path)))
    line = one_line(r)
    assert r.returncode == 2 and "recovered" not in r.stdout, r.stdout
    assert str(path) in line and "schema_version 2" in line and "newer" in line and "1" in line, line
    r = gpupool("store", "check", "--data-dir", str(tmp_path))
    assert r.returncode == 1 and "newer" in r.stdout, r.stdout
    r = gpupool("store", "repair", "--data-dir", str(tmp_path))
    line = one_line(r)
    assert r.returncode == 2 and str(path) in line and "newer" in line, line
    assert path.read_bytes() == before
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
    db.close()
