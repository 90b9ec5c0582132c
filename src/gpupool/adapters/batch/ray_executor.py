"""Ray executor (optional extra ``ray``): submits P2 jobs as tasks to an existing Ray cluster.

``ray`` is imported lazily. A ``ray_task`` job (``package.module:function``) is called with its
string ``args`` inside a Ray worker; a ``command`` job runs as a subprocess inside a Ray worker.
A task counts as exit 0 when it returns, 1 when it raises, or the command's return code.

Ray cannot freeze a running task in place, so `RayHandle.pause` returns False: the runner then
cancels the task and requeues the job (its progress is kept only if the job checkpoints itself).
"""

from __future__ import annotations

import functools
from typing import Any

from gpupool.core.tidal.jobs import BatchJobSpec


@functools.cache
def _remote() -> Any:
    import ray

    @ray.remote(num_cpus=0.1, max_retries=0)  # type: ignore[untyped-decorator,unused-ignore]
    def run_job(ray_task: str, args: list[str], command: list[str], env: dict[str, str]) -> int:
        import importlib
        import os
        import subprocess

        if command:
            return subprocess.run(command, env={**os.environ, **env}, check=False).returncode
        mod, fn = ray_task.split(":")
        getattr(importlib.import_module(mod), fn)(*args)
        return 0

    return run_job


class RayHandle:
    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self._rc: int | None = None

    def poll(self) -> int | None:
        import ray

        if self._rc is not None:
            return self._rc
        ready, _ = ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            self._rc = int(ray.get(self.ref))
        except Exception:  # the task raised or was cancelled: a failed attempt
            self._rc = 1
        return self._rc

    def pause(self) -> bool:
        return False

    def resume(self) -> bool:
        return False

    def terminate(self, *, grace_s: float = 2.0) -> None:
        """Cancel the task (forced: Ray has no graceful stop of a running task); returns at once."""
        import ray

        if self.poll() is None:
            ray.cancel(self.ref, force=True)
            self._rc = -9

    def stop(self, *, grace_s: float = 2.0) -> int:
        self.terminate(grace_s=grace_s)
        return self._rc if self._rc is not None else -9


class RayExecutor:
    name = "ray"

    def __init__(self, address: str, *, namespace: str = "gpupool") -> None:
        import ray

        ray.init(address=address, namespace=namespace, ignore_reinit_error=True, log_to_driver=False)

    def accepts(self, spec: BatchJobSpec) -> bool:
        return bool(spec.ray_task or spec.command)

    def start(self, spec: BatchJobSpec, *, lease_id: str) -> RayHandle:
        env = {
            "GPUPOOL_LEASE_ID": lease_id,
            "GPUPOOL_JOB_ID": spec.id,
            "GPUPOOL_VRAM_MIB": str(spec.vram_mib),
        }
        ref = _remote().remote(spec.ray_task, list(spec.args), list(spec.command), env)
        return RayHandle(ref)

    @staticmethod
    def shutdown() -> None:
        import ray

        ray.shutdown()
