"""``gpupool sim report`` end to end at tiny size: a data root made by the test (the golden 6-node
cluster and 40-pod trace, plus an authors' results file of two runs), two policies, two seeds (each
reaches 100 % arrived on this trace), one worker process.

Proves: the report writes report.md, results.json and both plots per workload; each results.json
cell holds the per-seed numbers of ``gpupool sim fgd`` for the same cell and their median; the
table prints our median with the authors' median (100 - median allocated at 100 %) beside it; a
second run from the cache writes the same results; bad input exits 2 naming the field and value.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.main import app

GOLDEN = Path(__file__).with_name("golden")
COLUMNS = ",".join(str(k) for k in range(131))


def _data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    trace = root / "alibaba-gpu-v2023"
    trace.mkdir(parents=True)
    shutil.copy(GOLDEN / "nodes.csv", trace / "openb_node_list_gpu_node.csv")
    shutil.copy(GOLDEN / "pods.csv", trace / "openb_pod_list_tiny.csv")
    authors = root / "fgd-atc23-expected-results"
    authors.mkdir()
    rows = [f"workload,sc_policy,tune,seed,total_gpus,{COLUMNS}"]
    for seed, at_100 in ((42, 90.0), (43, 94.0)):  # median allocated 92 % -> 8.00 % unallocated
        values = [str(min(k, at_100)) for k in range(131)]
        rows.append(f"openb_pod_list_tiny,06-FGD,1.3,{seed},48,{','.join(values)}")
    (authors / "analysis_allo_discrete.csv").write_text("\n".join(rows) + "\n")
    return root


def _report(root: Path, out: Path, cache: Path, *extra: str) -> tuple[int, str]:
    args = ["sim", "report", "--data", str(root), "--workloads", "tiny", "--policies", "bestfit,fgd"]
    args += ["--seeds", "42,44", "--out", str(out), "--cache", str(cache), "--workers", "1", *extra]
    r = CliRunner().invoke(app, args)
    return r.exit_code, r.output


def test_report_writes_the_table_results_and_plots(tmp_path: Path) -> None:
    root = _data_root(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, output = _report(root, out, cache)
    assert code == 0, output
    for name in ("report.md", "results.json", "unallocated_tiny.png", "frag_rate_tiny.png"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"tiny/bestfit", "tiny/fgd"}
    trace = root / "alibaba-gpu-v2023"
    for policy in ("bestfit", "fgd"):
        cell = results[f"tiny/{policy}"]
        assert [r["seed"] for r in cell["per_seed"]] == [42, 44]
        per_seed = [r["unallocated_gpu_pct_at_100"] for r in cell["per_seed"]]
        assert cell["unallocated_gpu_pct_at_100"] == statistics.median(per_seed)
        single = CliRunner().invoke(
            app,
            ["sim", "fgd", "--pods", str(trace / "openb_pod_list_tiny.csv"),
             "--nodes", str(trace / "openb_node_list_gpu_node.csv"), "--policy", policy, "--seeds", "42,44",
             "--json"],
        )  # fmt: skip
        assert single.exit_code == 0, single.output
        alone = json.loads(single.output)
        assert [r["unallocated_gpu_pct_at_100"] for r in alone["per_seed"]] == per_seed
    table = (out / "report.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| tiny |"))
    bestfit = results["tiny/bestfit"]["unallocated_gpu_pct_at_100"]
    fgd = results["tiny/fgd"]["unallocated_gpu_pct_at_100"]
    assert row == f"| tiny | {bestfit:.2f} | {fgd:.2f} (8.00) |"
    # a second run is served from the cache and writes the same results
    again = tmp_path / "again"
    code, output = _report(root, again, cache)
    assert code == 0, output
    assert json.loads((again / "results.json").read_text()) == results


def test_report_bad_input_exits_2_naming_it(tmp_path: Path) -> None:
    root = _data_root(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, output = _report(root, out, cache, "--policies", "bestfit,nope")
    assert code == 2 and "nope" in output and "--policies" in output
    code, output = _report(root, out, cache, "--workloads", "missing")
    assert code == 2 and "openb_pod_list_missing.csv" in output
    code, output = _report(root, out, cache, "--seeds", "4x")
    assert code == 2 and "--seeds" in output and "4x" in output
    for extra, message in (
        (("--workers", "100000"), "invalid --workers=100000: must be in [1, 1024]"),  # not 100000 forks
        (("--policies", ""), "invalid --policies='': no policy given"),  # not the default list
        (("--workloads", ""), "invalid --workloads='': no workload given"),  # not an empty table
        (("--workloads", " , "), "invalid --workloads=' , ': no workload given"),
        (("--workloads", "tiny,tiny"), "invalid --workloads='tiny,tiny': a workload is listed twice"),
    ):
        code, output = _report(root, out, cache, *extra)
        assert code == 2 and message in output and len(output.strip().splitlines()) == 1, (extra, output)
    assert not out.exists()  # nothing written on bad input


def test_a_damaged_cache_entry_is_recomputed_never_used(tmp_path: Path) -> None:
    """Truncated JSON, JSON of another shape and an entry of another seed are run again and
    rewritten; the results equal the first run's. A cache entry that cannot be written (a directory
    in its place) is exit 2 naming the file, not a traceback."""
    root = _data_root(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert _report(root, out, cache)[0] == 0
    results = json.loads((out / "results.json").read_text())
    entries = sorted(cache.glob("tiny__*.json"))
    assert len(entries) == 4
    entries[0].write_text(entries[0].read_text()[:100])  # an interrupted write
    entries[1].write_text("[]")
    entries[2].write_text(entries[3].read_text())  # another seed's result under this name
    code, output = _report(root, tmp_path / "again", cache)
    assert code == 0, output
    assert json.loads((tmp_path / "again" / "results.json").read_text()) == results
    for entry in entries:
        assert json.loads(entry.read_text())["seed"] == int(entry.stem.rsplit("__", 1)[1])
    entries[0].unlink()
    entries[0].mkdir()
    code, output = _report(root, tmp_path / "third", cache)
    assert code == 2 and output.count("error:") == 1
    assert f"cache entry {entries[0]}: not a file" in output.strip().splitlines()[-1]


def test_a_cached_run_is_not_reused_for_another_pod_list_of_the_same_name(tmp_path: Path) -> None:
    """The cache is keyed by the inputs, not the workload name alone: after the pod list changes,
    the same --cache gives what a fresh cache gives."""
    root = _data_root(tmp_path)
    cache = tmp_path / "cache"
    assert _report(root, tmp_path / "first", cache)[0] == 0
    pods = root / "alibaba-gpu-v2023" / "openb_pod_list_tiny.csv"
    lines = pods.read_text().splitlines()
    pods.write_text("\n".join(lines[: len(lines) // 2]) + "\n")  # half the pods
    code, output = _report(root, tmp_path / "reused", cache)
    assert code == 0, output
    code, output = _report(root, tmp_path / "fresh", tmp_path / "fresh-cache")
    assert code == 0, output
    fresh = json.loads((tmp_path / "fresh" / "results.json").read_text())
    assert json.loads((tmp_path / "reused" / "results.json").read_text()) == fresh
    assert fresh != json.loads((tmp_path / "first" / "results.json").read_text())


def test_a_malformed_workload_is_told_before_anything_is_written(tmp_path: Path) -> None:
    root = _data_root(tmp_path)
    bad = root / "alibaba-gpu-v2023" / "openb_pod_list_bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1x,1,1,500\n")
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, output = _report(root, out, cache, "--workloads", "tiny,bad")
    assert code == 2 and f"{bad}:2: column cpu_milli='1x' is not an integer" in output, output
    assert len(output.strip().splitlines()) == 1
    assert not out.exists() and not cache.exists()
