"""Sessions and opt-in truncation through the OpenAI proxy of `gpupool run` (what `make run` starts): a
real subprocess, real HTTP, the emulated backends it plans."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(url: str, token: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    h = {"Authorization": f"Bearer {token}", "content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(url + path, data=data, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


@pytest.mark.timeout(240)
def test_sessions_return_to_their_instance_and_truncation_is_opt_in(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "run", "--port", str(port), "--data-dir", str(data),
         "--no-traffic", "--no-agents", "--tidal-speed", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        models: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            time.sleep(0.5)
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            token_file = data / "admin.token"
            if not token_file.exists():
                continue
            try:
                _, _, listing = _call(url, token_file.read_text().strip(), "/v1/models")
            except OSError:
                continue
            models = [m for m in listing["data"] if m.get("max_model_len")]
            if models:
                break
        token = (data / "admin.token").read_text().strip()
        # a decoder (the embedding models have no chat)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        model = next(
            m
            for m in models
            if _call(url, token, "/v1/chat/completions", {**chat, "model": m["id"]})[0] == 200
        )
        name, ctx = model["id"], model["max_model_len"]
        turn = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "word " * 300}]
        where = set()
        for i in range(4):
            st, h, body = _call(url, token, "/v1/chat/completions", {"model": name, "messages": turn,
                                "max_tokens": 8}, {"x-gpupool-session": "conv-7"})  # fmt: skip
            assert st == 200, body
            where.add(h["x-gpupool-backend"])
            turn = [*turn, {"role": "assistant", "content": "ok"}, {"role": "user", "content": f"more {i}"}]
        assert len(where) == 1, where  # every turn went back to the instance holding the prefix
        # (`gpupool run` starts one instance per model: the choice between instances is covered by
        # tests/adapters/http/test_sessions_proxy.py and measured by `gpupool bench kv`)
        # over the context: a 400 in OpenAI's shape unless the request opts in to truncation
        long = [{"role": "system", "content": "You are terse."}]
        long += [{"role": r, "content": "lorem ipsum " * (ctx // 20)} for r in ("user", "assistant") * 6]
        long += [{"role": "user", "content": "and now?"}]
        body = {"model": name, "messages": long, "max_tokens": 8}
        st, _, err = _call(url, token, "/v1/chat/completions", body)
        assert st == 400 and err["error"]["code"] == "context_length_exceeded", err
        st, h, ok = _call(url, token, "/v1/chat/completions", body, {"x-gpupool-truncate": "oldest-turns"})
        assert st == 200, ok
        assert h["x-gpupool-truncated"].startswith("turns=")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
