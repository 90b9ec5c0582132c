"""The OpenAI surface as the official `openai` SDK sees it: gateway -> emulated backends over real HTTP.

Each test names the defect it pins: streams without role / finish_reason / usage, silently ignored
``n`` / list prompts / ``stop`` / ``encoding_format`` / ``dimensions``, 200 for bodies that must be 400,
errors not in OpenAI's shape (so the SDK raised the wrong class or an unreadable message), 500 on deep
JSON, vLLM's ``priority`` sent to backends that reject it, and prompt sizes never checked exactly."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.surface import OpenAISurface, configure_backend, configure_model
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.emulate import build_backend_app
from gpupool.cli.serve import KvSizer
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import Backend
from tests.adapters.http.servers import running

TOK = "openai-sdk-tenant-token"
CHAT = "qwen2.5-0.5b"
EMBED = "bge-base-en-v1.5"
SMALL = "qwen2.5-1.5b"  # served with a 256-token context
SMALL_CTX = 256


@dataclass
class Stack:
    url: str
    controller: LeaseController
    surface: OpenAISurface
    seen: list[dict[str, Any]]

    def sdk(self, key: str = TOK, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=20, default_headers=headers
        )

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=20, headers={"Authorization": f"Bearer {TOK}"})


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    seen: list[dict[str, Any]] = []
    echo = FastAPI()

    @echo.post("/v1/completions")
    async def capture(request: Request) -> dict[str, Any]:
        seen.append(await request.json())
        return {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": []}

    with (
        running(
            build_backend_app(CHAT, kv_budget_mib=256, speed=100.0, scheduling_policy="priority")
        ) as chat,
        running(build_backend_app(EMBED, kv_budget_mib=64, speed=100.0)) as emb,
        running(build_backend_app(SMALL, kv_budget_mib=256, speed=100.0, max_model_len=SMALL_CTX)) as small,
        running(echo) as echo_url,
    ):
        c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
        for bid, model, url in (
            ("chat", CHAT, chat),
            ("emb", EMBED, emb),
            ("small", SMALL, small),
            ("echo-fcfs", "echo-fcfs", echo_url),
            ("echo-prio", "echo-prio", echo_url),
        ):
            c.register_backend(Backend(bid, model, url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=256))
        app = create_app(c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer())
        configure_backend(app, "chat", priority_scheduling=True)
        configure_backend(app, "echo-prio", priority_scheduling=True)
        configure_model(app, SMALL, max_model_len=SMALL_CTX)
        configure_model(app, "echo-fcfs", task="generate", max_model_len=64)
        with running(app) as url:
            yield Stack(url, c, app.state.openai, seen)
            assert c.request_lease_count() == 0
            c.check_invariants()


MSG = [{"role": "user", "content": "hello there"}]


def test_the_stream_example_of_docs_openai_runs_as_written(stack: Stack) -> None:
    """docs/openai.md's first example: a chat stream without max_tokens, get_final_completion().
    vLLM's chat route has no default cap (the model ends its answer: "stop"); the emulated backend
    cut it at 16 tokens with "length", on which the SDK helper raises LengthFinishReasonError, so
    the example failed against `gpupool run`. The completions route keeps vLLM's default of 16."""
    with stack.sdk().chat.completions.stream(
        model=CHAT, messages=[{"role": "user", "content": "hi"}], stream_options={"include_usage": True}
    ) as s:
        final = s.get_final_completion()  # finish_reason and usage are set
    assert final.choices[0].finish_reason == "stop", final
    assert final.usage is not None and final.usage.completion_tokens == 16
    plain = stack.sdk().chat.completions.create(model=CHAT, messages=MSG)
    assert plain.choices[0].finish_reason == "stop" and plain.usage is not None
    done = stack.sdk().completions.create(model=CHAT, prompt="hi")
    assert done.choices[0].finish_reason == "length" and done.usage is not None
    assert done.usage.completion_tokens == 16


