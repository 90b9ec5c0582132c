"""The generated admin token file (``DATA_DIR/admin.token``) of `gpupool serve` and `gpupool run`.

Role: read the token a previous start stored, or stop with one line naming ``--data-dir`` and the
file (exit 2, `UserError`) when it cannot be used: not readable (a directory in its place, bad
permissions, not text) or empty. Checked before the lease store is opened, so a damaged token file
changes nothing; the file is never rewritten here (a printed token must keep working).
"""

from __future__ import annotations

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
