"""`gpupool.core.pausers.plan_relief` and friends: pure, deterministic decisions."""

from __future__ import annotations

import math

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.pausers import (
    Candidate,
    Frees,
    ReliefStep,
    Workload,
    plan_relief,
    vram_deficit_mib,
)

V = Frees.COMPUTE_AND_VRAM
C = Frees.COMPUTE


def steps(plan: tuple[object, ...]) -> list[tuple[str, str]]:
    return [(d.lease_id, d.step.value) for d in plan]  # type: ignore[attr-defined]


def test_deficit_is_what_gets_strictly_below_the_target() -> None:
    assert vram_deficit_mib(8800, 10000, target_ratio=0.88) == 1
    assert vram_deficit_mib(8799, 10000, target_ratio=0.88) == 0
    assert vram_deficit_mib(9500, 10000, target_ratio=0.88) == 701
    assert vram_deficit_mib(0, 10000, target_ratio=0.0) == 0
    with pytest.raises(InvalidInput):
        vram_deficit_mib(1, 10, target_ratio=1.5)


def test_vram_freeing_pausers_in_time_cover_the_deficit_nobody_revoked() -> None:
    plan = plan_relief(
        [Candidate("a", -1, 4000, V, 1.0), Candidate("b", -1, 1000, C, math.inf)],
        deficit_mib=3000,
        budget_s=5.0,
    )
    assert steps(plan) == [("a", "pause"), ("b", "pause")]
    assert "frees VRAM in time" in plan[0].reason and "stops compute" in plan[1].reason


def test_compute_only_and_slow_pausers_are_revoked_in_victim_order() -> None:
    cands = [
        Candidate("slow", -1, 2000, V, 15.0),  # cuda-checkpoint: longer than the budget
        Candidate("sig-small", -1, 500, C, math.inf),
        Candidate("sig-big", -1, 3000, C, math.inf),
        Candidate("urgent-batch", -1 + 1, 9000, C, math.inf),  # priority 0: revoked last
    ]
    plan = plan_relief(cands, deficit_mib=4000, budget_s=5.0)
    # order: priority asc, VRAM desc, id -> sig-big (3000), slow (2000) cover 4000 MiB
    assert steps(plan) == [
        ("sig-big", "revoke"),
        ("slow", "revoke"),
        ("sig-small", "pause"),
        ("urgent-batch", "pause"),
    ]
    assert "frees compute only" in plan[0].reason
    assert "budget" in plan[1].reason


def test_refused_candidates_get_no_pause_but_may_be_revoked() -> None:
    plan = plan_relief(
        [Candidate("mig", -1, 5000, V, 15.0, refusal="MIG"), Candidate("ok", -1, 100, C, math.inf)],
        deficit_mib=0,
        budget_s=5.0,
    )
    assert steps(plan) == [("ok", "pause")]
    plan = plan_relief([Candidate("mig", -1, 5000, V, 15.0, refusal="MIG")], deficit_mib=10, budget_s=5.0)
    assert plan[0].step is ReliefStep.REVOKE and "MIG" in plan[0].reason


def test_plan_is_deterministic_whatever_the_input_order() -> None:
    cands = [Candidate(f"l{i}", -1 - (i % 3), 100 * (i % 5), C, math.inf) for i in range(12)]
    a = plan_relief(cands, deficit_mib=700, budget_s=1.0)
    b = plan_relief(list(reversed(cands)), deficit_mib=700, budget_s=1.0)
    assert a == b


def test_workload_validation_names_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"workload\.pgid"):
        Workload("l", "g", "signal", pgid=1)
    with pytest.raises(InvalidInput, match=r"workload\.sleep_level"):
        Workload("l", "g", "vllm-sleep", sleep_level=3)
    with pytest.raises(InvalidInput, match=r"workload\.vram_mib"):
        Workload("l", "g", "signal", vram_mib=-1)


def test_agent_config_validation_names_the_field() -> None:
    from gpupool.agent.loop import AgentConfig

    with pytest.raises(InvalidInput, match=r"agent\.period_s"):
        AgentConfig("n1", period_s=0)
    with pytest.raises(InvalidInput, match=r"agent\.revoke_after_s"):
        AgentConfig("n1", revoke_after_s=-1.0)
    with pytest.raises(InvalidInput, match=r"agent\.node"):
        AgentConfig("")
