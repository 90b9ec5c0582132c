"""FGD's fragmentation measure on tiny nodes, worked out by hand."""

from __future__ import annotations

import numpy as np

from gpupool.sim.policies.fgd import candidates, fgd_scores
from tests.sim.tiny import context, node, pod, target

# Target workload (weights are pod counts; total 4):
#   A: 1 GPU x 500 milli, 1 core (2 pods)   B: 1 whole GPU, 1 core (1 pod)   C: CPU only, 1 core (1 pod)
TW = target((1000, 500, 1, 2), (1000, 1000, 1, 1), (1000, 0, 0, 1))


def test_node_fragmentation_by_hand() -> None:
    ctx = context(
        [node("a", 2), node("b", 2), node("c", 2)],
        TW,
        gpu_free=[[1000, 300], [200, 0], [1000, 1000]],
        cpu_free=[8000, 8000, 500],
    )
    f = ctx.frag
    # node a, free [1000, 300]: A fits (GPU0) -> 300 is fragment; B fits -> 300; C -> all 1300.
    # numerator = 2*300 + 1*300 + 1*1300 = 2200 -> 550 expected milli
    # node b, free [200, 0]: nothing fits -> every shape sees all 200 idle: 4*200 = 800 -> 200
    # node c, free [1000, 1000] but only 500 mCPU: A and B lack CPU -> all 2000 is fragment: 8000 -> 2000
    assert f.node_frag.tolist() == [2200.0, 800.0, 8000.0]
    assert f.cluster_frag_milli() == (2200 + 800 + 8000) / 4


def test_incremental_refresh_matches_full_recompute() -> None:
    ctx = context([node("a", 4), node("b", 8)], TW, gpu_free=[[1000, 700, 20, 0], [1000] * 8])
    ctx.mirror.apply(1, (3,), gpu_milli=450, cpu_milli=1000, memory_mib=10)
    ctx.frag.refresh(1)
    fresh = context(
        [node("a", 4), node("b", 8)], TW, gpu_free=[[1000, 700, 20, 0], [1000, 1000, 1000, 550] + [1000] * 4]
    )
    fresh.mirror.cpu_free[1] -= 1000
    fresh.frag.refresh(1)
    assert np.array_equal(ctx.frag.node_frag, fresh.frag.node_frag)
    assert ctx.frag.cluster_frag == fresh.frag.cluster_frag


def test_gpu_model_constraint_makes_all_idle_fragment() -> None:
    tw = target((1000, 500, 1, 1, "V100M32"))
    ctx = context([node("t4", 1, model="T4"), node("v", 1, model="V100M32")], tw, gpu_free=[[1000], [1000]])
    # T4 not allowed -> 1000 fragment; V100M32 fits and its only GPU is usable -> 0
    assert ctx.frag.node_frag.tolist() == [1000.0, 0.0]


def test_fgd_scores_sharing_pod_by_hand() -> None:
    ctx = context([node("a", 2), node("b", 2)], TW, gpu_free=[[1000, 300], [1000, 1000]])
    rows, gpus, after = candidates(ctx, pod(1000, 500, 1), np.array([0, 1]))
    # a: only GPU0 fits -> [500, 300]: A fits (300 frag), B no (800), C 800 -> 2*300+800+800 = 2200
    # b: GPU0 and GPU1 are equal, only GPU0 is tried -> [500, 1000]: A 0, B 500, C 1500 -> 2000
    assert rows.tolist() == [0, 1] and gpus.tolist() == [0, 0]
    assert after.tolist() == [2200.0, 2000.0]
    # before: a = 2200 (see above); b = 2*0 + 0 + 2000 = 2000: both deltas are exactly 0 -> 50, 50
    assert fgd_scores(ctx, rows, after).tolist() == [50.0, 50.0]
    # a whole-GPU pod on b: [0, 1000] -> A 0, B 0, C 1000 -> 1000; delta = +1000/4 milli = 0.25 GPU
    rows, _, after = candidates(ctx, pod(1000, 1000, 1), np.array([1]))
    assert after.tolist() == [1000.0]
    assert fgd_scores(ctx, rows, after).tolist() == [float(int(100 / (1 + np.exp(-0.25))))]  # 56


def test_capacity_measure_by_hand() -> None:
    from gpupool.sim.capfrag import CapacityFragTable

    tw = target((1000, 470, 1, 1), (3000, 1000, 1, 1))
    ctx = context([node("a", 2, cpu=4000)], tw, gpu_free=[[1000, 1000]])
    cap = CapacityFragTable(tw, ctx.mirror)
    # 470-shape: 2 per card -> 4 slots, CPU for 4 -> uses 1880 of 2000 -> 120 fragment
    # whole-card shape: 2 cards but CPU for one 3-core pod -> uses 1000 -> 1000 fragment
    assert cap.node_frag.tolist() == [1120.0]
    # FGD's measure calls this node fragment-free: one pod of each shape fits
    assert ctx.frag.node_frag.tolist() == [0.0]
    # a 470 share on GPU0 (1000 free): slots 4 -> 3, CPU 3000 -> 3 and 1 -> 470: 1410 of 1530 (120);
    # whole shape: 1 card, CPU for 1 -> 1000 of 1530 -> 530 -> total 650
    assert cap.after_shared(np.array([0]), np.array([1000]), 470, 1000).tolist() == [650.0]
    # a whole card (1 core): 470 slots 2, CPU 3 -> 940 of 1000 (60); whole: 1 card, CPU 1 -> 0 -> 60
    assert cap.after_whole(np.array([0]), 1, 1000).tolist() == [60.0]
    ctx.mirror.apply(0, (0,), gpu_milli=1000, cpu_milli=1000, memory_mib=0)
    cap.refresh(0)
    assert cap.node_frag.tolist() == [60.0]


def test_capacity_measure_never_cpu_limits_a_shape_that_asks_no_cpu() -> None:
    # Regression (variant cpu0: GPU pods ask 0 CPU, CPU-only pods use up node CPU): a node with two
    # free cards and 0 free CPU. The 0-CPU whole-card shape uses both cards (fragment 0); the 1-core
    # shape none (fragment 2000). Before the fix the 0-CPU shape counted 0 / tiny = 0 CPU slots.
    from gpupool.sim.capfrag import CapacityFragTable

    tw = target((0, 1000, 1, 1), (1000, 1000, 1, 1))
    ctx = context([node("a", 2, cpu=4000)], tw, gpu_free=[[1000, 1000]], cpu_free=[0])
    cap = CapacityFragTable(tw, ctx.mirror)
    assert cap.node_frag.tolist() == [2000.0]
    assert cap.after_whole(np.array([0]), 1, 0).tolist() == [1000.0]  # 1 card left: 0 + 1000
