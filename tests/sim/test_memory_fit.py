"""Memory in FGD's fit test (``memory=True``, used by the default ``fgd-balance-mem``).

Proves: `target_workload` records each shape's smallest memory request; a memory-aware model calls
all idle GPU of a node fragment for a shape whose smallest pod no longer fits the node's free
memory, the artifact's model (``memory=False``) does not look at memory; and on a hand-worked
cluster where a CPU-only pod would take the memory that a node's free cards need, the default
places it elsewhere while ``fgd-balance`` (memory-blind) takes the first node in order.
"""

from __future__ import annotations

import numpy as np

from gpupool.sim.frag import FragModel, FragTable
from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.policies import DEFAULT_SIM_POLICY, get_sim_policy
from gpupool.sim.policies.base import SimContext
from gpupool.sim.trace import PodSpec
from gpupool.sim.workload import Shape, TargetWorkload, target_workload
from tests.sim.tiny import all_rows, node, pod


def _spec(name: str, mem: int, gpu_milli: int = 1000) -> PodSpec:
    return PodSpec(
        name=name, cpu_milli=0, memory_mib=mem, num_gpu=1, gpu_milli=gpu_milli, gpu_spec=frozenset()
    )


def test_target_workload_keeps_the_smallest_memory_of_each_shape() -> None:
    pods = [_spec("a", 50_000), _spec("b", 40_000), _spec("c", 60_000), _spec("d", 7_000, gpu_milli=500)]
    tw = target_workload(pods, popularity=1.0)
    least = dict(zip(tw.shapes, tw.min_memory_mib, strict=True))
    assert least[Shape(cpu_milli=0, gpu_milli=1000, num_gpu=1, spec_key="")] == 40_000
    assert least[Shape(cpu_milli=0, gpu_milli=500, num_gpu=1, spec_key="")] == 7_000


# One shape: whole card, no CPU, smallest pod 40,000 MiB, 10 pods. Node a: 2 free cards, 100,000 MiB
# memory; node b: 2 free cards, 200,000 MiB.
TW = TargetWorkload(
    shapes=(Shape(cpu_milli=0, gpu_milli=1000, num_gpu=1, spec_key=""),),
    counts=(10,),
    min_memory_mib=(40_000,),
)
NODES = [node("a", 2, cpu=8000, mem=100_000), node("b", 2, cpu=8000, mem=200_000)]


def _ctx() -> SimContext:
    m = MirrorLedger(NODES)
    ft = FragTable(FragModel(TW, m.models), m)
    return SimContext(mirror=m, frag=ft, target=TW, rng=np.random.default_rng(0), population=TW)


def test_memory_aware_model_counts_cards_behind_exhausted_memory_as_fragment() -> None:
    m = MirrorLedger(NODES)
    blind = FragTable(FragModel(TW, m.models), m)
    aware = FragTable(FragModel(TW, m.models, memory=True), m)
    rows = np.array([0, 1])
    # A CPU-only pod asking 70,000 MiB: on a it leaves 30,000 (< 40,000): both of a's cards become
    # fragment (2000 milli x 10 pods); on b it leaves 130,000: nothing changes.
    assert aware.after_whole(rows, 0, 1000, 70_000).tolist() == [20_000.0, 0.0]
    assert blind.after_whole(rows, 0, 1000, 70_000).tolist() == [0.0, 0.0]
    # A sharing pod of 500 milli and 70,000 MiB on a's first card: blind, the half card left is
    # fragment (500 x 10); aware, all 1500 idle milli of a are.
    assert blind.after_shared(rows[:1], np.array([1000]), 500, 0, 70_000).tolist() == [5000.0]
    assert aware.after_shared(rows[:1], np.array([1000]), 500, 0, 70_000).tolist() == [15_000.0]
    # The state itself: with a's memory down to 30,000 the aware table calls a's 2 cards fragment.
    m.mem_free[0] = 30_000
    aware.refresh(0)
    blind.refresh(0)
    assert aware.node_frag.tolist() == [20_000.0, 0.0] and blind.node_frag.tolist() == [0.0, 0.0]


def test_default_keeps_the_memory_that_free_cards_need() -> None:
    cpu_pod = pod(1000, 0, 0, mem=70_000)
    assert DEFAULT_SIM_POLICY == "fgd-balance-mem"
    assert get_sim_policy("fgd-balance").choose(_ctx(), cpu_pod, all_rows(_ctx())) == (0, ())
    assert get_sim_policy(DEFAULT_SIM_POLICY).choose(_ctx(), cpu_pod, all_rows(_ctx())) == (1, ())
    # A whole-card pod of 70,000 MiB: on a it strands a's other card (30,000 MiB left), on b not.
    gpu_pod = pod(0, 1000, 1, mem=70_000)
    assert get_sim_policy("fgd-balance").choose(_ctx(), gpu_pod, all_rows(_ctx()))[0] == 0
    assert get_sim_policy(DEFAULT_SIM_POLICY).choose(_ctx(), gpu_pod, all_rows(_ctx()))[0] == 1
