"""The generated admin token file (``DATA_DIR/admin.token``) of `gpupool serve` and `gpupool run`.

Role: read the token a previous start stored, or make and store a new one (mode 0600); stop with
one line naming ``--data-dir`` and the file (exit 2, `UserError`) when it cannot be used: not
readable (a directory in its place, bad permissions, not text), empty, or not writable (a read-only
or full filesystem). Done before the lease store is opened, so a damaged token file changes
nothing; an existing file is never rewritten (a printed token must keep working), and a new one
that could not be written whole is removed (an empty file would stop every later start).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from gpupool.cli.errors import UserError


def read_admin_token(path: Path, data_dir: Path) -> str:
    """The token stored in ``path`` (surrounding whitespace removed), or `UserError`."""
    where = f"invalid --data-dir={str(data_dir)!r}: {path}"
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(f"{where}: cannot read it: {why}") from None
    if not token:
        raise UserError(f"{where}: empty (delete it to have a new admin token generated)")
    return token


def create_admin_token(path: Path, data_dir: Path) -> str:
    """A new token stored in ``path``, which must not exist yet; `UserError` when it cannot be
    written, with no file left behind."""
    token = secrets.token_urlsafe(24)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise UserError(
            f"invalid --data-dir={str(data_dir)!r}: cannot write {path}: {exc.strerror or exc}"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise UserError(
            f"invalid --data-dir={str(data_dir)!r}: cannot write {path}: {exc.strerror or exc}"
        ) from None
    return token
