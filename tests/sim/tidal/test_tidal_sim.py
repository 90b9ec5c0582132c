"""`gpupool sim tidal` at CI size: one trace day at reduced load, the real traces, the real core."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import numpy as np
import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.hardware.mig import validate_layout
from gpupool.sim.tidal import perf, platform, traces
from gpupool.sim.tidal.run import RunConfig, run
from gpupool.sim.tidal.serve import coverage

REQUIRED = (
    "gpu_util",
    "vram_util",
    "p0_ttft_slo_attainment",
    "guardrail_p99_ms",
    "batch_tokens_per_day",
    "preemptions",
    "night_serve_ms_p99",
)

needs_data = pytest.mark.skipif(
    not (traces.data_dir() / traces.ALIBABA).exists() or not (traces.data_dir() / traces.AZURE).exists(),
    reason="trace data ../shared/data (or GPUPOOL_DATA_DIR) not present",
)


@pytest.fixture(scope="module")
def result():
    if not (traces.data_dir() / traces.ALIBABA).exists():
        pytest.skip("trace data not present")
    # two trace days (the weekend) at 15 % load: nights, lending and the night paths all happen
    return run(RunConfig(days=2, scale=0.15, seed=3))


@needs_data
def test_json_has_the_required_keys_and_sane_ranges(result):
    assert result["days"] == 2
    assert set(result["strategies"]) == {"dedicated", "static-slicing", "tidal", "tidal-lending"}
    for name, s in result["strategies"].items():
        for k in REQUIRED:
            assert k in s, (name, k)
        assert 0.0 <= s["gpu_util"] <= 1.0 and 0.0 <= s["vram_util"] <= 1.0
        assert 0.0 <= s["p0_ttft_slo_attainment"] <= s["p0_ttft_slo_bound"] + 1e-9
        # idle reserved capacity never counts: useful busy time stays under what was on offer
        assert s["gpu_util"] <= s["capacity_bound_gpu_util"] + 1e-9
        assert s["online_gpu_util"] + s["batch_gpu_util"] == pytest.approx(s["gpu_util"], abs=2e-4)
        assert len(s["gpu_util_by_hour"]) == 48
    json.dumps(result)


@needs_data
def test_only_tidal_lends_and_preempts_through_the_allocator(result):
    st = result["strategies"]
    assert st["dedicated"]["preemptions"] == 0 and st["static-slicing"]["preemptions"] == 0
    tidal = st["tidal"]
    assert result["night_intervals_h"], "the core controller should have found at least one NIGHT"
    assert tidal["preemptions"] == tidal["allocator"]["p2_leases_preempted"] > 0
    assert tidal["capacity_bound_gpu_util"] > st["static-slicing"]["capacity_bound_gpu_util"]
    assert tidal["batch_tokens_per_day"] >= st["static-slicing"]["batch_tokens_per_day"]


@needs_data
def test_batch_work_is_never_dropped(result):
    days = result["days"]
    injected_days = days + 1  # the carried-in backlog at the start, then one at 19:00 each day
    for s in result["strategies"].values():
        total = s["batch_tokens_per_day"] * days + s["batch_backlog_left_tokens"]
        from gpupool.sim.tidal.batch import EVAL_TOKENS_PER_DAY, REEMBED_TOKENS_PER_DAY

        want = injected_days * (EVAL_TOKENS_PER_DAY + REEMBED_TOKENS_PER_DAY) * result["scale"]
        assert total == pytest.approx(want, rel=1e-6)


@needs_data
def test_night_paths_partition_the_night_requests(result):
    t = result["strategies"]["tidal"]
    assert sum(p["requests"] for p in t["night_paths"].values()) == t["night_p0_requests"]
    hb = t["night_paths"]["holdback"]
    assert hb["serve_ms_max"] <= 1000 * (
        perf.HOLDBACK_S + result["pauser_costs"]["p2_iteration_s_main_a100"] * 3
    )


def test_layouts_are_legal_and_the_p2_day_share_is_under_20_percent():
    validate_layout(platform.A100, platform.DAY_LAYOUT_A100_MIG)
    validate_layout(platform.A100, platform.NIGHT_LAYOUT_A100_MIG)
    for name in platform.STRATEGIES:
        plat = platform.build(name)
        p2 = sum(i.spec.sm_fraction for i in plat.instances if i.role == "batch")
        assert p2 / len(plat.gpus) <= 0.20
        by_gpu: dict[str, float] = {}
        for i in plat.instances:
            by_gpu[i.gpu] = by_gpu.get(i.gpu, 0.0) + i.spec.sm_fraction
        assert all(v <= 1.0 + 1e-9 for v in by_gpu.values())
    with pytest.raises(ValueError, match="strategy"):
        platform.build("magic")


def test_roofline_prefill_is_compute_bound_and_decode_bandwidth_bound():
    a100 = perf.whole(perf.A100_80GB)
    g3 = platform._mig("3g.40gb")
    m = perf.QWEN25_14B_AWQ
    t = perf.prefill_s(m, a100, np.array([1000.0, 2000.0]))
    assert t[1] > 2 * t[0] * 0.99  # attention makes it slightly super-linear
    assert perf.prefill_s(m, g3, np.array([1000.0]))[0] == pytest.approx(t[0] * 108 / 42)
    d1 = perf.decode_iter_s(m, a100, batch=1, ctx_tokens=1000)
    assert d1 == pytest.approx(m.weight_bytes / (2.0e12 * perf.ETA_BANDWIDTH), rel=0.05)
    assert perf.decode_iter_s(m, g3, batch=1, ctx_tokens=1000) == pytest.approx(d1 * 2, rel=0.01)
    assert perf.cuda_checkpoint_s(80e9) == pytest.approx(15.0)
    assert perf.sleep_l1_s(perf.ModelSpec("x", "decoder", 1, 64 * perf.GIB, 1, 1, 1, "")) == pytest.approx(
        3.0
    )


def test_coverage_is_the_union_of_intervals():
    edges = np.array([0.0, 10.0, 20.0, 30.0])
    s = np.array([1.0, 2.0, 15.0, 18.0])
    e = np.array([5.0, 12.0, 16.0, 25.0])
    assert coverage(s, e, edges).tolist() == pytest.approx([9.0, 5.0, 5.0])  # [1,12] [15,16] [18,25]
    assert coverage(np.array([]), np.array([]), edges).tolist() == [0.0, 0.0, 0.0]


def test_bad_config_is_rejected_with_the_field():
    for kwargs, field in (
        ({"days": 0}, "days"),
        ({"scale": -1.0}, "scale"),
        ({"main_model": "70b"}, "main_model"),
        ({"lending_target": 0.0}, "lending_target"),
    ):
        with pytest.raises(ValueError, match=field):
            RunConfig(**kwargs)


@needs_data
def test_cli_json_and_report(tmp_path):
    r = CliRunner().invoke(
        app, ["sim", "tidal", "--days", "1", "--scale", "0.05", "--json", "--out", str(tmp_path)]
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert set(data["strategies"]) == {"dedicated", "static-slicing", "tidal", "tidal-lending"}
    for f in ("results.json", "results.md", "util_by_hour.png", "slo.png", "batch_throughput.png"):
        assert (tmp_path / f).stat().st_size > 0
    bad = CliRunner().invoke(app, ["sim", "tidal", "--days", "12"])
    assert bad.exit_code == 2


def test_live_demand_signal_follows_the_trace_shape():
    from gpupool.cli.tidal import live_demand

    assert live_demand(3.5) < 0.05 < 1.0 < live_demand(14.0)
    assert sum(live_demand(h) for h in range(24)) / 24 == pytest.approx(1.0)


@needs_data
def test_without_batch_work_nothing_is_held_back_and_the_what_if_runs():
    r = run(RunConfig(days=1, scale=0.1, seed=5, backlog_scale=0.0, what_if=True))
    st = r["strategies"]
    assert set(st) == {"dedicated", "static-slicing", "tidal", "tidal-lending", "tidal+day-lending"}
    for name in ("tidal", "tidal-lending", "tidal+day-lending"):
        assert st[name]["p2_request_holdbacks"] == 0  # P0 waits for P2 only where P2 really ran
        assert st[name]["batch_tokens_per_day"] == 0 and st[name]["batch_gpu_util"] == 0.0
    assert st["tidal+day-lending"]["capacity_bound_gpu_util"] > st["tidal"]["capacity_bound_gpu_util"]


@needs_data
def test_nights_lie_in_the_night_window_and_every_lent_engine_is_reclaimed(result):
    end_h = 24.0 * result["days"]
    for a, b in result["night_intervals_h"]:
        assert a % 24 >= 20.0 or a % 24 < 7.0
        # a night ends at the end of the run, at 07:00 by the schedule, or earlier on traffic
        assert b == end_h or abs(b % 24 - 7.0) < 1e-6 or b % 24 < 7.0 or b % 24 >= 20.0
    back = [t for t in result["mode_transitions"] if t["to"] == "day"]
    assert any(t["reason"] == "schedule" for t in back)
    for t in back:
        hhmm = t["at"][11:16]  # local wall time of the transition
        if t["reason"] == "schedule":
            assert hhmm == "07:00", t  # the night window ends at 07:00, not before
        else:
            assert t["reason"] == "traffic-high" and (hhmm < "07:00" or hhmm >= "20:00"), t
    lent = sum(1 for i in platform.build("tidal").instances if i.lend == "engine") + 1  # + the 7g GPU
    assert result["strategies"]["tidal"]["preemptions"] == lent * len(result["night_intervals_h"])


@needs_data
def test_tidal_lending_lends_by_day_only_while_its_guard_allows():
    # a saturating backlog: batch work is waiting by day, so day lending has something to run
    r = run(RunConfig(days=1, scale=0.1, seed=4, backlog_scale=20))
    st = r["strategies"]
    lend, tidal = st["tidal-lending"], st["tidal"]
    info = lend["lending"]
    assert info["minutes_lending"] > 0 and info["level_changes"] > 0
    assert 0.0 < info["mean_day_level"] <= 1.0
    assert lend["batch_gpu_util"] > tidal["batch_gpu_util"]
    assert lend["capacity_bound_gpu_util"] > tidal["capacity_bound_gpu_util"]
    assert lend["p0_ttft_slo_attainment"] <= lend["p0_ttft_slo_bound"] + 1e-9
    # the guard holds the attainment among the requests that can meet the SLO near its target
    assert lend["p0_ttft_slo_attainment"] / lend["p0_ttft_slo_bound"] >= info["target"] - 0.01


@needs_data
def test_another_azure_format_trace_drives_the_token_sizes(tmp_path):
    short = tmp_path / "short.csv"
    short.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"0,{50 + i},{20 + i}\n" for i in range(50))
    )
    # scale 0.01: a run with 50-token prompts costs about 4x one at 0.05 with the code trace's
    r = run(RunConfig(days=1, scale=0.01, seed=2, trace=str(short)))
    base = run(RunConfig(days=1, scale=0.01, seed=2))
    assert r["token_trace"] == "short.csv" and base["token_trace"] == "AzureLLMInferenceTrace_code.csv"
    # short prompts: every P0 request can meet the TTFT SLO; the code trace's long ones cannot
    assert r["strategies"]["dedicated"]["p0_ttft_slo_bound"] == 1.0
    assert base["strategies"]["dedicated"]["p0_ttft_slo_bound"] < 1.0
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,Prompt\n0,12\n")
    out = CliRunner().invoke(app, ["sim", "tidal", "--days", "1", "--scale", "0.05", "--trace", str(bad)])
    assert out.exit_code == 2 and "ContextTokens" in out.output
    missing = CliRunner().invoke(app, ["sim", "tidal", "--days", "1", "--trace", str(tmp_path / "nope.csv")])
    assert missing.exit_code == 2 and "no such file" in missing.output
    header = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
    for name, data, says in (
        ("neg.csv", header + b"0,-5,20\n", "must be >= 0"),
        ("latin.csv", header + b"0,5,20\n\xe9,1,1\n", "not UTF-8 text"),
        ("huge.csv", header + b"0,5,20\n0,1000000000,10\n", "line 3: 1000000000 + 10 tokens exceed"),
        ("noprompt.csv", header + b"0,0,20\n0,0,5\n", "every request has 0 ContextTokens"),
    ):
        (tmp_path / name).write_bytes(data)
        out = CliRunner().invoke(app, ["sim", "tidal", "--days", "1", "--trace", str(tmp_path / name)])
        assert out.exit_code == 2 and says in out.output, out.output
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + short.read_bytes())
    # a byte-order mark changes nothing: the same token sizes, so the same run (a run is a pure
    # function of its inputs; comparing the loaded traces spares a third run)
    with_bom, plain = (traces.load(1, token_trace=tmp_path / n) for n in ("bom.csv", "short.csv"))
    assert with_bom.prompt_tokens.tolist() == plain.prompt_tokens.tolist()
    assert with_bom.output_tokens.tolist() == plain.output_tokens.tolist()


def _genai_dir(tmp_path, name: str, data: bytes):
    """A data directory whose GenAI trace is ``data`` and whose Azure trace is a small valid one."""
    root = tmp_path / name
    (root / traces.ALIBABA).parent.mkdir(parents=True)
    (root / traces.AZURE).parent.mkdir(parents=True)
    (root / traces.AZURE).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,50,20\n0,60,10\n")
    (root / traces.ALIBABA).write_bytes(data)
    return root


def test_a_genai_trace_is_read_whatever_its_layout_and_a_bad_one_is_named(tmp_path, monkeypatch):
    # a day of requests around the simulated warm-up day, hourly, in a reordered CRLF file with a BOM
    hours = [traces.FIRST_DAY - timedelta(days=1, hours=16) + timedelta(hours=h) for h in range(72)]
    rows = "".join(f'"x, {i}",{t:%Y-%m-%d %H:%M:%S},7\r\n' for i, t in enumerate(reversed(hours)))
    good = b"\xef\xbb\xbf" + ("groupId,gmt_create,num_lora\r\n" + rows + "\r\n").encode()
    tr = traces.load(1, base=_genai_dir(tmp_path, "good", good))
    assert tr.hourly_shape.max() == 1.0 and len(tr.hourly_shape) == 48
    header = b"gmt_create,predict_type\n"
    for name, data, says in (
        ("nocol", b"created,predict_type\n2024-11-29 01:00:00,TXT\n", "no column gmt_create"),
        (
            "badtime",
            header + b"2024-11-29 01:00:00,TXT\nyesterday,TXT\n",
            "line 3: column gmt_create='yesterday'",
        ),
        ("short", header + b"2024-11-29 01:00:00,TXT\n\n,\n", "line 4: column gmt_create=''"),
        ("binary", header + b"\xff\xfe\x00\x01garbage\n", "not UTF-8 text"),
        ("empty", b"", "no column gmt_create"),
        ("header-only", header, "no requests"),
        ("elsewhen", header + b"2020-01-01 01:00:00,TXT\n", "no requests in the simulated window"),
    ):
        monkeypatch.setenv("GPUPOOL_DATA_DIR", str(_genai_dir(tmp_path, name, data)))
        out = CliRunner().invoke(app, ["sim", "tidal", "--days", "1", "--scale", "0.05"])
        assert out.exit_code == 2 and says in out.output and traces.ALIBABA in out.output, (name, out.output)
        assert len(out.output.strip().splitlines()) == 1, out.output
    root = _genai_dir(tmp_path, "dir", b"")
    (root / traces.ALIBABA).unlink()
    (root / traces.ALIBABA).mkdir()
    monkeypatch.setenv("GPUPOOL_DATA_DIR", str(root))
    out = CliRunner().invoke(app, ["sim", "tidal", "--days", "1", "--scale", "0.05"])
    assert out.exit_code == 2 and "a directory" in out.output, out.output


def test_an_azure_trace_names_the_bad_column_and_line(tmp_path, monkeypatch):
    day = "".join(f"{traces.FIRST_DAY + timedelta(hours=h - 48):%Y-%m-%d %H:%M:%S}\n" for h in range(96))
    monkeypatch.setenv("GPUPOOL_DATA_DIR", str(_genai_dir(tmp_path, "d", ("gmt_create\n" + day).encode())))
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes(b"GeneratedTokens,TIMESTAMP,ContextTokens\r\n20,0,50\r\n\r\n5, 0 ,x\r\n")
    out = CliRunner().invoke(app, ["sim", "tidal", "--days", "1", "--trace", str(crlf)])
    assert out.exit_code == 2 and "line 4: column ContextTokens='x'" in out.output, out.output


def test_the_simulated_days_follow_first_day_and_lie_in_the_trace(tmp_path, monkeypatch):
    """The window was fixed at 2024-11-29 (warm-up) .. : a GenAI-format trace of other dates could
    not be simulated at all, and days past a trace's end were simulated without traffic, silently.
    Now ``--first-day`` picks the days, and the trace must cover every one of them."""
    day = datetime(2025, 3, 8)
    hours = [day + timedelta(hours=h - 48) for h in range(96)]  # 2025-03-06 .. 03-09, busy by day only
    rows = "".join(f"{t:%Y-%m-%d %H:%M:%S}\n" * (10 if 9 <= t.hour < 19 else 0) for t in hours)
    root = _genai_dir(tmp_path, "d", ("gmt_create\n" + rows).encode())
    (root / traces.AZURE).write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,7000,20\n0,6000,10\n"
    )  # few req/s
    monkeypatch.setenv("GPUPOOL_DATA_DIR", str(root))
    sim = ["sim", "tidal", "--scale", "0.05", "--json"]
    out = CliRunner().invoke(app, [*sim, "--days", "1", "--first-day", "2025-03-08"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert result["first_day"] == "2025-03-08"
    modes = result["mode_transitions"]  # the quiet night of the simulated day, in its local time
    assert [m["at"][:13] for m in modes if m["to"] == "night"] == ["2025-03-08T20"], modes
    for argv, says in (
        ([], "--first-day 2024-11-30 --days 7"),  # the default days are not in this trace
        (
            ["--days", "2", "--first-day", "2025-03-08"],
            "local 2025-03-07 00:00 (the warm-up day) .. 2025-03-10",
        ),
    ):
        out = CliRunner().invoke(app, [*sim, *argv])
        assert out.exit_code == 2 and says in out.output and "the trace covers local 2025-03-06" in out.output
        assert len(out.output.strip().splitlines()) == 1, out.output
    out = CliRunner().invoke(app, [*sim, "--first-day", "2025-02-30"])
    assert out.exit_code == 2 and "--first-day" in out.output and "2025-02-30" in out.output, out.output
