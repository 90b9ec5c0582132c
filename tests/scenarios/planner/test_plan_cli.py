"""`gpupool plan`: formats on the examples, and bad input -> one line naming file/key/value, exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.hardware.mig import find_placement
from gpupool.hardware.migparted import node_layouts, parse_mig_parted

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = [
    (ROOT / "examples/cluster-a100-l40s.yaml", ROOT / "examples/workloads-agent-platform.yaml"),
    (ROOT / "examples/cluster-h100-h200.yaml", ROOT / "examples/workloads-hopper.yaml"),
]
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["plan", *args])


@pytest.mark.parametrize(("cluster", "workloads"), EXAMPLES)
def test_json_shape(cluster, workloads):
    res = _run("--cluster", str(cluster), "--workloads", str(workloads), "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert {"gpus", "placements", "unplaced"} <= set(doc)
    for g in doc["gpus"]:
        assert {"node", "index", "model", "mode", "mig", "slices"} <= set(g)
        assert g["mode"] in ("mig", "mps", "time-slice", "whole")
        for m in g["mig"]:
            assert set(m) == {"profile", "start"}
    for p in doc["placements"]:
        assert {"workload", "replica", "node", "gpu", "slice"} <= set(p)


@pytest.mark.parametrize(("cluster", "workloads"), EXAMPLES)
def test_mig_parted_round_trip(cluster, workloads):
    res = _run("-c", str(cluster), "-w", str(workloads), "-f", "mig-parted")
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(res.output)
    parse_mig_parted(doc)
    plan_doc = json.loads(_run("-c", str(cluster), "-w", str(workloads), "-f", "json").output)
    for node in {g["node"] for g in plan_doc["gpus"]}:
        layouts = node_layouts(doc, node)
        for g in plan_doc["gpus"]:
            if g["node"] != node:
                continue
            if g["mode"] == "mig":
                counts: dict[str, int] = {}
                for m in g["mig"]:
                    counts[m["profile"]] = counts.get(m["profile"], 0) + 1
                assert layouts[g["index"]] == counts
                names = [p for p, n in counts.items() for _ in range(n)]
                assert find_placement(g["model"], names) is not None
            else:
                assert g["index"] not in layouts


def test_table_and_mps_formats():
    cluster, workloads = EXAMPLES[0]
    res = _run("-c", str(cluster), "-w", str(workloads))
    assert res.exit_code == 0 and "GPU layout" in res.output and "3g.40gb" in res.output
    res = _run("-c", str(cluster), "-w", str(workloads), "-f", "mps")
    assert res.exit_code == 0
    assert "nvidia-cuda-mps-control -d" in res.output
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in res.output
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" in res.output


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD_CLUSTER = "nodes:\n  - name: gpu-a\n    gpus: [{model: A100-SXM4-80GB, count: 1}]\n"
GOOD_WORKLOADS = "workloads:\n  - {name: g, model: qwen2.5-0.5b, priority: P0}\n"


@pytest.mark.parametrize(
    ("cluster", "workloads", "expected"),
    [
        (
            "nodes:\n  - name: a\n    gpus: [{model: A100-FOO}]\n",
            GOOD_WORKLOADS,
            ["c.yaml", "nodes[0].gpus[0].model='A100-FOO'", "unknown GPU model"],
        ),
        (
            GOOD_CLUSTER,
            "workloads:\n  - {name: x, model: gpt-9}\n",
            ["w.yaml", "workloads[0].model='gpt-9'", "unknown model"],
        ),
        (
            GOOD_CLUSTER,
            "workloads:\n  - {name: big, model: qwen2.5-72b, priority: P0}\n",
            ["w.yaml", "workload 'big'", "short by", "MiB"],
        ),
        ("nodes: [\n  - name: a\n", GOOD_WORKLOADS, ["c.yaml", "malformed YAML at line"]),
        (GOOD_CLUSTER, "workloads:\n\t- bad\n", ["w.yaml", "malformed YAML"]),
        (  # a key written twice was read as its last value, unseen
            "nodes:\n  - name: a\n    name: b\n    gpus: [{model: A100-SXM4-80GB, count: 1}]\n",
            GOOD_WORKLOADS,
            ["c.yaml", "line 3", "key 'name' appears twice (first at line 2)"],
        ),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, cluster, workloads, expected):
    c = _write(tmp_path, "c.yaml", cluster)
    w = _write(tmp_path, "w.yaml", workloads)
    res = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "plan", "-c", str(c), "-w", str(w)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for frag in expected:
        assert frag in lines[0]


def test_missing_file_exit_2(tmp_path):
    res = _run("-c", str(tmp_path / "nope.yaml"), "-w", str(tmp_path / "w.yaml"))
    assert res.exit_code == 2
    assert "nope.yaml: no such file" in res.output


def test_seed_example_follows_the_seed_rules():
    cluster, workloads = EXAMPLES[0]
    doc = json.loads(_run("-c", str(cluster), "-w", str(workloads), "-f", "json").output)
    slices = {s["id"]: s for g in doc["gpus"] for s in g["slices"]}
    models = {g["gpu_id"]: g["model"] for g in doc["gpus"]}
    for p in doc["placements"]:
        s = slices[p["slice"]]
        if p["workload"] == "main-llm":
            assert (s["kind"], s["profile"], models[p["gpu_id"]]) == ("mig", "3g.40gb", "A100-SXM4-80GB")
        if p["workload"] in ("guardrail", "intent"):
            assert s["kind"] == "mps" and s["vram_mib"] >= 4096 and models[p["gpu_id"]] == "L40S-48GB"
            assert s["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={s['vram_mib']}M"
        if p["workload"] == "batch-eval":
            assert s["pool"]
    assert doc["summary"]["gpus_used"] == 3 and doc["unplaced"] == []
    reasons = {g["gpu_id"]: g["reason"] for g in doc["gpus"]}
    assert reasons["gpu-a/0"].startswith("MIG: hard isolation for main-llm")
    assert reasons["gpu-b/0"].startswith("MPS: L40S-48GB has no MIG")


def _laughs(depth: int) -> str:
    """YAML whose aliases nest ``depth`` levels of 9 references: 9**depth items once loaded."""
    lines = ['x:\n  l0: &l0 ["x","x","x","x","x","x","x","x","x"]\n']
    for i in range(1, depth):
        lines.append(f"  l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n")
    return "".join(lines) + f"nodes:\n  - name: a\n    gpus: [{{model: *l{depth - 1}}}]\n"


@pytest.mark.parametrize(
    ("cluster", "fragment"),
    [
        (_laughs(7), "x={'l0': ['x', 'x', 'x', 'x', ...]"),  # 9**7 items: never walked whole
        ("nodes:\n  - name: " + "a" * 100_000 + "\n    gpus: [L4-24GB]\n", "nodes[0].name='aaa"),
    ],
)
def test_huge_values_are_reported_abridged(tmp_path, cluster, fragment):
    c = _write(tmp_path, "c.yaml", cluster)
    w = _write(tmp_path, "w.yaml", GOOD_WORKLOADS)
    res = _run("-c", str(c), "-w", str(w))
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert fragment in line and "..." in line and "\n" not in line
    assert len(line) < 500, line
