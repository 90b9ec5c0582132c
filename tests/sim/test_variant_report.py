"""``gpupool sim report --variants`` end to end at tiny size, and the relaxation floor under it.

The data root is made by the test: the golden 6-node cluster as the GPU node list and the golden
40-pod trace as the default list. Proves: the report writes variants.md and variants.json; each
cell holds the per-seed numbers of ``gpupool sim fgd`` on the same variant file (runs that stop past
101 % arrived give the same value at 100 % as full runs) and their median; the table row carries the
mix, both policies, the floor and the default against FGD; a second run is served from the cache;
bad input exits 2 naming the field and writes nothing. The floor: hand-worked on a CPU-bound case,
never above any policy's unallocated GPU on the tiny trace, and equal to "the arrivals fit" where
CPU cannot bind.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.sim.bound import offline_bound, placeable_milli
from gpupool.sim.engine import run
from gpupool.sim.metrics import run_curves, unallocated_at
from gpupool.sim.policies import DEFAULT_SIM_POLICY
from gpupool.sim.trace import NodeSpec, PodSpec, load_nodes, load_pods
from gpupool.sim.variants import make_variant

GOLDEN = Path(__file__).with_name("golden")
POLICIES = f"fgd,{DEFAULT_SIM_POLICY}"


def _root(tmp_path: Path) -> Path:
    trace = tmp_path / "data" / "alibaba-gpu-v2023"
    trace.mkdir(parents=True)
    shutil.copy(GOLDEN / "nodes.csv", trace / "openb_node_list_gpu_node.csv")
    shutil.copy(GOLDEN / "pods.csv", trace / "openb_pod_list_default.csv")
    return tmp_path / "data"


def _report(root: Path, out: Path, cache: Path, *extra: str) -> tuple[int, str]:
    args = ["sim", "report", "--data", str(root), "--variants", "base,cpu300", "--policies", POLICIES]
    args += ["--seeds", "42,44", "--out", str(out), "--cache", str(cache), "--workers", "1", *extra]
    r = CliRunner().invoke(app, args)
    return r.exit_code, r.output


def test_variant_report_writes_the_matrix_with_the_floor(tmp_path: Path) -> None:
    root = _root(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, output = _report(root, out, cache)
    assert code == 0, output
    data = json.loads((out / "variants.json").read_text())
    assert data["default_policy"] == DEFAULT_SIM_POLICY and data["seeds"] == [42, 44]
    assert set(data["cells"]) == {f"{v}/{p}" for v in ("base", "cpu300") for p in POLICIES.split(",")}
    nodes = load_nodes(root / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv")
    pods = load_pods(root / "alibaba-gpu-v2023" / "openb_pod_list_default.csv")
    for v in ("base", "cpu300"):
        variant = make_variant(pods, nodes, v, seed=1)
        for p in POLICIES.split(","):
            cell = data["cells"][f"{v}/{p}"]
            full = [unallocated_at(run_curves(run(nodes, variant, policy=p, seed=s)), 100) for s in (42, 44)]
            assert [r["unallocated_gpu_pct_at_100"] for r in cell["per_seed"]] == full
            assert cell["unallocated_gpu_pct_at_100"] == statistics.median(full)
            floor = data["bound"][v]["unallocated_gpu_pct_at_100"]
            assert floor <= cell["unallocated_gpu_pct_at_100"]
        assert data["mix"][v]["pods"] == len(variant)
    table = (out / "variants.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| cpu300 |"))
    fgd = data["cells"]["cpu300/fgd"]["unallocated_gpu_pct_at_100"]
    ours = data["cells"][f"cpu300/{DEFAULT_SIM_POLICY}"]["unallocated_gpu_pct_at_100"]
    assert f"{fgd:.2f}" in row and f"{ours:.2f}" in row
    assert f"{100 * (ours - fgd) / fgd:+.1f} %" in row
    assert f"{data['bound']['cpu300']['unallocated_gpu_pct_at_100']:.2f}" in row
    assert "over 2 variants: mean" in table
    again = tmp_path / "again"
    code, output = _report(root, again, cache)
    assert code == 0, output
    assert json.loads((again / "variants.json").read_text()) == data


def test_variant_report_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    root = _root(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    for extra, msg in (
        (["--variants", "base,cpu999"], 'invalid variant="cpu999"'),
        (["--bound", "share60"], "invalid --bound entry 'share60'"),
        (["--variant-seed", "-3"], "invalid --variant-seed=-3"),
        (["--policies", "fgd,nope"], "invalid --policies entry 'nope'"),
        (["--policies", "fgd,fgd"], "a policy is listed twice"),
        (["--seeds", "42,42"], "a seed is listed twice"),
        (["--bound", "base,base"], "invalid --bound='base,base': 'base' is the same variant as 'base'"),
        (["--bound", ""], "invalid --bound='': no variant given"),
        (["--bound", "cpu300,x"], 'invalid variant="x"'),
        (["--policies", ""], "invalid --policies='': no policy given"),
    ):
        code, output = _report(root, out, cache, *extra)
        assert code == 2, (extra, output)
        assert msg in output and len(output.strip().splitlines()) == 1
    assert not out.exists()


def _pod(name: str, cpu: int, milli: int, num: int) -> PodSpec:
    return PodSpec(name=name, cpu_milli=cpu, memory_mib=0, num_gpu=num, gpu_milli=milli)


def test_floor_takes_the_least_cpu_per_gpu_first_and_splits_the_last_pod() -> None:
    # 4 GPUs, 40 cores. Pods: a (2 GPUs, 10 cores: 5 per GPU), b (1 GPU, 20 cores), c (1 GPU, 30
    # cores), d (CPU only, 40 cores: never helps). Take a (2000 milli, 30 cores left), then b
    # (3000, 10 left), then 10/30 of c: 3333.3 -> 3333 milli.
    pods = [
        _pod("c", 30_000, 1000, 1),
        _pod("d", 40_000, 0, 0),
        _pod("a", 10_000, 1000, 2),
        _pod("b", 20_000, 1000, 1),
    ]
    assert placeable_milli(pods, gpu_milli=4000, cpu_milli=40_000) == 3333
    assert placeable_milli(pods, gpu_milli=2500, cpu_milli=400_000) == 2500  # GPU binds first
    assert placeable_milli(pods, gpu_milli=4000, cpu_milli=0) == 0


def test_floor_is_the_arrivals_where_cpu_cannot_bind() -> None:
    nodes = [
        NodeSpec(name=f"n{i}", cpu_milli=10**6, memory_mib=10**6, gpu_count=2, gpu_model="T4")
        for i in range(2)
    ]
    pods = [_pod(f"p{i}", 1000, 500, 1) for i in range(10)]  # 5 GPUs asked of 4: 8 pods arrive by 100 %
    r = offline_bound(nodes, pods, seed=42)
    assert r.arrived_milli == 4000 == r.placeable_milli and r.unallocated_pct == 0.0


def test_a_damaged_or_stale_floor_entry_is_recomputed(tmp_path: Path) -> None:
    """A floor entry cut short is run again; after the base pod list changes, the same --cache gives
    what a fresh cache gives (entries are keyed by the inputs, not the variant name alone)."""
    root = _root(tmp_path)
    cache = tmp_path / "cache"
    args = ("--variants", "base", "--policies", "fgd", "--seeds", "42")
    assert _report(root, tmp_path / "first", cache, *args)[0] == 0
    first = json.loads((tmp_path / "first" / "variants.json").read_text())
    (floor,) = cache.rglob("base__floor*__42.json")
    floor.write_text(floor.read_text()[:50])
    code, output = _report(root, tmp_path / "again", cache, *args)
    assert code == 0, output
    assert json.loads((tmp_path / "again" / "variants.json").read_text()) == first
    pods = root / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
    lines = pods.read_text().splitlines()
    pods.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    assert _report(root, tmp_path / "reused", cache, *args)[0] == 0
    assert _report(root, tmp_path / "fresh", tmp_path / "fresh-cache", *args)[0] == 0
    fresh = json.loads((tmp_path / "fresh" / "variants.json").read_text())
    assert json.loads((tmp_path / "reused" / "variants.json").read_text()) == fresh
    assert fresh["bound"] != first["bound"]


def test_bound_names_a_variant_as_variants_does(tmp_path: Path) -> None:
    """--bound cpu0300 is the variant --variants calls cpu300 (as cpu050 is cpu50 there): it gets
    the floor under the name --variants gave it."""
    root = _root(tmp_path)
    out = tmp_path / "out"
    code, output = _report(
        root, out, tmp_path / "cache", "--policies", "fgd", "--seeds", "42", "--bound", "cpu0300"
    )
    assert code == 0, output
    assert set(json.loads((out / "variants.json").read_text())["bound"]) == {"cpu300"}
