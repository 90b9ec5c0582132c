"""`gpupool agent` options as a user types them, real subprocesses: each bad one is exit 2 with one
line naming the option as typed (``--gpus``, not the core's ``gpus`` or ``watermarks.vram_high``)
and the value; a named ``--cluster`` / ``--workloads`` file is read whatever the other options (it
was ignored without ``--gateway`` or ``--kube``, even when it did not exist)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli.test_cli_options import CLUSTER, assert_one_line_exit_2, gpupool

AGENT = ("agent", "--node", "n", "--metrics-port", "-1", "--duration-s", "0.1")


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--devices", "bogus"], "invalid --devices='bogus': must be one of"),
        (["--gpus", "0"], "invalid --gpus=0: must be an integer in [1, 64]"),
        (["--gpus", "65"], "invalid --gpus=65"),
        (["--vram-high", "2"], "invalid --vram-high=2.0: must be in [0, 1]"),
        (["--vram-low", "-0.5"], "invalid --vram-low=-0.5"),
        (["--vram-low", "0.9", "--vram-high", "0.5"], "invalid --vram-low=0.9: must be < --vram-high (0.5)"),
        (["--revoke-after-s", "nan"], "invalid --revoke-after-s=nan"),
        (["--engine", "gpu=0"], "invalid --engine url='': must be an http(s) URL"),
        (["--engine", "nonsense"], "invalid --engine='nonsense': expected gpu=<id>,url="),
        (["--engine", "gpu=0,url=http://e,reserved_mib=\u00b2"], "invalid --engine reserved_mib="),
        (["--engine", "gpu=0,url=http://[::1"], "invalid --engine url='http://[::1': not a valid URL"),
        (["--mps", "gpu=0"], "invalid --mps pipe='': must be an absolute directory"),
        (["--mps-pipe-dir", "rel/pipes"], "invalid --mps-pipe-dir='rel/pipes': must be an absolute"),
        (
            ["--mps-daemons", "--mps-pipe-dir", "rel"],
            "invalid --mps-pipe-dir='rel': must be an absolute directory",
        ),
        (["--workload", "lease=x,gpu=0"], "invalid --workload pauser=''"),
        (["--workload", "lease=x,gpu=0,pauser=signal,pgid=abc"], "invalid --workload pgid='abc'"),
        (["--workload", "lease=x,gpu=0,pauser=signal,pids=1;x"], "invalid --workload pids='1;x'"),
        (["--cluster", "no-such-cluster.yaml"], "--cluster: no-such-cluster.yaml: no such file"),
        (["--workloads", CLUSTER], "--workloads needs --cluster"),
        (["--node", "gpu-a", "--cluster", CLUSTER, "--workloads", CLUSTER], "--workloads: "),
    ],
)
def test_a_bad_agent_option_is_exit_2_naming_it(args: list[str], want: str) -> None:
    assert_one_line_exit_2(gpupool(*AGENT, *args), want)


def test_a_cluster_file_that_is_not_one_is_exit_2_naming_the_option(tmp_path: Path) -> None:
    not_yaml = tmp_path / "c.yaml"
    not_yaml.write_text("nodes: [unclosed\n")
    assert_one_line_exit_2(
        gpupool(*AGENT, "--cluster", str(not_yaml)), f"--cluster: {not_yaml}: malformed YAML"
    )
    (tmp_path / "d").mkdir()
    assert_one_line_exit_2(gpupool(*AGENT, "--cluster", str(tmp_path / "d")), "--cluster: ")
    wrong = tmp_path / "w.yaml"
    wrong.write_text("workloads: []\n")
    assert_one_line_exit_2(gpupool(*AGENT, "--cluster", str(wrong)), f"--cluster: {wrong}: ")


def test_a_valid_cluster_file_runs() -> None:
    out = gpupool(*AGENT, "--node", "gpu-a", "--cluster", CLUSTER)
    assert out.returncode == 0, out.stderr
    assert "is not a node of" not in out.stderr


def test_a_node_the_cluster_file_does_not_name_runs_and_says_so() -> None:
    # legal (a node that joined after the plan, one file for every node) but never silent
    out = gpupool(*AGENT, "--cluster", CLUSTER)
    assert out.returncode == 0, out.stderr
    assert "--node 'n' is not a node of --cluster" in out.stderr and "gpu-a, gpu-b" in out.stderr


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (
            ["--engine", "gpu=0,url=http://127.0.0.1:9"],
            "invalid --engine gpu='0': not a GPU of node 'n' (n/0, n/1)",
        ),
        (
            ["--workload", "lease=x,gpu=n/2,pauser=signal,pgid=99999"],
            "invalid --workload gpu='n/2': not a GPU of node 'n' (n/0, n/1)",
        ),
        (["--mps", "gpu=gpu-a/0,pipe=/run/mps"], "invalid --mps gpu='gpu-a/0': not a GPU of node 'n'"),
    ],
)
def test_a_gpu_the_node_does_not_have_is_exit_2_naming_it(args: list[str], want: str) -> None:
    """GPU ids are ``<node>/<index>`` as the device source reads them: an engine, workload or MPS GPU
    naming another id (``gpu=0``, another node's GPU) was accepted and then never matched, so its KV
    correction, pausing or MPS limits silently never applied."""
    assert_one_line_exit_2(gpupool(*AGENT, "--gpus", "2", *args), want)


def test_gpus_of_the_node_are_accepted() -> None:
    out = gpupool(*AGENT, "--gpus", "2", "--engine", "gpu=n/1,url=http://127.0.0.1:9")
    assert out.returncode == 0, out.stderr
