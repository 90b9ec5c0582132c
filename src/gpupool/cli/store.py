"""`gpupool store check|repair`: inspect and repair the gateway's SQLite lease store offline.

``check`` prints one line per problem (file damage, a row whose body does not decode or disagrees
with its columns, a bad schema version) and exits 1 if there is any, 0 if the store is clean.
``repair`` quarantines what ``check`` finds (see `gpupool.adapters.store.repair`) and prints what it
moved where. Run ``repair`` with the gateway stopped: while a process holds the store
(`gpupool.adapters.store.owner`) it is refused, exit 2. Bad arguments (no store there) exit 2.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpupool.cli.data_dir import data_dir_option
from gpupool.cli.errors import UserError, user_errors

app = typer.Typer(
    help="Check or repair the lease store (DATA_DIR/leases.db); run with the gateway stopped.",
    no_args_is_help=True,
)

_DATA_DIR = data_dir_option("The gateway's data directory.")
_DB = typer.Option(None, "--db", help="The store file (default: DATA_DIR/leases.db).")


def _path(data_dir: Path, db: Path | None) -> Path:
    """The store file; `UserError` naming the option that chose it (``--db`` or ``--data-dir``) when
    there is no file there (nothing, or a directory)."""
    path = db if db is not None else data_dir / "leases.db"
    if path.is_file():
        return path
    option, value = ("--db", db) if db is not None else ("--data-dir", data_dir)
    why = f"{path} is a directory" if path.is_dir() else f"no lease store at {path}"
    if db is not None:
        why = "a directory, not a store file" if path.is_dir() else "no lease store there"
    raise UserError(f"invalid {option}={str(value)!r}: {why}")


@app.command("check")
@user_errors
def check(data_dir: Path = _DATA_DIR, db: Path | None = _DB) -> None:
    """List problems: exit 1 if there are any, 0 if the store is clean."""
    from gpupool.adapters.store.repair import check as check_store
    from gpupool.adapters.store.repair import summary

    path = _path(data_dir, db)
    problems = check_store(path)
    if not problems:
        typer.echo(f"{path}: ok")
        return
    for line in summary(problems, path):
        typer.echo(line)
    typer.echo(f"{len(problems)} problem(s); `gpupool store repair` quarantines them")
    raise typer.Exit(1)


@app.command("repair")
@user_errors
def repair(data_dir: Path = _DATA_DIR, db: Path | None = _DB) -> None:
    """Quarantine bad rows (or set a damaged file aside, salvaging what can be read); say what moved."""
    import sqlite3

    from gpupool.adapters.store import owner
    from gpupool.adapters.store.repair import check as check_store
    from gpupool.adapters.store.repair import repair as repair_store

    path = _path(data_dir, db)
    if not check_store(path):  # (reads only: a clean store on read-only media is not an error)
        typer.echo(f"{path}: nothing to repair")
        return
    try:  # a gateway running on the store would keep writing to the file repair sets aside
        owner.claim(path)
    except owner.StoreInUse as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot repair {path}: {exc.strerror or exc}; nothing was changed") from None
    try:
        report = repair_store(path)
    except (OSError, sqlite3.Error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(f"cannot repair {path}: {why}; nothing was changed") from None
    finally:
        owner.release(path)
    for line in report.lines(path):
        typer.echo(line)
