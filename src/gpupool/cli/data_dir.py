"""The ``--data-dir`` option of `gpupool serve`, `run`, `store` and `batch`.

Role: read the option's value as typed, before it becomes a `Path`. ``Path('')`` is ``Path('.')``:
an empty value (an unset shell variable, ``--data-dir "$DIR"``) silently meant the working
directory, where `gpupool run` then removed ``leases.db`` and ``batch.db`` of whatever lived there.
An empty value is refused by the parser instead: one line naming the option and the value, exit 2
(``invalid --data-dir='': ...``, `gpupool.cli.errors.usage_line`), before the command runs.
``--data-dir .`` still means the working directory: that one is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

DEFAULT_DATA_DIR = Path(".gpupool")


def parse_data_dir(value: str | Path) -> Path:
    """The typed value as a `Path`; `ValueError` (the parser's usage error) when it is empty."""
    if isinstance(value, Path):  # the default, already a path
        return value
    if not value:
        raise ValueError("empty: name a directory (. for the working directory)")
    return Path(value)


def data_dir_option(help_text: str) -> Any:
    """A ``--data-dir`` option defaulting to ``.gpupool`` that refuses an empty value."""
    return typer.Option(DEFAULT_DATA_DIR, "--data-dir", parser=parse_data_dir, metavar="PATH", help=help_text)
