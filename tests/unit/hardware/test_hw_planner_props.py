"""Planner properties (Hypothesis): legal layouts, no replica spans GPUs, capacity respected,
mig-parted round trip, and the Inventory hand-over."""

from collections import Counter

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpupool.hardware.catalogue import GPU_MODELS
from gpupool.hardware.mig import find_placement, is_legal_layout
from gpupool.hardware.migparted import node_layouts, to_mig_parted
from gpupool.hardware.planner import PlanError, inventory_from_cluster, inventory_from_plan, plan
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.spec import SpecError, load_cluster_spec, load_workload_spec

MODELS = [m.name for m in GPU_MODELS]

MODES = [None, None, None, "mig", "mps", "whole", "time-slice"]
clusters = st.lists(
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.integers(1, 3), st.sampled_from(MODES)), min_size=1, max_size=2
    ),
    min_size=1,
    max_size=3,
).map(
    lambda nodes: {
        "nodes": [
            {
                "name": f"n{i}",
                "gpus": [{"model": m, "count": c, **({"mode": md} if md else {})} for m, c, md in groups],
            }
            for i, groups in enumerate(nodes)
        ]
    }
)

workload = st.fixed_dictionaries(
    {
        "vram_mib": st.integers(500, 90_000),
        "priority": st.sampled_from(["P0", "P1", "P2"]),
        "replicas": st.integers(1, 3),
        "isolation": st.sampled_from(["any", "any", "mig", "mps"]),
        "role": st.sampled_from(["llm", "guardrail", "embedding", "rerank"]),
    }
)
workloads = st.lists(workload, min_size=1, max_size=5).map(
    lambda ws: {"workloads": [{"name": f"w{i}", **w} for i, w in enumerate(ws)]}
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters, workloads)
def test_plan_properties(cluster_doc, workload_doc):
    try:
        cluster = load_cluster_spec(cluster_doc)
    except SpecError:
        assume(False)  # a forced mode the model cannot run (mig on L40S): rejected at parse time
        return
    wl = load_workload_spec(workload_doc)
    try:
        p = plan(cluster, wl)
    except PlanError as exc:
        assert exc.workload and exc.shortfall_mib > 0
        assert f"'{exc.workload}'" in str(exc)
        return
    forced_modes = {spec.gpu_id: spec.mode for spec in cluster.gpus()}
    slices = {}
    for g in p.gpus:
        if g.mig:
            assert is_legal_layout(g.model, g.mig), (g.gpu_id, g.mig)
        total = sum(s.vram_mib for s in g.slices)
        assert total <= g.model.memory_mib
        forced = forced_modes[g.gpu_id]
        if forced is not None:
            assert g.mode is forced, (g.gpu_id, g.mode, forced)
        for s in g.slices:
            assert s.id.startswith(g.gpu_id + "/")
            slices[s.id] = (g, s)
    online = Counter()
    for pl in p.placements:
        g, s = slices[pl.slice]
        assert g.gpu_id == pl.gpu_id  # a replica lives on exactly one GPU
        assert s.vram_mib >= pl.need_mib
        w = wl.by_name(pl.workload)
        if w.isolation.value == "mig":
            assert s.kind is SliceKind.MIG
        if w.isolation.value == "mps":
            assert s.kind in (SliceKind.MPS, SliceKind.TIME_SLICE)
        if w.priority != "P2":
            assert not s.pool
            online[pl.slice] += 1
    assert all(n == 1 for n in online.values())
    placed = {(pl.workload, pl.replica) for pl in p.placements}
    unplaced = {(u.workload, u.replica) for u in p.unplaced}
    expected = {(w.name, i) for w in wl.workloads for i in range(w.replicas)}
    assert placed | unplaced == expected and not placed & unplaced
    assert all(wl.by_name(w).priority == "P2" for w, _ in unplaced)
    # mig-parted round trip
    doc = to_mig_parted(p)
    for node in {g.node for g in p.gpus}:
        layouts = node_layouts(doc, node)
        for g in p.gpus:
            if g.node == node and g.mig:
                assert layouts[g.index] == dict(Counter(i.profile for i in g.mig))
                assert find_placement(g.model, [i.profile for i in g.mig]) is not None
    inv = inventory_from_plan(p)
    assert len(inv) == len(slices)
    assert len(inventory_from_cluster(cluster)) == len(cluster.gpus())


def test_inventory_from_plan_ids_and_compute():
    cluster = load_cluster_spec(
        {
            "nodes": [
                {"name": "gpu-a", "gpus": [{"model": "A100-SXM4-80GB", "uuids": ["GPU-aaaa"]}]},
                {"name": "gpu-b", "gpus": ["L40S-48GB"]},
            ]
        }
    )
    wl = load_workload_spec(
        {
            "workloads": [
                {
                    "name": "main",
                    "model": "qwen2.5-32b",
                    "quant": "awq",
                    "max_context": 16384,
                    "concurrency": 4,
                    "priority": "P0",
                },
                {"name": "emb", "model": "bge-m3", "max_context": 512, "replicas": 2, "isolation": "mig"},
                {"name": "guard", "model": "qwen2.5-0.5b", "priority": "P0"},
            ]
        }
    )
    inv = inventory_from_plan(plan(cluster, wl))
    by_id = {s.id: s for s in inv}
    assert set(by_id) == {
        "gpu-a/0/mig-1g.10gb-0",
        "gpu-a/0/mig-1g.10gb-1",
        "gpu-a/0/mig-2g.20gb-2",
        "gpu-a/0/mig-3g.40gb-4",
        "gpu-b/0/mps-guard-0",
        "gpu-b/0/mps-pool",
    }
    s = by_id["gpu-a/0/mig-3g.40gb-4"]
    assert s.kind is SliceKind.MIG and s.capacity.vram_mib == 40192 and s.capacity.compute_milli == 428
    assert s.gpu_id == "gpu-a/0" and s.node == "gpu-a" and s.profile == "3g.40gb"
    assert dict(s.labels) == {"workload": "main", "replica": "0"}
    assert dict(by_id["gpu-a/0/mig-2g.20gb-2"].labels) == {"pool": "p2"}
    g = by_id["gpu-b/0/mps-guard-0"]
    assert g.kind is SliceKind.MPS and g.capacity.vram_mib == 4096 and g.capacity.compute_milli == 100
    whole = inventory_from_cluster(cluster)
    assert [(s.id, s.uuid, s.capacity.vram_mib) for s in whole] == [
        ("gpu-a/0/whole", "GPU-aaaa", 81920),
        ("gpu-b/0/whole", "", 46068),
    ]
