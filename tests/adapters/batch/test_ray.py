"""The Ray executor against a real local Ray head on loopback (skipped when ray is not installed)."""

from __future__ import annotations

import sys

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed here (pip install 'gpupool[ray]')")

from gpupool.adapters.batch.local import wait_for  # noqa: E402
from gpupool.adapters.batch.queue import BatchJobQueue  # noqa: E402
from gpupool.adapters.batch.ray_executor import RayExecutor  # noqa: E402
from gpupool.adapters.batch.runner import BatchRunner  # noqa: E402
from gpupool.core import P0, Allocator, ManualClock, Request, Resources, Slice, SliceKind  # noqa: E402
from gpupool.core.tidal.jobs import BatchJobSpec, JobState  # noqa: E402
from tests.ray_cluster import ray_head_cluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    with ray_head_cluster(tmp_path_factory.mktemp("ray")) as address:
        try:
            yield address
        finally:
            ray.shutdown()


def test_ray_jobs_hold_leases_finish_and_are_requeued_when_preempted(tmp_path, ray_head):
    clock = ManualClock(0.0)
    gpu = Slice(id="g", node="n", gpu_id="g", kind=SliceKind.WHOLE, capacity=Resources(10_000, 1000))
    alloc = Allocator([gpu], clock=clock)
    q = BatchJobQueue(tmp_path / "jobs.db")
    runner = BatchRunner(q, alloc, RayExecutor(ray_head), lease_ttl_s=3600.0)
    q.submit(BatchJobSpec(id="task", vram_mib=1000, ray_task="os.path:isdir", args=("/",)), now=0.0)
    q.submit(
        BatchJobSpec(id="cmd", vram_mib=1000, command=(sys.executable, "-c", "raise SystemExit(4)")), now=0.0
    )
    slow = (sys.executable, "-c", "import time; time.sleep(120)")
    q.submit(BatchJobSpec(id="long", vram_mib=7000, command=slow, checkpointable=True), now=0.0)
    runner.step(clock.now())
    assert set(runner.running) == {"task", "cmd", "long"}
    assert wait_for(lambda: runner.running["task"].handle.poll() is not None, 60)
    assert wait_for(lambda: runner.running["cmd"].handle.poll() is not None, 60)
    runner.step(clock.advance(1.0))
    assert q.get("task").state is JobState.DONE
    assert q.get("cmd").state is JobState.FAILED and q.get("cmd").returncode == 4
    out = alloc.allocate(Request(id="p0", tenant="o", priority=P0, demand=Resources(8000, 0), ttl_s=60.0))
    assert out.granted and len(out.victims) == 1
    runner.step(clock.advance(1.0))
    rec = q.get("long")
    assert rec.state is JobState.QUEUED and "requeued" in rec.reason  # Ray cannot freeze a task
    alloc.check_invariants()
