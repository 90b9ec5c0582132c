"""`gpupool bench kv` on a tiny Mooncake-format trace: the documented keys for every router, a peer
that is not installed reported unavailable (never estimated), and the pieces the comparison rests on:
rendered text whose 512-token blocks follow the hash ids, sessions derived from shared prefixes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gpupool.adapters.backends.kvcache import chunk_keys
from gpupool.adapters.backends.tokenizer import EmulatedTokenizer
from gpupool.bench.kv_bench import derive_sessions, load_trace, render

KEYS = {"prefix_hit_rate", "recomputed_prompt_tokens", "ttft_p50_ms", "ttft_p99_ms", "engine_preemptions"}


def _trace(path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2]},
        {"timestamp": 100, "input_length": 1100, "output_length": 3, "hash_ids": [0, 7, 8]},
        {"timestamp": 900, "input_length": 1600, "output_length": 2, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 1500, "input_length": 1700, "output_length": 2, "hash_ids": [0, 7, 8, 9]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rendered_blocks_follow_the_hash_ids_and_sessions_follow_prefixes(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path / "t.jsonl"))
    tok = EmulatedTokenizer()
    keys = [chunk_keys(tok.encode(render(r["hash_ids"], r["input_length"])), 512) for r in trace]
    assert len(tok.encode(render([0, 1, 2], 1100))) == 1 + 1100
    assert keys[0][:2] == keys[2][:2] and keys[0][1] != keys[1][1] and keys[0][0] == keys[1][0]
    assert derive_sessions(trace) == ["s0", "s1", "s0", "s1"]  # block 0 alone (a system prompt) is no session
    assert [r["timestamp"] for r in load_trace(tmp_path / "t.jsonl", arrival="burst:1")] == [0, 0, 0, 1000]
    with pytest.raises(ValueError, match="arrival"):
        load_trace(tmp_path / "t.jsonl", arrival="later")
    for arrival in ("stretch:inf", "burst:nan", "burst:0.0001"):
        with pytest.raises(ValueError, match="arrival"):
            load_trace(tmp_path / "t.jsonl", arrival=arrival)


def test_a_trace_whose_rows_are_out_of_time_order_is_replayed_in_time_order(tmp_path: Path) -> None:
    """The replay times each request from the first row's timestamp: rows earlier than it were all
    sent at once, so an unsorted file (the format does not promise order) gave a wrong result."""
    rows = _trace(tmp_path / "t.jsonl").read_text().splitlines()
    (tmp_path / "r.jsonl").write_text("\n".join(reversed(rows)) + "\n")
    trace = load_trace(tmp_path / "r.jsonl")
    assert [r["timestamp"] for r in trace] == [0, 100, 900, 1500]
    assert trace == load_trace(tmp_path / "t.jsonl")


def test_trace_files_with_a_byte_order_mark_load_and_bad_lines_are_named(tmp_path: Path) -> None:
    plain = _trace(tmp_path / "t.jsonl")
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert load_trace(bom) == load_trace(plain)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(plain.read_text() + "{oops\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:5: not a JSON record"):
        load_trace(bad)


def test_a_malformed_trace_names_the_file_line_and_field(tmp_path: Path) -> None:
    rec = {"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}
    ok = json.dumps({**rec, "extra": "kept out"})
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(("\r\n".join([ok, "", json.dumps({**rec, "timestamp": 3})]) + "\r\n\r\n").encode())
    assert [r["timestamp"] for r in load_trace(crlf)] == [3, 5]  # (in time order)
    for name, data, msg in (
        ("str.jsonl", json.dumps({**rec, "input_length": "600"}), r"str\.jsonl:1: field input_length='600'"),
        ("neg.jsonl", ok + "\n" + json.dumps({**rec, "timestamp": -1}), r"neg\.jsonl:2: field timestamp=-1"),
        (
            "gone.jsonl",
            json.dumps({k: v for k, v in rec.items() if k != "output_length"}),
            "no field output_length",
        ),
        ("ids.jsonl", json.dumps({**rec, "hash_ids": "0,1"}), r"ids\.jsonl:1: field hash_ids"),
        ("list.jsonl", "[1, 2]", r"list\.jsonl:1: expected a JSON object"),
        ("empty.jsonl", "", r"empty\.jsonl: no requests"),
        ("blank.jsonl", "\n\n", r"blank\.jsonl: no requests"),
    ):
        (tmp_path / name).write_text(data + "\n" if data else data)
        with pytest.raises(ValueError, match=msg):
            load_trace(tmp_path / name)
    (tmp_path / "bin.jsonl").write_bytes(b"\x00\xff\xfe garbage\n")
    with pytest.raises(ValueError, match=r"bin\.jsonl: not UTF-8 text"):
        load_trace(tmp_path / "bin.jsonl")


def test_requests_the_replay_cannot_send_are_named(tmp_path: Path) -> None:
    # A prompt past the model's context (it would be rendered as gigabytes of text) and more hash
    # ids than the prompt has 512-token blocks (session matching is quadratic in their number).
    for row, msg in (
        (
            {"input_length": 10**9, "output_length": 5, "hash_ids": [1]},
            r"x\.jsonl:1: .*exceeds qwen2\.5-14b's context",
        ),
        (
            {"input_length": 1000, "output_length": 5, "hash_ids": list(range(3))},
            r"x\.jsonl:1: 3 hash_ids .*at most 2",
        ),
    ):
        path = tmp_path / "x.jsonl"
        path.write_text(json.dumps({"timestamp": 0, **row}) + "\n")
        with pytest.raises(ValueError, match=msg):
            load_trace(path)
    ok = tmp_path / "x.jsonl"
    ok.write_text(
        json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 0, "hash_ids": [4, 5]}) + "\n"
    )
    assert len(load_trace(ok)) == 1  # exactly one id per block, and fewer, are both fine


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_kv_reports_every_router(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    cmd = [sys.executable, "-m", "gpupool.cli.main", "bench", "kv", "--trace", str(trace), "--json"]
    cmd += ["--instances", "2", "--time-scale", "50", "--limit", "4", "--host-tier-mib", "1024"]
    cmd += ["--peers-venv", str(tmp_path / "no-peers"), "--no-install-peers"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert set(out["routers"]) == {"round-robin", "vllm-router-cache-aware", "gpupool"}
    peer = out["routers"]["vllm-router-cache-aware"]
    assert peer["available"] is False and "not installed" in peer["reason"]
    for name in ("round-robin", "gpupool"):
        row = out["routers"][name]
        assert row["available"] is True and set(row) >= KEYS, (name, row)
        assert row["served"] + row["shed"] + row["failed"] == 4
    assert out["routers"]["gpupool"]["served"] == 4
    assert out["requests"] == 4 and out["sessions"] == 2


def test_bench_kv_bad_options_exit_2(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    base = [sys.executable, "-m", "gpupool.cli.main", "bench", "kv", "--trace"]
    for extra in (
        ["--routers", "nope"],
        ["--time-scale", "0"],
        ["--arrival", "soon"],
        ["--arrival", "burst:x"],
        ["--arrival", "stretch:inf"],
        ["--time-scale", "inf"],
        ["--stream-interval", "0"],
    ):
        r = subprocess.run(
            [*base, str(trace), *extra], capture_output=True, text=True, timeout=60, check=False
        )
        assert r.returncode == 2, (extra, r.stderr)
        assert extra[0] in r.stdout + r.stderr
    r = subprocess.run(
        [*base, str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 2 and "--trace" in r.stdout + r.stderr


@pytest.mark.timeout(120)
def test_instances_listen_on_ports_they_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel hands a just-closed free port out again (measured: about 1 set of 12 in 200); a
    bench that picked ports for its instances then had two of them on one engine (the second failed
    to bind, the first answered both health checks), which summed that engine's counters twice. The
    instances now bind their own ports: even a port picker that always repeats itself is unused."""
    from gpupool.bench import httpload, kv_bench

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        same = s.getsockname()[1]
    monkeypatch.setattr(kv_bench, "free_port", lambda: same)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with (tmp_path / "log").open("wb") as log:
            each = ["--speed", "50", "--host-tier-mib", "64"]
            urls = kv_bench.start_servers(
                "backend", [each] * 3, tmp_path, log, procs, timeout_s=60, health="/health"
            )
        assert len(set(urls)) == 3
        assert all(p.poll() is None for p in procs)
        for u in urls:  # each answers from its own engine: a request on one leaves the others at zero
            with urllib.request.urlopen(u + "/health", timeout=5) as r:
                assert r.status == 200
        body = json.dumps({"model": kv_bench.MODEL, "prompt": "abc def", "max_tokens": 1}).encode()
        req = urllib.request.Request(
            urls[0] + "/v1/completions", data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        counts = [kv_bench._scrape([u])["queries"] for u in urls]
        assert counts[0] > 0 and counts[1:] == [0, 0]
    finally:
        httpload.stop(procs)
