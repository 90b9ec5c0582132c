"""The simulator's speed-ups change no value: each is checked against the plain computation.

Proves: `NodeMemo` returns exactly what a fresh computation of the node's state gives, through
placements that change nodes and with a budget small enough to evict; `MirrorLedger.apply` keeps
``first_of_value`` equal to its definition; `WholeCardReserve.shortfall_after` (alike nodes computed
once, unchanged supply shared) equals the per-candidate formula of the module docstring.
"""

from __future__ import annotations

import numpy as np

from gpupool.sim.memo import NodeMemo
from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.reserve import WholeCardReserve
from tests.sim.tiny import context, node, target


def _state_value(m: MirrorLedger, rows: np.ndarray, cols: np.ndarray, key: int) -> np.ndarray:
    """A deterministic function of each row's node state, its column and the key."""
    out: np.ndarray = (
        m.gpu_free[rows].sum(axis=1) * 7 + m.gpu_free[rows, cols] * 3 + m.cpu_free[rows] // 100 + key
    ).astype(np.float64)
    return out


def _random_apply(m: MirrorLedger, rng: np.random.Generator) -> None:
    n = int(rng.integers(len(m)))
    gpus = np.flatnonzero(m.gpu_free[n] >= 100)
    if len(gpus) and m.cpu_free[n] >= 1000:
        m.apply(n, (int(rng.choice(gpus)),), gpu_milli=100, cpu_milli=1000, memory_mib=0)


def test_node_memo_equals_a_fresh_computation_through_changes_and_evictions() -> None:
    rng = np.random.default_rng(11)
    for budget in (10**9, 3 * 6 * 4, 0):  # unbounded, three shapes' worth (evicts), none
        ctx = context([node(f"n{i}", 4, cpu=64_000) for i in range(6)], target((0, 1000, 1, 1)))
        m = ctx.mirror
        memo = NodeMemo(m, budget_cells=budget)
        computed = 0
        for _ in range(400):
            key = int(rng.integers(5))
            rows = rng.choice(len(m), size=int(rng.integers(1, 6)), replace=False)
            cols = rng.integers(0, 4, size=len(rows))

            def compute(
                miss: np.ndarray,
                rows: np.ndarray = rows,
                cols: np.ndarray = cols,
                key: int = key,
                m: MirrorLedger = m,
            ) -> np.ndarray:
                nonlocal computed
                computed += int(miss.sum())
                return _state_value(m, rows[miss], cols[miss], key)

            got = memo.get(key, rows, cols, compute)
            assert got.tolist() == _state_value(m, rows, cols, key).tolist()
            if rng.random() < 0.3:
                _random_apply(m, rng)
        assert computed > 0


def test_node_memo_reuses_values_while_the_node_is_unchanged() -> None:
    ctx = context([node("a", 2), node("b", 2)], target((0, 1000, 1, 1)))
    m = ctx.mirror
    memo = NodeMemo(m)
    calls: list[int] = []

    def compute(miss: np.ndarray) -> np.ndarray:
        calls.append(int(miss.sum()))
        return _state_value(m, rows[miss], cols[miss], 0)

    rows, cols = np.array([0, 1]), np.array([0, 1])
    memo.get("s", rows, cols, compute)
    memo.get("s", rows, cols, compute)
    assert calls == [2]  # the second read is served from the cache
    m.apply(1, (1,), gpu_milli=300, cpu_milli=0, memory_mib=0)
    got = memo.get("s", rows, cols, compute)
    assert calls == [2, 1]  # only node b, which changed, is computed again
    assert got.tolist() == _state_value(m, rows, cols, 0).tolist()


def test_first_of_value_is_kept_by_apply() -> None:
    rng = np.random.default_rng(3)
    ctx = context(
        [node(f"n{i}", int(rng.integers(1, 9)), cpu=10**9) for i in range(8)], target((0, 1000, 1, 1))
    )
    m = ctx.mirror
    for _ in range(300):
        n = int(rng.integers(len(m)))
        g = int(rng.integers(m.gpu_count[n]))
        take = int(rng.choice([100, 250, 500]))
        if m.gpu_free[n, g] >= take:
            m.apply(n, (g,), gpu_milli=take, cpu_milli=0, memory_mib=0)
        for r in range(len(m)):
            row = m.gpu_free[r].tolist()
            expect = [all(row[h] != row[c] for h in range(c)) for c in range(len(row))]
            assert m.first_of_value[r].tolist() == expect


def _shortfall_reference(
    reserve: WholeCardReserve, rows: np.ndarray, taken: np.ndarray, gpu: int, cpu: int
) -> list[int]:
    """The docstring's formula, one candidate at a time."""
    m = reserve.mirror
    horizon = reserve.horizon_milli(gpu, cpu)
    out = []
    for r, t in zip(rows.tolist(), taken.tolist(), strict=True):
        full = int((m.gpu_free[r] == 1000).sum()) - t
        cpu_left = max(int(m.cpu_free[r]) - cpu, 0)
        supply = reserve.supply.copy()
        for g in range(len(reserve.k)):
            ok = bool(reserve.allowed[m.model[r], g])
            after = min(full // int(reserve.k[g]), cpu_left // int(reserve.cpu[g])) if ok else 0
            supply[g] += after - int(reserve.slots[r, g])
        expected = reserve.dominated_demand * horizon
        have = supply * reserve.k * (1000 * reserve.demand)
        out.append(int(np.maximum(expected - have, 0).sum()))
    return out


def test_shortfall_after_equals_the_per_candidate_formula() -> None:
    rng = np.random.default_rng(8)
    nonzero = 0
    for _ in range(150):
        n = int(rng.integers(3, 9))
        cpus = [int(rng.choice([8, 16, 32])) * 1000 for _ in range(n)]
        nodes = [node(f"n{i}", 4, cpu=cpus[i], model=str(rng.choice(["G1", "G2"]))) for i in range(n)]
        free = [[int(rng.choice([0, 500, 1000, 1000])) for _ in range(4)] for _ in range(n)]
        pop = target(
            (int(rng.choice([1, 8])) * 1000, 1000, 1, int(rng.integers(1, 20))),
            (int(rng.choice([8, 16])) * 1000, 1000, 2, int(rng.integers(1, 5)), "G2"),
            (4000, 500, 1, int(rng.integers(1, 10))),
        )
        ctx = context(nodes, pop, gpu_free=free, cpu_free=[int(rng.choice([c, c // 2, 0])) for c in cpus])
        reserve = WholeCardReserve(pop, ctx.mirror, cpu_horizon=bool(rng.integers(2)), servable=True)
        p_cpu, cards = int(rng.choice([0, 1000, 4000])), int(rng.integers(0, 3))
        m = ctx.mirror
        rows = np.flatnonzero(((m.gpu_free == 1000).sum(axis=1) >= cards) & (m.cpu_free >= p_cpu))
        if not len(rows):
            continue
        taken = np.full(len(rows), cards, dtype=np.int64)
        if cards == 1:
            taken = rng.integers(0, 2, size=len(rows))  # a sharing pod opens a fresh card or not
        got = reserve.shortfall_after(rows, taken, 1000 * cards, p_cpu).tolist()
        assert got == _shortfall_reference(reserve, rows, taken, 1000 * cards, p_cpu)
        nonzero += any(got)
    assert nonzero > 10  # the comparison covers short states, not only zeros
