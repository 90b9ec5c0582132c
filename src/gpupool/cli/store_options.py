"""The ``--store`` and ``--etcd-*`` options of `gpupool serve`: checked before anything is opened.

Role: turn the options into the keyword arguments of `gpupool.adapters.store.open_store`, or stop
with one line naming the option and its value (exit 2, `UserError`). Nothing is connected here: an
unreachable etcd is found when the store opens (also exit 2, naming the URL).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpupool.cli.errors import UserError, check_range
from gpupool.core.errors import InvalidInput

DEFAULT_MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


def store_settings(
    url: str | None,
    *,
    cacert: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    user: str | None = None,
    password: str | None = None,
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
    etcd_only: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """Check ``--store`` and the ``--etcd-*`` options before anything is opened; the keyword
    arguments for `open_store`. Every error names the option and its value (exit 2).
    ``etcd_only``: other options that mean something only on etcd (flag -> its value if given,
    else None or False), refused like the ``--etcd-*`` ones on another store."""
    etcd_flags = {
        "--etcd-cacert": cacert,
        "--etcd-cert": cert,
        "--etcd-key": key,
        "--etcd-user": user,
        "--etcd-password": password,
        "--etcd-max-txn-ops": None if max_txn_ops == DEFAULT_MAX_TXN_OPS else max_txn_ops,
    }
    given = [flag for flag, v in etcd_flags.items() if v is not None]
    given += [flag for flag, v in (etcd_only or {}).items() if v is not None and v is not False]
    if url is None or not url.startswith(("etcd://", "etcds://")):
        if url is not None and not url.startswith(("sqlite:", "memory:")):
            raise UserError(
                f"invalid --store={url!r}: expected sqlite:///PATH or etcd://HOST:PORT[,HOST:PORT...][/PREFIX/]"
            )
        if (
            url is not None
            and url.startswith("sqlite:")
            and not url.removeprefix("sqlite:").removeprefix("//")
        ):
            raise UserError(f"invalid --store={url!r}: no path after sqlite:")
        if given:
            raise UserError(f"{given[0]} needs --store etcd://...")
        return {}
    from gpupool.adapters.store.etcd import parse_etcd_url

    try:
        parse_etcd_url(url)
    except InvalidInput as exc:
        raise UserError(f"invalid --store={url!r}: {exc.reason}") from None
    for flag, path in (("--etcd-cacert", cacert), ("--etcd-cert", cert), ("--etcd-key", key)):
        if path is not None and not path.is_file():
            raise UserError(f"invalid {flag}={str(path)!r}: no such file")
    if (cert is None) != (key is None):
        raise UserError(
            "--etcd-cert and --etcd-key go together"
            + f" (got only {'--etcd-cert' if cert else '--etcd-key'})"
        )
    if (user is None) != (password is None):
        raise UserError("--etcd-user and --etcd-password go together")
    check_range("--etcd-max-txn-ops", max_txn_ops, lo=1)
    out: dict[str, Any] = {"user": user, "password": password, "max_txn_ops": max_txn_ops}
    for name, path in (("cacert", cacert), ("cert", cert), ("key", key)):
        out[name] = None if path is None else str(path)
    return out


def open_lease_store(url: str, opener: Callable[[], Any], *, data_dir: Path, new_admin: str | None) -> Any:
    """``opener()`` (the store of ``url``); when it fails, an admin token this start generated (not
    shown yet) is removed, so the next start makes and shows one, and the failure is one line naming
    ``url`` (`UserError`; bad input and a damaged SQLite store pass as they are: one line already)."""
    import sqlite3

    from gpupool.adapters.store.sqlite import StoreCorrupt
    from gpupool.core.errors import GpupoolError

    try:
        return opener()
    except BaseException as exc:
        if new_admin:
            (data_dir / "admin.token").unlink(missing_ok=True)
        if isinstance(exc, (InvalidInput, StoreCorrupt)):
            raise
        if isinstance(exc, (OSError, sqlite3.Error, GpupoolError)):
            raise UserError(f"cannot open the lease store {url}: {exc}") from None
        raise
