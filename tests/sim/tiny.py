"""Helpers for hand-worked tiny clusters: build a context with given node states and target shapes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.sim.frag import FragModel, FragTable
from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.policies.base import PodView, SimContext
from gpupool.sim.trace import NodeSpec
from gpupool.sim.workload import Shape, TargetWorkload


def node(name: str, gpus: int, cpu: int = 96_000, mem: int = 393_216, model: str = "G2") -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=mem, gpu_count=gpus, gpu_model=model)


def target(*shapes: tuple[int, int, int, int] | tuple[int, int, int, int, str]) -> TargetWorkload:
    """Each entry: (cpu_milli, gpu_milli, num_gpu, count[, spec])."""
    out, counts = [], []
    for s in shapes:
        spec = s[4] if len(s) == 5 else ""  # type: ignore[misc]
        out.append(Shape(cpu_milli=s[0], gpu_milli=s[1], num_gpu=s[2], spec_key=str(spec)))
        counts.append(s[3])
    return TargetWorkload(shapes=tuple(out), counts=tuple(counts))


def context(
    nodes: Sequence[NodeSpec],
    tw: TargetWorkload,
    *,
    gpu_free: Sequence[Sequence[int]] | None = None,
    cpu_free: Sequence[int] | None = None,
    seed: int = 0,
) -> SimContext:
    m = MirrorLedger(nodes)
    if gpu_free is not None:
        for i, row in enumerate(gpu_free):
            m.gpu_free[i, : len(row)] = row
    if cpu_free is not None:
        m.cpu_free[:] = cpu_free
    m.resync()
    ft = FragTable(FragModel(tw, m.models), m)
    return SimContext(mirror=m, frag=ft, target=tw, rng=np.random.default_rng(seed))


def pod(cpu: int, milli: int, num: int, mem: int = 0, spec: str = "") -> PodView:
    return PodView(index=0, cpu_milli=cpu, memory_mib=mem, num_gpu=num, gpu_milli=milli, spec_key=spec)


def all_rows(ctx: SimContext) -> np.ndarray:
    return np.arange(len(ctx.mirror))
