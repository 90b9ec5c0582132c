"""MIG re-partition planner (gpupool.core.tidal.partition): 3g+2g+1g+1g <-> 7g on a drained A100."""

from __future__ import annotations

from gpupool.core.tidal.partition import Refusal, RepartitionPlan, plan_merge
from gpupool.hardware.mig import MigInstance, validate_layout

A100 = "A100-SXM4-80GB"
DAY = (
    MigInstance("2g.20gb", 0),
    MigInstance("1g.10gb", 2),
    MigInstance("1g.10gb", 3),
    MigInstance("3g.40gb", 4),
)


def test_idle_gpu_merges_to_7g_and_reverses_exactly():
    plan = plan_merge("gpu-7", A100, DAY, idle=dict.fromkeys(DAY, True))
    assert isinstance(plan, RepartitionPlan)
    assert plan.target == (MigInstance("7g.80gb", 0),)
    validate_layout(A100, plan.target)
    actions = [s.action for s in plan.steps]
    assert actions == ["drain"] * 4 + ["destroy"] * 4 + ["create"]
    assert [str(s.instance) for s in plan.steps[:4]] == ["2g.20gb@0", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"]
    assert plan.target_sm_count == 98
    back = plan.reverse()
    assert sorted(back.target) == sorted(DAY) and back.source == plan.target
    validate_layout(A100, back.target)
    # the reverse creates the largest instance first (driver order pitfall)
    creates = [s.instance.profile for s in back.steps if s.action == "create"]
    assert creates[0] == "3g.40gb"


def test_busy_or_unknown_instances_refuse():
    idle = dict.fromkeys(DAY, True)
    idle[DAY[3]] = False
    r = plan_merge("gpu-7", A100, DAY, idle=idle)
    assert isinstance(r, Refusal) and "3g.40gb@4" in r.reason
    r2 = plan_merge("gpu-7", A100, DAY, idle={DAY[0]: True})
    assert isinstance(r2, Refusal) and "not drainable" in r2.reason


def test_illegal_layouts_refuse():
    bad = (MigInstance("4g.40gb", 0), MigInstance("4g.40gb", 4))
    r = plan_merge("g", A100, bad, idle=dict.fromkeys(bad, True))
    assert isinstance(r, Refusal) and "source layout is illegal" in r.reason
    r = plan_merge("g", A100, DAY, idle=dict.fromkeys(DAY, True), target_profiles=("7g.80gb", "1g.10gb"))
    assert isinstance(r, Refusal) and "does not fit" in r.reason
    r = plan_merge("g", A100, DAY, idle=dict.fromkeys(DAY, True), target_profiles=("9g.99gb",))
    assert isinstance(r, Refusal) and "illegal" in r.reason


def test_two_large_batch_instances():
    plan = plan_merge("g", A100, DAY, idle=dict.fromkeys(DAY, True), target_profiles=("4g.40gb", "3g.40gb"))
    assert isinstance(plan, RepartitionPlan)
    assert sorted(str(i) for i in plan.target) == ["3g.40gb@4", "4g.40gb@0"]
