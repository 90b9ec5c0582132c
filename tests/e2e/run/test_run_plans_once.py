"""`gpupool run` reads and plans its spec files once: with ``--cluster <(...) --workloads <(...)``
(each a pipe, readable once, as the shell's process substitution gives it) it starts, and the plan
it checked before the data directory was touched is the one it serves. A real subprocess, real pipes.

It planned twice (once to check the files, again when building the gateway): the second read of
each pipe found it drained and start-up stopped with ``empty file``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.run.test_run_shutdown import Run
from tests.unit.cli.test_cli_options import CLUSTER, WORKLOADS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _pipe_of(path: str) -> int:
    """The read end of a pipe already holding the whole of ``path`` (small: fits the pipe buffer)."""
    r, w = os.pipe()
    os.write(w, Path(path).read_bytes())
    os.close(w)
    return r


def test_run_reads_spec_files_given_as_pipes_once(tmp_path: Path) -> None:
    cluster, workloads = _pipe_of(CLUSTER), _pipe_of(WORKLOADS)
    try:
        run = Run(
            tmp_path / "data",
            "--no-traffic", "--no-agents", "--no-kubernetes", "--tidal-speed", "0",
            "--cluster", f"/dev/fd/{cluster}", "--workloads", f"/dev/fd/{workloads}",
            pass_fds=(cluster, workloads),
        )  # fmt: skip
    finally:
        os.close(cluster)
        os.close(workloads)
    try:
        run.wait_for(r"gpupool gateway on ")
        run.wait_up()
        pool = run.get("/v1/pool")
        assert isinstance(pool, dict) and pool["capacity"]["vram_mib"] > 0, pool
        run.wait_for(r"\bbackend \S+: .* on ")  # the planned models' emulated backends
    finally:
        if run.proc.poll() is None:
            run.interrupt()
