"""The proxy-replica simulator (`sim/replicas.py`) drives the real core (`ShareDelegator`,
`ProxyReplica`) on a virtual clock: its results are a function of the inputs, so these are checks
of the model, not timings. With ample KV budgets the replicas' CPUs are the limit and throughput
grows with them while the leader sees one share call per replica every ttl/3; with one tight budget
throughput stops at what the budget carries (budget / request MiB concurrent requests) and the
shares never exceed it."""

from __future__ import annotations

from gpupool.sim.replicas import SimConfig, measure_leader_call_us, run


def test_ample_budgets_replicas_are_the_limit_and_the_leader_is_off_the_request_path() -> None:
    base = SimConfig(duration_s=2.0, proxy_cpu_us=200.0)
    out = {n: run(SimConfig(**{**_fields(base), "replicas": n})) for n in (1, 2, 4)}
    for n, r in out.items():
        cpu_bound = n * 1e6 / base.proxy_cpu_us
        assert 0.9 * cpu_bound <= r["requests_per_s"] <= cpu_bound  # each replica's CPU is busy
        assert r["share_calls_per_s"] <= n * 3 / base.ttl_s + 0.5  # one call per ttl/3 per replica
        assert r["max_shares_over_budget_mib"] == 0 and r["shed"] == 0


def test_a_tight_budget_caps_throughput_and_is_never_exceeded() -> None:
    base = SimConfig(duration_s=2.0, proxy_cpu_us=100.0, backends=1, budget_mib=256)
    carry = base.budget_mib // base.request_mib / base.service_s  # requests/s the budget can hold
    for n in (1, 2, 4):
        r = run(SimConfig(**{**_fields(base), "replicas": n}))
        assert r["max_shares_over_budget_mib"] == 0
        assert r["requests_per_s"] <= carry * 1.01
    assert r["requests_per_s"] >= 0.8 * carry  # 4 replicas fill it: shares follow demand


def test_a_share_call_costs_the_leader_microseconds() -> None:
    assert measure_leader_call_us(replicas=2, backends=2, calls=200) > 0


def _fields(cfg: SimConfig) -> dict[str, object]:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