def test_stream_helper_reports_finish_reason_and_usage(stack: Stack) -> None:
    # Before: no chunk had a role or a finish reason, so stream() reported None for both and no usage.
    with stack.sdk().chat.completions.stream(
        model=CHAT, messages=MSG, max_tokens=5, stop=["tok4"], stream_options={"include_usage": True}
    ) as s:
        final = s.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert (
        final.choices[0].message.role == "assistant"
        and final.choices[0].message.content == " tok1 tok2 tok3 "
    )
    assert final.usage is not None and final.usage.completion_tokens == 4 and final.usage.prompt_tokens > 0
    # at max_tokens the helper raises LengthFinishReasonError, which it can only do if it saw "length"
    with (
        pytest.raises(openai.LengthFinishReasonError) as e,
        stack.sdk().chat.completions.stream(
            model=CHAT, messages=MSG, max_tokens=3, stream_options={"include_usage": True}
        ) as s,
    ):
        s.get_final_completion()
    assert e.value.completion.choices[0].finish_reason == "length"
    assert e.value.completion.usage is not None and e.value.completion.usage.completion_tokens == 3
    chunks = list(stack.sdk().chat.completions.create(model=CHAT, messages=MSG, max_tokens=2, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert content[-1].choices[0].finish_reason == "length"
    assert all(ch.usage is None for ch in chunks)  # no usage chunk unless asked


def test_stop_n_and_list_prompts_are_honoured(stack: Stack) -> None:
    sdk = stack.sdk()
    r = sdk.chat.completions.create(model=CHAT, messages=MSG, max_tokens=5, stop=["tok3"])
    assert r.choices[0].message.content == " tok1 tok2 " and r.choices[0].finish_reason == "stop"
    streamed = sdk.chat.completions.create(model=CHAT, messages=MSG, max_tokens=5, stop="tok2", stream=True)
    parts = [
        (ch.choices[0].delta.content or "", ch.choices[0].finish_reason) for ch in streamed if ch.choices
    ]
    assert "".join(p for p, _ in parts) == " tok1 " and parts[-1][1] == "stop"
    r2 = sdk.chat.completions.create(model=CHAT, messages=MSG, max_tokens=2, n=3)
    assert [ch.index for ch in r2.choices] == [0, 1, 2] and r2.usage and r2.usage.completion_tokens == 6
    r3 = sdk.completions.create(model=CHAT, prompt=["a b", "c d"], max_tokens=2, n=2)
    assert sorted(ch.index for ch in r3.choices) == [0, 1, 2, 3]
    assert all(ch.text == " tok1 tok2" and ch.finish_reason == "length" for ch in r3.choices)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=CHAT, messages=MSG, n=1000)
    assert e.value.body["param"] == "n"  # type: ignore[index]


def test_embeddings_base64_and_dimensions(stack: Stack) -> None:
    sdk = stack.sdk()
    floats = sdk.embeddings.create(model=EMBED, input=["alpha", "beta"], encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1] and len(floats.data[0].embedding) == 64
    b64 = sdk.embeddings.create(model=EMBED, input="alpha", encoding_format="base64")
    raw = base64.b64decode(b64.data[0].embedding)  # type: ignore[arg-type]
    assert list(struct.unpack("<64f", raw)) == pytest.approx(floats.data[0].embedding, rel=1e-6)
    short = sdk.embeddings.create(model=EMBED, input="alpha", dimensions=8, encoding_format="float")
    assert short.data[0].embedding == pytest.approx(floats.data[0].embedding[:8], rel=1e-6)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.embeddings.create(model=EMBED, input="alpha", dimensions=4096)
    assert e.value.body["param"] == "dimensions"  # type: ignore[index]


def test_wrong_task_missing_fields_and_context_are_400(stack: Stack) -> None:
    sdk = stack.sdk()
    with pytest.raises(openai.BadRequestError, match="does not support"):
        sdk.chat.completions.create(model=EMBED, messages=MSG)
    with pytest.raises(openai.BadRequestError, match="does not support"):
        sdk.embeddings.create(model=CHAT, input="x")
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=SMALL, messages=MSG, max_tokens=SMALL_CTX + 1)
    assert e.value.code == "context_length_exceeded"
    with stack.http() as cl:
        for path, body, param in (
            ("/v1/chat/completions", {"model": CHAT}, "messages"),
            ("/v1/completions", {"model": CHAT}, "prompt"),
            ("/v1/embeddings", {"model": EMBED}, "input"),
            ("/v1/chat/completions", {"model": CHAT, "messages": [], "max_tokens": 2}, "messages"),
            ("/v1/completions", {"model": CHAT, "prompt": "x", "stop": 7}, "stop"),
            ("/v1/embeddings", {"model": EMBED, "input": "x", "encoding_format": "hex"}, "encoding_format"),
            ("/v1/embeddings", {"model": EMBED, "input": "x", "stream": True}, "stream"),
            ("/v1/chat/completions", {"model": 5, "messages": MSG}, "model"),
            ("/v1/embeddings", {"model": [EMBED], "input": "x"}, "model"),
            ("/v1/embeddings", {"model": EMBED, "input": "x", "stream": "yes"}, "stream"),
            ("/v1/embeddings", {"model": EMBED, "input": "x", "stream_options": {}}, "stream_options"),
            ("/v1/completions", {"model": CHAT, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ):
            r = cl.post(path, json=body)
            assert r.status_code == 400, (path, body, r.text)
            err = r.json()["error"]
            assert err["param"] == param and set(err) == {"message", "type", "param", "code"}
            if param in body:  # the value as sent is named too
                shown = json.dumps(body[param], ensure_ascii=False)
                assert shown in err["message"], err  # as JSON, as it was sent


def test_errors_have_openai_shape_and_status(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        stack.sdk().chat.completions.create(model="no-such-model", messages=MSG)
    assert "no-such-model" in nf.value.body["message"]  # type: ignore[index]
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError) as au:
        stack.sdk(key="wrong-token-0000").chat.completions.create(model=CHAT, messages=MSG)
    assert au.value.body["message"] == "Incorrect API key provided."  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        stack.sdk(key="wrong-token-0000").models.list()
    with pytest.raises(openai.NotFoundError):
        stack.sdk().models.retrieve("no-such-model")
    m = stack.sdk().models.retrieve(CHAT)
    assert m.id == CHAT and m.created > 1_600_000_000 and m.object == "model"
    listed = {x.id: x for x in stack.sdk().models.list()}
    assert listed[CHAT].created == m.created and listed[SMALL].model_extra["max_model_len"] == SMALL_CTX  # type: ignore[index]


def test_deeply_nested_json_is_400_not_500(stack: Stack) -> None:
    deep = b'{"model": "' + CHAT.encode() + b'", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    with stack.http() as cl:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            r = cl.post(path, content=deep, headers={"content-type": "application/json"})
            assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"], path
            assert cl.post(path, content=b"{nope").status_code == 400


def test_priority_goes_only_to_priority_backends_and_objectives_map_names(stack: Stack) -> None:
    fcfs, prio = stack.sdk(), stack.sdk(**{"x-gateway-inference-objective": "interactive"})
    fcfs.completions.create(model="echo-fcfs", prompt="x", extra_headers={"x-gpupool-priority": "P0"})
    assert "priority" not in stack.seen[-1]  # vLLM without --scheduling-policy priority rejects it
    prio.completions.create(model="echo-prio", prompt="x")
    assert stack.seen[-1]["priority"] == -100  # objective "interactive" = P0 = 100, inverted for vLLM
    prio.completions.create(model="echo-prio", prompt="x", extra_headers={"x-gpupool-priority": "P2"})
    assert stack.seen[-1]["priority"] == 1  # the explicit header wins over the objective
    with pytest.raises(openai.BadRequestError, match="unknown objective"):
        stack.sdk(**{"x-gateway-inference-objective": "P7"}).completions.create(model="echo-prio", prompt="x")
    # the real emulated backend (priority scheduling) still serves a P0 request
    r = prio.chat.completions.create(model=CHAT, messages=MSG, max_tokens=1)
    assert r.choices[0].finish_reason == "length"


def test_tokenize_is_asked_near_the_context_and_the_correction_is_learned(stack: Stack) -> None:
    sdk, surf = stack.sdk(), stack.surface
    before = surf.tokenize_calls
    sdk.completions.create(model=SMALL, prompt="short prompt", max_tokens=4)
    assert surf.tokenize_calls == before  # far from the 256-token context: no round trip
    digits = "1234567890" * 40  # 401 tokens exactly (one per digit + BOS)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.completions.create(model=SMALL, prompt=digits, max_tokens=150)
    assert surf.tokenize_calls == before + 1 and "401 in the prompt" in e.value.body["message"]  # type: ignore[index]
    words = "abcdefghij " * 60  # 660 characters, estimated 165 tokens; 121 exactly
    r = sdk.completions.create(model=SMALL, prompt=words, max_tokens=100)  # 265 estimated, 221 exact
    assert surf.tokenize_calls == before + 2 and r.usage is not None and r.usage.prompt_tokens == 121

    def exact(text: str) -> int:
        with stack.http() as cl:
            url = stack.controller.models()[SMALL][0].url
            return int(cl.post(url + "/tokenize", json={"model": SMALL, "prompt": text}).json()["count"])

    assert exact(words) == 121
    for k in range(1, 16):  # ten-letter words: the characters / 4 estimate over-counts them by ~35 %
        sdk.completions.create(model=SMALL, prompt="abcdefghij " * k, max_tokens=1)
    probe = "abcdefghij " * 9
    raw = -(-len(probe) // 4)
    truth = exact(probe)
    assert raw - truth >= 5  # the raw estimate is off ...
    assert abs(surf.correction.predict(SMALL, raw) - truth) <= 1  # ... the corrected one is not


def test_a_backend_without_tokenize_falls_back_to_the_estimate(stack: Stack) -> None:
    before = stack.surface.tokenize_calls
    stack.sdk().completions.create(model="echo-fcfs", prompt="a few words " * 12, max_tokens=20)
    assert stack.surface.tokenize_calls == before + 1  # asked (near the 64-token context), got a 404
    assert stack.seen[-1]["max_tokens"] == 20  # and forwarded anyway: the backend has the last word


def test_a_prompt_estimated_past_every_kv_budget_is_forwarded_not_a_503(stack: Stack) -> None:
    # Before: with no /tokenize answer, a prompt whose estimate (120,000 tokens) needed more KV than
    # any instance holds was answered 503 "unresolvable" (a 5xx for the client's own input) instead
    # of reaching the backend, which owns the final word on the context (a sequence never holds
    # more KV than its context, so it is sized at the context).
    words = "a few words " * 40_000
    stack.sdk().completions.create(model="echo-fcfs", prompt=words, max_tokens=20)
    assert stack.seen[-1]["prompt"] == words


def test_max_completion_tokens_wins_over_max_tokens_in_chat_as_in_vllm(stack: Stack) -> None:
    # Before: the gateway (and the emulated backend) read ``max_tokens`` first, while vLLM's chat
    # route reads ``max_completion_tokens or max_tokens``: a chat request with a small max_tokens
    # and a large max_completion_tokens was sized (KV lease, context check) for the small one and
    # then generated the large one; the context error named max_tokens when the client had sent
    # max_completion_tokens.
    sdk = stack.sdk()
    r = sdk.chat.completions.create(model=CHAT, messages=MSG, max_tokens=2, max_completion_tokens=4)
    assert r.usage is not None and r.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=SMALL, messages=MSG, max_tokens=2, max_completion_tokens=SMALL_CTX)
    assert e.value.code == "context_length_exceeded"
    assert e.value.param == "max_completion_tokens" and "max_completion_tokens 256" in e.value.message


def test_a_request_over_every_kv_budget_of_its_model_is_400_naming_the_field(stack: Stack) -> None:
    # Before: n=128 x max_tokens=4000 (more KV cache than any instance of the model has) was a 503
    # "unresolvable" naming MiB: a 5xx for the client's own parameters, which the SDK retried.
    sdk = stack.sdk()
    with pytest.raises(openai.BadRequestError) as e:
        sdk.completions.create(model=CHAT, prompt="hi", n=128, max_tokens=4000)
    assert e.value.code == "kv_budget_exceeded" and e.value.param == "n", e.value.message
    r = sdk.completions.create(model=CHAT, prompt="hi", n=2, max_tokens=4)  # one that fits still does
    assert len(r.choices) == 2


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}


@pytest.mark.parametrize(
    ("messages", "param", "code"),
    [
        ([{"role": "user", "content": 5}], "messages[0].content", "invalid_value"),
        ([{"role": "user"}], "messages[0].content", "missing_required_parameter"),
        ([{"role": "user", "content": None}], "messages[0].content", "missing_required_parameter"),
        ([{"role": "system", "content": {"text": "hi"}}], "messages[0].content", "invalid_value"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant"}],
            "messages[1].content",
            "missing_required_parameter",
        ),
        (
            [{"role": "assistant", "content": 7, "tool_calls": [TOOL_CALL]}],
            "messages[0].content",
            "invalid_value",
        ),
        ([{"role": "tool", "tool_call_id": "call_1"}], "messages[0].content", "missing_required_parameter"),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]", "invalid_value"),
        (
            [{"role": "user", "content": [{"text": "hi"}]}],
            "messages[0].content[0].type",
            "missing_required_parameter",
        ),
        (
            [{"role": "user", "content": [{"type": 3, "text": "hi"}]}],
            "messages[0].content[0].type",
            "invalid_value",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            "messages[0].content[0].text",
            "invalid_value",
        ),
        (
            [{"role": "user", "content": [{"type": "text"}]}],
            "messages[0].content[0].text",
            "missing_required_parameter",
        ),
    ],
)
def test_malformed_message_content_is_400_naming_the_field(
    stack: Stack, messages: list[dict[str, Any]], param: str, code: str
) -> None:
    """These were forwarded and the backend answered 200; the OpenAI API answers 400 for each."""
    with stack.http() as cl:
        r = cl.post("/v1/chat/completions", json={"model": CHAT, "messages": messages, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
    assert param in err["message"], err
    if code == "invalid_value":  # the value as sent is named too
        assert "got " in err["message"], err
    assert stack.controller.request_lease_count() == 0  # nothing was granted for it


def test_the_sdks_message_shapes_pass(stack: Stack) -> None:
    """Text, text and image parts, system / developer messages, assistant tool calls with null
    content, tool results (string and text parts), names: every shape the `openai` SDK sends."""
    image = "data:image/png;base64," + base64.b64encode(b"\x89PNG fake").decode()
    conversations: list[list[Any]] = [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi", "name": "ann"}],
        [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}, *MSG],
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is in this picture?"},
                    {"type": "image_url", "image_url": {"url": image, "detail": "low"}},
                ],
            }
        ],
        [
            {"role": "user", "content": "look it up"},
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "found it"},
            {"role": "assistant", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "again"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
            {"role": "user", "content": "thanks"},
        ],
        [
            {"role": "user", "content": "old style"},
            {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": None},
            {"role": "assistant", "content": "", "refusal": None},
            {"role": "user", "content": ""},
        ],
    ]
    for messages in conversations:
        out = stack.sdk().chat.completions.create(model=CHAT, messages=messages, max_tokens=2)
        assert out.choices[0].message.role == "assistant", messages
