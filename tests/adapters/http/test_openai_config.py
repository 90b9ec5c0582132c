"""The proxy's configuration and request helpers: objective tables (InferenceObjective-like), backend
options from `gpupool serve --backends`, the depth-bounded JSON decoder and the token correction."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.adapters.http.jsonbody import JsonBodyError, loads_bounded
from gpupool.adapters.http.openai_request import (
    EMBEDDINGS,
    OpenAIError,
    TokenCorrection,
    inspect,
    objective_table,
    priority_of,
    usage_prompt_tokens,
)
from gpupool.cli.serve import build, register_backends
from gpupool.core.errors import InvalidInput


def test_objective_table_forms_and_errors() -> None:
    manifest = {"kind": "InferenceObjective", "metadata": {"name": "critical"}, "spec": {"priority": 200}}
    table = objective_table([{"name": "chat", "priority": "P0"}, manifest, {"name": "bulk", "priority": -5}])
    assert table == {"chat": 100, "critical": 200, "bulk": -5}
    assert priority_of({"x-gateway-inference-objective": "critical"}, table) == 200
    assert priority_of({"x-gateway-inference-objective": "critical", "x-gpupool-priority": "7"}, table) == 7
    assert priority_of({}, table) == 50
    with pytest.raises(InvalidInput, match=r"objectives\[1\]\.name"):
        objective_table([{"name": "a", "priority": 1}, {"name": "a", "priority": 2}])
    with pytest.raises(InvalidInput, match=r"objectives\[0\]\.priority"):
        objective_table([{"name": "a", "priority": "urgent"}])
    with pytest.raises(OpenAIError) as e:
        priority_of({"x-gpupool-priority": "urgent"}, table)
    assert e.value.status == 400 and e.value.param == "x-gpupool-priority"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_rejects_bad_objectives_and_backend_options_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "objectives.yaml"
    bad.write_text("objectives:\n  - {name: chat, priority: soon}\n")
    r = _cli("serve", "--objectives", str(bad), "--data-dir", str(tmp_path / "d"), "--port", "0")
    assert r.returncode == 2 and "objectives[0].priority" in r.stderr and "Traceback" not in r.stderr
    be = tmp_path / "backends.yaml"
    be.write_text("backends:\n  - {id: a, model: m, url: 'http://x', slice_id: s, priority: 1}\n")
    r = _cli("serve", "--backends", str(be), "--data-dir", str(tmp_path / "d"), "--port", "0")
    assert r.returncode == 2 and "unknown key 'priority'" in r.stderr
    assert not (tmp_path / "d").exists()  # rejected before the store was opened


def test_register_backends_declares_options_and_workload_context(tmp_path: Path) -> None:
    bundle = build(data_dir=tmp_path, simulate=False)
    pl = next(
        p for p in bundle.plan.placements if bundle.workloads.by_name(p.workload).model == "qwen2.5-0.5b"
    )
    w = bundle.workloads.by_name(pl.workload)
    register_backends(
        bundle, [("g", w.model, "http://127.0.0.1:9", pl.slice)], {"g": {"priority_scheduling": True}}
    )
    surf = bundle.app.state.openai
    assert surf.backends["g"].priority_scheduling is True
    assert surf.models[w.model].max_model_len == w.max_context and surf.models[w.model].task == "generate"
    with pytest.raises(Exception, match="priority_scheduling"):
        register_backends(
            bundle, [("h", w.model, "http://x", pl.slice)], {"h": {"priority_scheduling": "on"}}
        )


def test_loads_bounded_depth_strings_and_hostile_input() -> None:
    assert loads_bounded(b"[" * 64 + b"]" * 64, max_depth=64) is not None
    with pytest.raises(JsonBodyError, match="deeper than 64"):
        loads_bounded(b"[" * 65 + b"]" * 65)
    assert loads_bounded(b'{"a": "' + b"[" * 500 + b'"}') == {"a": "[" * 500}  # brackets in strings
    for hostile in (b'"' + b'\\"' * 200_000 + b"\\", b"[" * 100 + b'"\\' * 100_000, b"\xff\xfe", b"{"):
        with pytest.raises(JsonBodyError):
            loads_bounded(hostile)


def test_inspect_shapes_and_token_correction() -> None:
    s = inspect({"model": "m", "input": ["ab", [1, 2, 3]], "encoding_format": "base64"}, EMBEDDINGS)
    assert (s.prompts, s.prompt_estimate) == (2, 4)  # "ab" = 2 units + 3 token ids (12 units) -> 14 / 4
    with pytest.raises(OpenAIError) as e:
        inspect({"model": "m", "input": ["ok", {"x": 1}]}, EMBEDDINGS)
    assert e.value.param == "input"
    corr = TokenCorrection()
    assert corr.predict("m", 40) == 40  # the identity before any observation
    for est in range(10, 200, 7):
        corr.observe("m", est, 2 * est + 5)
    a, b = corr.coefficients("m")
    assert a == pytest.approx(2.0, rel=1e-6) and b == pytest.approx(5.0, abs=1e-3)
    assert corr.predict("other", 40) == 40
    assert usage_prompt_tokens(b'data: {"choices":[],"usage":{"prompt_tokens": 37,"total_tokens":40}}') == 37
    assert usage_prompt_tokens(b'{"usage": null}') is None


def test_header_values_are_read_and_shown_as_the_client_wrote_them() -> None:
    """ASGI servers hand header bytes over as Latin-1: a UTF-8 priority was echoed as mojibake
    ('â\\x85«') and a non-ASCII objective name never matched its table entry."""
    as_sent = lambda text: text.encode().decode("latin-1")  # noqa: E731 (what the server passes on)
    with pytest.raises(OpenAIError) as e:
        priority_of({"x-gpupool-priority": as_sent("Ⅻ")}, {})
    assert '"Ⅻ"' in e.value.message and "â" not in e.value.message
    assert priority_of({"x-gateway-inference-objective": as_sent("café")}, {"café": 7}) == 7
    assert priority_of({"x-gpupool-priority": "P0"}, {}) == 100
