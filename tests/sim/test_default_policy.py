"""The simulator's default policy, ``fgd-balance-mem`` (``fgd-balance`` whose FGD key asks for memory too,
tested in test_memory_fit.py; ``fgd-balance`` is ``fgd-reserve-servable`` where CPU does not bind and
rank matching without the whole-card reserve while it does, tested in test_balance_policy.py): its
choice, its mechanisms, its shortcut.

Proves: the default is one registered policy, the one ``gpupool sim policies`` marks and
``gpupool sim fgd`` runs without ``--policy``; the servable cap (hand-worked numbers below) drops
the shortfall of a group the empty cluster cannot serve in full, so where only that unclosable part
objects the default follows FGD while ``fgd-reserve-cpu`` overrides it; the CPU-aware horizon of
the whole-card reserve (hand-worked numbers below) removes a shortfall the CPU-blind reserve
sees, so where the free CPU cannot carry the free GPU's worth of future pods the default follows
FGD while ``fgd-reserve`` overrides it; `WholeCardReserve.never_short` is exact (when it says no
placement can be short, `shortfall_after` is 0 for every candidate), so the shortcut it enables
changes no choice.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from gpupool.cli import sim as sim_cli
from gpupool.cli.main import app
from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.policies import DEFAULT_SIM_POLICY, SIM_POLICIES, get_sim_policy
from gpupool.sim.policies.base import SimContext
from gpupool.sim.reserve import WholeCardReserve
from gpupool.sim.trace import load_nodes, load_pods
from gpupool.sim.workload import target_workload
from tests.sim.tiny import all_rows, context, node, pod, target

GOLDEN = Path(__file__).with_name("golden")


def test_one_default_named_by_sim_policies_and_run_by_sim_fgd() -> None:
    assert DEFAULT_SIM_POLICY == "fgd-balance-mem" == sim_cli.DEFAULT_SIM_POLICY_NAME
    assert DEFAULT_SIM_POLICY in SIM_POLICIES
    lines = CliRunner().invoke(app, ["sim", "policies"]).stdout.splitlines()
    assert [line for line in lines if line.endswith(" (default)")] == [f"{DEFAULT_SIM_POLICY} (default)"]
    args = ["sim", "fgd", "--pods", str(GOLDEN / "pods.csv"), "--nodes", str(GOLDEN / "nodes.csv"), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["policy"] == DEFAULT_SIM_POLICY


# a = 4 free cards, 8 cores; b = [1000, 1000, 1000, 500], 16 cores. FGD's target: (1 core, 1 card)
# only. Population: A = (16 cores, 1 card) x 6, B = (8 cores, 4 cards) x 1: demand 10000 milli-GPU,
# 104000 milli-CPU; neither group dominates the other, so D(A) = 6000, D(B) = 4000. The pod: 1 core,
# 1 card. On a: a keeps 3 cards, 7 cores -> A slots: a 0, b min(3, 1) = 1; B slots 0. On b: a keeps
# B's slot (4 cards, 8 cores), b has 2 full cards, 15 cores -> A slots 0, B slots 1.
# CPU-blind horizon = free GPU after = 6500: on a, A 6000 x 6500 - 1 x 1000 x 10000 = 29e6 plus
# B 4000 x 6500 = 26e6 -> 55e6; on b, A 39e6, B 0 -> 39e6: fgd-reserve takes b.
# CPU horizon = min(6500, 23000 free cores x 10000 // 104000 = 2211): on a, A 6000 x 2211 - 10e6 =
# 3.266e6 plus B 4000 x 2211 = 8.844e6 -> 12.11e6; on b, A 13.266e6, B 0 -> 13.266e6: a, as FGD.
NODES = [node("a", 4, cpu=8000), node("b", 4, cpu=16_000)]
FREE = [[1000] * 4, [1000, 1000, 1000, 500]]
POP = target((16_000, 1000, 1, 6), (8000, 1000, 4, 1))


def _ctx() -> SimContext:
    ctx = context(NODES, target((1000, 1000, 1, 10)), gpu_free=FREE)
    ctx.population = POP
    return ctx


def test_cpu_horizon_drops_a_shortfall_the_free_cpu_cannot_reach() -> None:
    ctx = _ctx()
    rows, taken = np.array([0, 1]), np.array([1, 1])
    blind = WholeCardReserve(POP, ctx.mirror)
    aware = WholeCardReserve(POP, ctx.mirror, cpu_horizon=True)
    assert blind.horizon_milli(1000, 1000) == 6500
    assert aware.horizon_milli(1000, 1000) == 2211
    assert blind.shortfall_after(rows, taken, 1000, 1000).tolist() == [55_000_000, 39_000_000]
    assert aware.shortfall_after(rows, taken, 1000, 1000).tolist() == [12_110_000, 13_266_000]


def test_default_follows_fgd_where_only_the_cpu_blind_reserve_objects() -> None:
    p = pod(1000, 1000, 1)
    assert get_sim_policy("fgd").choose(_ctx(), p, all_rows(_ctx())) == (0, (0,))
    assert get_sim_policy("fgd-reserve").choose(_ctx(), p, all_rows(_ctx())) == (1, (0,))
    assert get_sim_policy("fgd-reserve-cpu").choose(_ctx(), p, all_rows(_ctx())) == (0, (0,))
    assert get_sim_policy(DEFAULT_SIM_POLICY).choose(_ctx(), p, all_rows(_ctx())) == (0, (0,))


# Servable demand. a = X card model, 4 cards [1000, 1000, 1000, 0]; b = G2, [1000, 1000, 0, 0]; 32
# cores each. Population: A = (1 core, 1 card, pinned to X) x 6, B = (1 core, 1 card) x 2, C = (1 core,
# 2 cards) x 1: demand 10000 milli-GPU, 9000 milli-CPU. Groups: D(A) = 6000 (B and C may run off X, so
# they do not dominate A), D(B) = 10000 (A, B and C all take B's slots), D(C) = 2000.
# Empty cluster: A has 4 slots (a's cards), horizon min(8000, 64000 x 10000 // 9000) = 8000, so A
# can be served at most 4000 / 8000 of the horizon: capped D(A) = 4 x 1000 x 10000 // 8000 = 5000
# (B: 8 slots, cap 10000; C: 4 slots, cap 10000; neither binds).
# The pod: 1 core, 1 card; horizon after it = min(4000, 63000 x 10000 // 9000) = 4000 (x 10000 scale):
# on a: A keeps 2 slots = 20e6 against 6000 x 4000 = 24e6 (short 4e6) uncapped, 5000 x 4000 = 20e6
# (not short) capped; B 4 slots = 40e6 = 10000 x 4000; C 2 slots = 40e6 > 8e6. On b: A 3 slots = 30e6,
# B 4 slots, C 1 slot = 20e6: nothing short. FGD's target (B x 2, C x 1) sees b's last pair broken
# (C no longer fits there) and a's not: FGD takes a; fgd-reserve-cpu takes b; the default keeps a.
SERVABLE_POP = target((1000, 1000, 1, 6, "X"), (1000, 1000, 1, 2), (1000, 1000, 2, 1))


def _servable_ctx() -> SimContext:
    nodes = [node("a", 4, cpu=32_000, model="X"), node("b", 4, cpu=32_000)]
    free = [[1000, 1000, 1000, 0], [1000, 1000, 0, 0]]
    ctx = context(nodes, target((1000, 1000, 1, 2), (1000, 1000, 2, 1)), gpu_free=free)
    ctx.population = SERVABLE_POP
    return ctx


def test_servable_cap_drops_a_shortfall_no_placement_can_close() -> None:
    ctx = _servable_ctx()
    rows, taken = np.array([0, 1]), np.array([1, 1])
    uncapped = WholeCardReserve(SERVABLE_POP, ctx.mirror, cpu_horizon=True)
    servable = WholeCardReserve(SERVABLE_POP, ctx.mirror, cpu_horizon=True, servable=True)
    assert uncapped.dominated_demand.tolist() == [6000, 10_000, 2000]
    assert servable.dominated_demand.tolist() == [5000, 10_000, 2000]
    assert servable.horizon_milli(1000, 1000) == uncapped.horizon_milli(1000, 1000) == 4000
    assert uncapped.shortfall_after(rows, taken, 1000, 1000).tolist() == [4_000_000, 0]
    assert servable.shortfall_after(rows, taken, 1000, 1000).tolist() == [0, 0]


def test_default_follows_fgd_where_only_an_unservable_shortfall_objects() -> None:
    p = pod(1000, 1000, 1)
    assert get_sim_policy("fgd").choose(_servable_ctx(), p, all_rows(_servable_ctx())) == (0, (0,))
    assert get_sim_policy("fgd-reserve-cpu").choose(_servable_ctx(), p, all_rows(_servable_ctx())) == (
        1,
        (0,),
    )
    assert get_sim_policy(DEFAULT_SIM_POLICY).choose(_servable_ctx(), p, all_rows(_servable_ctx())) == (
        0,
        (0,),
    )


def test_servable_cap_changes_nothing_where_the_empty_cluster_serves_every_group() -> None:
    # Both golden traces: every group's share fits its empty-cluster slots, so no demand is capped
    # and the default's golden output is fgd-reserve-cpu's, run for run.
    for pods_csv, nodes_csv in (("pods.csv", "nodes.csv"), ("reserve_pods.csv", "reserve_nodes.csv")):
        pods = load_pods(GOLDEN / pods_csv)
        mirror = MirrorLedger([nd for nd in load_nodes(GOLDEN / nodes_csv) if nd.gpu_count])
        pop = target_workload(pods, popularity=1.0)
        uncapped = WholeCardReserve(pop, mirror, cpu_horizon=True)
        servable = WholeCardReserve(pop, mirror, cpu_horizon=True, servable=True)
        assert servable.dominated_demand.tolist() == uncapped.dominated_demand.tolist()
    for prefix in ("expected_", "expected_reserve_"):
        mine = json.loads((GOLDEN / f"{prefix}{DEFAULT_SIM_POLICY}.json").read_text())
        old = json.loads((GOLDEN / f"{prefix}fgd-reserve-cpu.json").read_text())
        assert {**mine, "policy": "-"} == {**old, "policy": "-"}


def test_never_short_is_exact_on_random_states() -> None:
    rng = np.random.default_rng(5)
    said_never = 0
    for _ in range(300):
        n = int(rng.integers(2, 5))
        nodes = [node(f"n{i}", 4, cpu=int(rng.choice([8, 16, 32, 64])) * 1000) for i in range(n)]
        free = [[int(rng.choice([0, 500, 1000, 1000])) for _ in range(4)] for _ in range(n)]
        pop = target(
            (int(rng.choice([1, 8, 16])) * 1000, 1000, 1, int(rng.integers(1, 20))),
            (int(rng.choice([8, 32])) * 1000, 1000, 4, int(rng.integers(0, 3))),
            (4000, 500, 1, int(rng.integers(1, 10))),
        )
        ctx = context(nodes, pop, gpu_free=free)
        for cpu_horizon, servable in ((False, False), (True, False), (True, True)):
            reserve = WholeCardReserve(pop, ctx.mirror, cpu_horizon=cpu_horizon, servable=servable)
            p_cpu, p_cards = int(rng.choice([0, 1000, 8000])), int(rng.choice([0, 1]))
            if reserve.never_short(p_cards, 1000 * p_cards, p_cpu):
                said_never += 1
                m = ctx.mirror  # feasible placements only: enough full cards and CPU
                rows = np.flatnonzero(((m.gpu_free == 1000).sum(axis=1) >= p_cards) & (m.cpu_free >= p_cpu))
                short = reserve.shortfall_after(rows, np.full(len(rows), p_cards), 1000 * p_cards, p_cpu)
                assert (short == 0).all()
    assert 0 < said_never < 900  # both answers occur


def test_a_gpu_pod_asking_no_cpu_keeps_fgds_node_order() -> None:
    # a = [1000, 0], b = [1000, 700], 8 cores each. Target = population: A = (0 cores, 470) x 4,
    # B = (0 cores, one card) x 1. The pod: 470 milli, 0 cores. FGD numerators (x5 pods): a/gpu0 0 ->
    # 530 (B loses its card), b/gpu0 700 -> 1230, b/gpu1 700 -> 1150 (230 left: A 4 x 230 + B 230):
    # all score int(100 sigmoid(-0.106 or -0.09)) = 47 -> node order: a, GPU 0.
    # Capacity gains: a/gpu0 240 -> 770 (-530), b/gpu0 1860 -> 2390 (-530), b/gpu1 1860 -> 1390
    # (+470): fgd-reserve takes b, GPU 1. The default keeps FGD's choice.
    tw = target((0, 470, 1, 4), (0, 1000, 1, 1))
    ctx = context([node("a", 2, cpu=8000), node("b", 2, cpu=8000)], tw, gpu_free=[[1000, 0], [1000, 700]])
    ctx.population = tw
    p = pod(0, 470, 1)
    assert get_sim_policy("fgd").choose(ctx, p, all_rows(ctx)) == (0, (0,))
    assert get_sim_policy("fgd-reserve").choose(ctx, p, all_rows(ctx)) == (1, (1,))
    assert get_sim_policy(DEFAULT_SIM_POLICY).choose(ctx, p, all_rows(ctx)) == (0, (0,))
