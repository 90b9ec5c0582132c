"""`gpupool serve`'s simulated readings (`serve.feed_simulated_readings`): every pass gives the
controller one reading per simulated GPU, and yields to the event loop between nodes, so a pass
never holds requests back for the whole cluster's worth of simulation at once."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from gpupool.bench.gateway_bench import write_serve_files
from gpupool.cli import serve as sv


def _bundle(tmp: Path) -> sv.Bundle:
    args = write_serve_files(tmp, "http://127.0.0.1:9")
    kw = dict(zip(args[::2], args[1::2], strict=True))
    return sv.build(
        data_dir=Path(kw["--data-dir"]),
        cluster=Path(kw["--cluster"]),
        workloads=Path(kw["--workloads"]),
        auth_file=Path(kw["--auth-file"]),
    )


def test_a_pass_reads_every_gpu_and_lets_other_tasks_run_between_nodes(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    sim: Any = b.sim
    nodes = sim.nodes()
    assert len(nodes) > 1
    turns = 0
    seen: list[tuple[str, int]] = []
    read = sim.read

    def spy(node: str) -> Any:
        seen.append((node, turns))
        return read(node)

    sim.read = spy

    async def main() -> None:
        nonlocal turns
        feed = asyncio.create_task(sv.feed_simulated_readings(b, period_s=0.01))
        while len(seen) < len(nodes):  # one whole pass
            await asyncio.sleep(0)
            turns += 1
        await asyncio.sleep(0)  # let the pass finish its last node
        feed.cancel()
        await asyncio.gather(feed, return_exceptions=True)

    asyncio.run(main())
    first = seen[: len(nodes)]
    assert [n for n, _ in first] == list(nodes)
    assert all(a[1] < b_[1] for a, b_ in itertools.pairwise(first)), first
    assert set(b.controller.readings) == {f"{n}/{i}" for n in nodes for i in range(8)}
