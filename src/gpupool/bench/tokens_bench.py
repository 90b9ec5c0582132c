"""`gpupool bench tokens`: how far the gateway's prompt-token estimate is from the backend's count,
before and after the per-model correction it learns from responses' ``usage.prompt_tokens``.

Method: one emulated backend (qwen2.5-0.5b, `EmulatedTokenizer`: BPE-like rules and a ChatML-style
template, see its docstring) and one gateway, both on 127.0.0.1 in this process. A seeded set of
varied prompts (English prose, source code, numbers / JSON, CJK text, mixed, multi-turn chats; sent
as completions and as chats, 20 to 2,000 characters) is split in two interleaved halves. The *train*
half goes through the gateway (``max_tokens: 1``), which fits its correction from the responses. For
each *test* prompt the truth is the backend's ``/tokenize`` count; the error is
``|estimate - truth| / truth`` for the raw characters / 4 estimate and for the corrected one.
Caveat: the truth is the emulator's tokenizer, not a real model's; the numbers show what the
correction does to a systematic bias, and how much content-dependent error remains.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from typing import Any

WORDS = (
    "the",
    "pool",
    "leases",
    "slices",
    "of",
    "memory",
    "and",
    "compute",
    "to",
    "tenants",
    "with",
    "queues",
)
CODE = [
    "def f(x):",
    "    return x[0] + 1",
    "for i in range(10):",
    "    total += a[i] * b[i]",
    "if (x != y) {",
]
CJK = "资源池按显存和算力切分分配给租户优先级队列抢占水位线背压推理网关"
TOKEN = "bench-tokens-tenant-01"
MODEL = "qwen2.5-0.5b"


def _text(rng: random.Random, kind: str, chars: int) -> str:
    out = ""
    while len(out) < chars:
        if kind == "prose":
            out += " ".join(rng.choice(WORDS) for _ in range(8)) + ". "
        elif kind == "code":
            out += rng.choice(CODE) + "\n"
        elif kind == "numbers":
            out += '{"id": %d, "score": %.3f, "tags": [%d, %d]}, ' % (  # noqa: UP031
                rng.randint(1, 99999),
                rng.random(),
                rng.randint(0, 9),
                rng.randint(10, 99),
            )
        elif kind == "cjk":
            out += "".join(rng.choice(CJK) for _ in range(12)) + "。"
        else:
            out += _text(rng, rng.choice(("prose", "code", "numbers", "cjk")), 60)
    return out[:chars]


def prompts(n: int, seed: int) -> list[tuple[str, str, Any]]:
    """(category, route, prompt or messages), deterministic for a seed."""
    rng = random.Random(seed)
    kinds = ("prose", "code", "numbers", "cjk", "mixed")
    out: list[tuple[str, str, Any]] = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        chars = int(20 * 100 ** rng.random())  # 20 .. 2,000, log-uniform
        if i % 3 == 2:
            turns = rng.randint(1, 4)
            msgs = [
                {"role": ("user", "assistant")[t % 2], "content": _text(rng, kind, max(5, chars // turns))}
                for t in range(turns)
            ]
            out.append((kind, "chat", msgs))
        else:
            out.append((kind, "completions", _text(rng, kind, chars)))
    return out


def _running(app: Any) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, t


def _plain_chars(p: Any) -> int:
    """The old estimator's input: plain characters of the prompt or of the messages' contents."""
    return len(p) if isinstance(p, str) else sum(len(m["content"]) for m in p)


def _stats(errs: list[float]) -> dict[str, float]:
    s = sorted(errs)
    return {
        "mean_rel_error": round(sum(s) / len(s), 4),
        "p95_rel_error": round(s[min(len(s) - 1, int(0.95 * len(s)))], 4),
    }


def run(*, n: int = 400, seed: int = 1) -> dict[str, Any]:
    import httpx

    from gpupool.adapters.http.app import create_app
    from gpupool.adapters.http.auth import TokenTable
    from gpupool.adapters.http.openai_request import CHAT, COMPLETIONS, inspect
    from gpupool.adapters.store import MemoryLeaseStore
    from gpupool.cli.demo import seed_example_pool
    from gpupool.cli.emulate import build_backend_app
    from gpupool.cli.leaseclock import lease_clock
    from gpupool.cli.serve import KvSizer
    from gpupool.core.controller import LeaseController
    from gpupool.core.ports import Backend

    be_url, be, be_t = _running(build_backend_app(MODEL, kv_budget_mib=4096, speed=1000.0))
    c = LeaseController(seed_example_pool(), clock=lease_clock(), store=MemoryLeaseStore())
    c.register_backend(Backend("be", MODEL, be_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=4096))
    app = create_app(c, tokens=TokenTable([(TOKEN, "bench", "tenant")]), sizer=KvSizer())
    gw_url, gw, gw_t = _running(app)
    surf = app.state.openai
    data = prompts(n, seed)
    train, test = data[0::2], data[1::2]
    try:
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as cl:
            t0 = time.perf_counter()
            for _, route, p in train:
                body = {"model": MODEL, "max_tokens": 1, ("messages" if route == "chat" else "prompt"): p}
                r = cl.post(
                    f"{gw_url}/v1/{'chat/completions' if route == 'chat' else 'completions'}", json=body
                )
                r.raise_for_status()
            train_s = time.perf_counter() - t0
            rows = []
            for kind, route, p in test:
                key = "messages" if route == "chat" else "prompt"
                truth = cl.post(f"{be_url}/tokenize", json={"model": MODEL, key: p}).json()["count"]
                est = inspect(
                    {"model": MODEL, key: p}, CHAT if route == "chat" else COMPLETIONS
                ).prompt_estimate
                naive = max(1, -(-_plain_chars(p) // 4))
                rows.append((kind, truth, naive, est, surf.correction.predict(MODEL, est)))
    finally:
        gw.should_exit = be.should_exit = True
        gw_t.join(10)
        be_t.join(10)
    a, b = surf.correction.coefficients(MODEL)
    by_kind: dict[str, dict[str, float]] = {}
    for kind in sorted({r[0] for r in rows}):
        sel = [r for r in rows if r[0] == kind]
        by_kind[kind] = {
            name: _stats([abs(r[col] - r[1]) / r[1] for r in sel])["mean_rel_error"]
            for name, col in (("chars_div_4", 2), ("before", 3), ("after", 4))
        }
    return {
        "prompts": n,
        "train": len(train),
        "test": len(test),
        "seed": seed,
        "chars_div_4": _stats([abs(r[2] - r[1]) / r[1] for r in rows]),
        "before": _stats([abs(r[3] - r[1]) / r[1] for r in rows]),
        "after": _stats([abs(r[4] - r[1]) / r[1] for r in rows]),
        "before_mean_signed": round(sum((r[3] - r[1]) / r[1] for r in rows) / len(rows), 4),
        "after_mean_signed": round(sum((r[4] - r[1]) / r[1] for r in rows) / len(rows), 4),
        "correction": {"slope": round(a, 4), "intercept": round(b, 2)},
        "by_category_mean_rel_error": by_kind,
        "train_requests_per_s": round(len(train) / train_s, 1),
    }
