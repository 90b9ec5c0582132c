"""`gpupool sim` subcommands: listing, bad input (exit code 2, one line)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.sim.policies import SIM_POLICIES

GOLDEN = Path(__file__).parent / "golden"


def test_policies_one_per_line() -> None:
    result = CliRunner().invoke(app, ["sim", "policies"])
    assert result.exit_code == 0
    assert [line.removesuffix(" (default)") for line in result.stdout.splitlines()] == list(SIM_POLICIES)


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path) -> None:
    base = ["sim", "fgd", "--pods", str(GOLDEN / "pods.csv"), "--nodes", str(GOLDEN / "nodes.csv")]
    cases = [
        ([*base, "--policy", "nope"], "invalid --policy='nope'"),
        ([*base, "--seeds", "4x"], "invalid --seeds='4x'"),
        (
            ["sim", "fgd", "--pods", str(tmp_path / "none.csv"), "--nodes", str(GOLDEN / "nodes.csv")],
            "not found",
        ),
    ]
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,0\n")
    cases.append(
        (
            ["sim", "fgd", "--pods", str(bad), "--nodes", str(GOLDEN / "nodes.csv")],
            "gpu_milli=0 but num_gpu=1",
        )
    )
    cpu_only = tmp_path / "cpu_only.csv"
    cpu_only.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1,0,0\n")
    no_gpu = tmp_path / "no_gpu.csv"
    no_gpu.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,0,\n")
    cases += [
        (
            ["sim", "fgd", "--pods", str(cpu_only), "--nodes", str(GOLDEN / "nodes.csv")],
            "no pod asks for a GPU",
        ),
        (["sim", "fgd", "--pods", str(GOLDEN / "pods.csv"), "--nodes", str(no_gpu)], "no node has a GPU"),
    ]
    huge = "9" * 25  # past a 64-bit integer: a clear error, not numpy's OverflowError
    huge_pod = tmp_path / "huge_pod.csv"
    huge_pod.write_text(f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,{huge},1,1,500\n")
    huge_node = tmp_path / "huge_node.csv"
    huge_node.write_text(f"sn,cpu_milli,memory_mib,gpu,model\nn0,64000,{huge},2,T4\n")
    cases += [
        (
            ["sim", "fgd", "--pods", str(huge_pod), "--nodes", str(GOLDEN / "nodes.csv")],
            f"column cpu_milli={huge} out of range",
        ),
        (
            ["sim", "fgd", "--pods", str(GOLDEN / "pods.csv"), "--nodes", str(huge_node)],
            f"column memory_mib={huge} out of range",
        ),
    ]
    trace = tmp_path / "data" / "alibaba-gpu-v2023"  # (`sim report` reads its lists from a data root)
    trace.mkdir(parents=True)
    tiny = trace / "openb_pod_list_tiny.csv"  # 1 milli-GPU per pod: millions of arrivals to fill the cluster
    tiny.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(f"p{i},1,1,1,1\n" for i in range(10))
    )
    wide = trace / "openb_node_list_gpu_node.csv"
    wide.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},64000,1024,8,T4\n" for i in range(250))
    )
    too_many = (
        f"{tiny}: filling 130% of the 2000 GPUs' capacity with these pods takes about 2,600,000 arrivals"
    )
    cases.append((["sim", "fgd", "--pods", str(tiny), "--nodes", str(wide)], too_many))
    report = [
        "sim",
        "report",
        "--data",
        str(tmp_path / "data"),
        "--workloads",
        "tiny",
        "--out",
        str(tmp_path / "o"),
    ]
    cases.append((report, too_many))
    for args, msg in cases:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert msg in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_text_output() -> None:
    args = ["sim", "fgd", "--pods", str(GOLDEN / "pods.csv"), "--nodes", str(GOLDEN / "nodes.csv")]
    result = CliRunner().invoke(app, [*args, "--policy", "bestfit"])
    assert result.exit_code == 0
    assert "unallocated GPU at 100% arrived" in result.stdout


HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    "scheduled_time\n"
)


def test_a_value_no_arrival_lands_near_is_said_not_printed_as_none(tmp_path: Path) -> None:
    """10 GPUs, 8-GPU pods: no arrival lands within 1 point of 100 % (the top-up stops at 80 %); the
    text said ``None%``, it now says why there is no value (``--json`` keeps null)."""
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,262144,8,V100M16\n")
    pods = tmp_path / "p.csv"
    pods.write_text(HEADER + "p0,1000,1024,8,1000,,LS,Running,0,10,0\n")
    result = CliRunner().invoke(app, ["sim", "fgd", "--pods", str(pods), "--nodes", str(nodes)])
    assert result.exit_code == 0 and "None" not in result.stdout, result.stdout
    assert "n/a (no arrival lands within 1 point" in result.stdout
