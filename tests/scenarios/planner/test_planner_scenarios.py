"""Table-driven planner scenarios (seed_scenarios.yaml): cluster + workloads -> layout, placements, errors."""

from pathlib import Path

import pytest
import yaml

from gpupool.hardware.mig import is_legal_layout
from gpupool.hardware.planner import PlanError, inventory_from_plan, plan
from gpupool.hardware.spec import load_cluster_spec, load_workload_spec

CASES = yaml.safe_load((Path(__file__).parent / "seed_scenarios.yaml").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_scenario(case):
    cluster = load_cluster_spec(case["cluster"], source="cluster")
    workloads = load_workload_spec(case["workloads"], source="workloads")
    exp = case["expect"]
    if "error" in exp:
        with pytest.raises(PlanError) as exc:
            plan(cluster, workloads)
        assert exp["error"] in str(exc.value)
        assert "\n" not in str(exc.value)
        if exp.get("error_shortfall"):
            assert exc.value.shortfall_mib > 0 and "short by" in str(exc.value)
        return
    p = plan(cluster, workloads)
    for g in p.gpus:
        if g.mig:
            assert is_legal_layout(g.model, g.mig), g.gpu_id
    if "gpus_used" in exp:
        assert p.gpus_used == exp["gpus_used"]
    for gid, mode in exp.get("modes", {}).items():
        assert p.gpu(gid).mode.value == mode
    for gid, insts in exp.get("mig", {}).items():
        assert [str(i) for i in p.gpu(gid).mig] == insts
    by_rep = {f"{pl.workload}/{pl.replica}": pl for pl in p.placements}
    slices = {s.id: s for g in p.gpus for s in g.slices}
    for rep, want in exp.get("placed", {}).items():
        pl = by_rep[rep]
        s = slices[pl.slice]
        got = f"{s.kind.value}:{s.profile}" if s.kind.value == "mig" else s.kind.value
        assert got == want, rep
        assert s.vram_mib >= pl.need_mib
    for w, quota in exp.get("mps_quota", {}).items():
        assert {s.vram_mib for s in slices.values() if s.workload == w} == {quota}
    assert sorted(f"{u.workload}/{u.replica}" for u in p.unplaced) == sorted(exp.get("unplaced", []))
    assert sorted(g.gpu_id for g in p.gpus if g.flagged) == sorted(exp.get("flagged", []))
    inv = inventory_from_plan(p)
    assert {s.id for s in inv} == set(slices)
