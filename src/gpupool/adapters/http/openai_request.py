"""What the OpenAI proxy checks and learns about a request body, kept cheap (no re-encoding, no
recursion): `inspect` validates the fields the gateway needs or that a backend would 5xx on, and
returns the request's shape; `TokenCorrection` learns a per-model correction of the prompt estimate.

Checks (each failure an `OpenAIError`, rendered as ``{"error": {message, type, param, code}}``):
``messages`` (chat), ``prompt`` (completions), ``input`` (embeddings) present and well-formed (each
message's ``content`` as the OpenAI API takes it: a string or content parts with a ``type``, null or
absent only for an assistant message with ``tool_calls``, ``function_call``, ``audio`` or
``refusal``, for the deprecated ``function`` role and for roles the API does not define);
``n`` in [1, 128]; ``max_tokens`` / ``max_completion_tokens`` >= 1 (chat: ``max_completion_tokens``
wins when both are given, as in vLLM; completions: ``max_tokens``); ``stop`` a string or list of
strings; ``stream`` a boolean and ``stream_options`` only with it; ``encoding_format`` float|base64;
``dimensions`` >= 1; embeddings have no streaming (``stream`` false or absent, no ``stream_options``).
Values the backend honours (``n``, ``stop``, list prompts) are passed on as sent.

Prompt estimate: text units / 4 over the text the backend reads, where a character is 1 unit, a digit 4
and a non-ASCII character ~4 (BPE vocabularies give each digit and most CJK characters a token of
their own; counted with C-level ``str.count`` / ``encode``, no Python loop per character); a token id
counts 1 token. It is corrected per model by an exponentially weighted least-squares line fitted to
``usage.prompt_tokens`` of earlier responses, minimising the *relative* error (`TokenCorrection`).
The estimate is a sizing hint; the backend's ``/tokenize`` is exact.
Priority: ``x-gpupool-priority`` (P0|P1|P2|int) wins; else ``x-gateway-inference-objective`` names an
objective in the gateway's table (InferenceObjective-like name -> priority); else P1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.core.errors import InvalidInput, show_value
from gpupool.core.priority import P0, P1, P2, parse_priority

CHARS_PER_TOKEN = 4
MAX_N = 128
DEFAULT_OBJECTIVES: dict[str, int] = {"interactive": P0, "retrieval": P1, "batch": P2}
"""The seed's three classes as objective names: online agent interaction, retrieval, offline batch."""
CHAT, COMPLETIONS, EMBEDDINGS = "chat", "completions", "embeddings"


class OpenAIError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, typ: str = ""
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = typ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(slots=True)
class Shape:
    prompt_chars: int
    """Text units the backend reads (`text_units`; token ids count CHARS_PER_TOKEN each)."""
    prompts: int
    """Sequences' prompts: 1, or the length of a list prompt / input."""
    n: int
    max_tokens: int | None
    """Per sequence, as sent (None: not given)."""
    stream: bool
    max_tokens_param: str = "max_tokens"
    """The field ``max_tokens`` came from (``max_completion_tokens`` when a chat request gave it)."""

    @property
    def prompt_estimate(self) -> int:
        return max(1, math.ceil(self.prompt_chars / CHARS_PER_TOKEN))


_DIGITS = "0123456789"
_HAS_DIGIT = re.compile("[0-9]").search


def text_units(s: str) -> int:
    """Characters, with each digit and each non-ASCII character weighted ~4 (see the module doc)."""
    n = len(s)
    if _HAS_DIGIT(s) is not None:
        n += 3 * sum(map(s.count, _DIGITS))
    if not s.isascii():
        n += 3 * (len(s.encode("utf-8", "surrogatepass")) - len(s)) // 2
    return n


def _show(v: Any) -> str:
    """``v`` as JSON text (`show_value`), cut at 40 characters."""
    s = show_value(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _bad(name: str, v: Any, why: str) -> OpenAIError:
    return OpenAIError(400, f"{name}: {why}, got {_show(v)}", param=name, code="invalid_value")


def _missing(name: str) -> OpenAIError:
    return OpenAIError(
        400, f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
    )


def _count_int(body: Mapping[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if type(v) is not int or not lo <= v <= hi:
        raise _bad(name, v, f"must be an integer in [{lo}, {hi}]")
    return v


def _prompt_chars(x: Any, name: str) -> tuple[int, int]:
    """(characters, number of prompts) of a prompt / input: str, [str], [int] or [[int]]."""
    if isinstance(x, str):
        return text_units(x), 1
    if isinstance(x, list) and x:
        if all(type(t) is int for t in x):
            return len(x) * CHARS_PER_TOKEN, 1
        chars = 0
        for t in x:
            if isinstance(t, str):
                chars += text_units(t)
            elif isinstance(t, list) and t and all(type(i) is int for i in t):
                chars += len(t) * CHARS_PER_TOKEN
            else:
                raise _bad(name, t, "each item must be a string or a non-empty list of token ids")
        return chars, len(x)
    if x is None:
        raise _missing(name)
    raise _bad(name, x, "must be a non-empty string or list")


CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})
"""Roles whose ``content`` must be given (a string or content parts), as in the OpenAI API."""
ASSISTANT_WITHOUT_CONTENT = ("tool_calls", "function_call", "audio", "refusal")
"""An assistant message carrying one of these may have ``content`` null or absent; else it needs it."""


def _content_chars(m: dict[str, Any], i: int) -> int:
    """Text units of ``messages[i].content``: a string, or a list of content parts (objects with a
    string ``type``; a ``text`` part's ``text`` a string); `OpenAIError` naming the field otherwise.
    Null or absent only where the OpenAI API allows it (see `CONTENT_REQUIRED`); other roles (a
    backend's own, deprecated ``function``) are checked only for the type of what they give."""
    name = f"messages[{i}].content"
    c = m.get("content")
    if isinstance(c, str):
        return text_units(c)
    if c is None:
        role = m["role"]
        if role in CONTENT_REQUIRED or (
            role == "assistant" and all(m.get(k) is None for k in ASSISTANT_WITHOUT_CONTENT)
        ):
            raise _missing(name)
        return 0
    if not isinstance(c, list):
        raise _bad(name, c, "must be a string or an array of content parts")
    chars = 0
    for j, part in enumerate(c):
        if not isinstance(part, dict):
            raise _bad(f"{name}[{j}]", part, "must be a content part object with a 'type'")
        typ = part.get("type")
        if typ is None:
            raise _missing(f"{name}[{j}].type")
        if not isinstance(typ, str):
            raise _bad(f"{name}[{j}].type", typ, "must be a string")
        text = part.get("text")
        if typ == "text" and not isinstance(text, str):
            if text is None:
                raise _missing(f"{name}[{j}].text")
            raise _bad(f"{name}[{j}].text", text, "must be a string")
        if isinstance(text, str):
            chars += text_units(text)
    return chars


def _message_chars(msgs: Any) -> int:
    if msgs is None:
        raise _missing("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", msgs, "must be a non-empty list of messages")
    chars = 0
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}]", m, "must be an object with a string 'role'")
        chars += _content_chars(m, i)
    return chars


def model_of(body: Mapping[str, Any]) -> str:
    """The body's ``model``: a string (missing, or of another type: an `OpenAIError` naming it)."""
    model = body.get("model")
    if model is None:
        raise _missing("model")
    if not isinstance(model, str):
        raise _bad("model", model, "must be a string")
    return model


def inspect(body: Mapping[str, Any], kind: str) -> Shape:
    """Validate ``body`` for a ``kind`` (CHAT, COMPLETIONS, EMBEDDINGS) call and return its shape."""
    if kind == EMBEDDINGS:
        chars, prompts = _prompt_chars(body.get("input"), "input")
        fmt = body.get("encoding_format")
        if fmt is not None and fmt not in ("float", "base64"):
            raise _bad("encoding_format", fmt, "must be float or base64")
        _count_int(body, "dimensions", 1, 1 << 20)
        stream = body.get("stream")
        if stream is not None and stream is not False:
            raise _bad("stream", stream, "embeddings have no streaming: must be false or absent")
        so = body.get("stream_options")
        if so is not None:
            raise _bad("stream_options", so, "embeddings have no streaming: must be absent")
        return Shape(chars, prompts, 1, 0, False)
    if kind == CHAT:
        chars, prompts = _message_chars(body.get("messages")), 1
    else:
        chars, prompts = _prompt_chars(body.get("prompt"), "prompt")
    n = _count_int(body, "n", 1, MAX_N) or 1
    mt = _count_int(body, "max_tokens", 1, 1 << 30)
    mct = _count_int(body, "max_completion_tokens", 1, 1 << 30)
    param = "max_tokens"
    if mct is not None and (mt is None or kind == CHAT):  # vLLM's chat: max_completion_tokens or max_tokens
        mt, param = mct, "max_completion_tokens"
    stop = body.get("stop")
    if not (stop is None or isinstance(stop, str)) and (
        not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)
    ):
        raise _bad("stop", stop, "must be a string or a list of strings")
    stream = body.get("stream", False)
    if type(stream) is not bool:
        raise _bad("stream", stream, "must be a boolean")
    so = body.get("stream_options")
    if so is not None and (not stream or not isinstance(so, dict)):
        raise _bad("stream_options", so, "is only allowed (as an object) when stream is true")
    return Shape(chars, prompts, n, mt, stream, param)


def header_text(value: str) -> str:
    """A header value as the client wrote it: ASGI servers hand header bytes over as Latin-1, so
    UTF-8 text (``Ⅻ``) arrives as mojibake (``â\x85«``); undecodable bytes are shown replaced."""
    try:
        return value.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # (not from a server: already text)
        return value


def priority_of(headers: Mapping[str, str], objectives: Mapping[str, int]) -> int:
    v = headers.get("x-gpupool-priority")
    if v is not None:
        try:
            return parse_priority(header_text(v), field="x-gpupool-priority")
        except InvalidInput as exc:
            raise OpenAIError(400, str(exc), param="x-gpupool-priority", code="invalid_value") from None
    name = headers.get("x-gateway-inference-objective")
    if name is None:
        return P1
    name = header_text(name)
    p = objectives.get(name.strip())
    if p is None:
        known = ", ".join(sorted(objectives)) or "none"
        raise OpenAIError(
            400,
            f"x-gateway-inference-objective: unknown objective {_show(name)} (known: {known})",
            param="x-gateway-inference-objective",
            code="unknown_objective",
        )
    return p


def objective_table(items: Any, *, field: str = "objectives") -> dict[str, int]:
    """``[{name, priority}]`` or InferenceObjective manifests (``metadata.name``, ``spec.priority``)."""
    if not isinstance(items, list):
        raise InvalidInput(field, items, "expected a list of {name, priority}")
    out: dict[str, int] = {}
    for i, it in enumerate(items):
        if isinstance(it, dict) and it.get("kind") == "InferenceObjective":
            name = (it.get("metadata") or {}).get("name")
            prio = (it.get("spec") or {}).get("priority", 0)
        elif isinstance(it, dict):
            name, prio = it.get("name"), it.get("priority")
        else:
            raise InvalidInput(f"{field}[{i}]", it, "expected {name, priority}")
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput(f"{field}[{i}].name", name, "must be a non-empty string")
        if name in out:
            raise InvalidInput(f"{field}[{i}].name", name, "duplicate objective")
        out[name] = parse_priority(prio, field=f"{field}[{i}].priority")
    return out


def usage_prompt_tokens(data: bytes) -> int | None:
    """``usage.prompt_tokens`` from a response body or SSE chunk, found without decoding the JSON."""
    i = data.rfind(b'"prompt_tokens":')
    if i < 0:
        return None
    j = i + 16
    while j < len(data) and data[j] == 0x20:
        j += 1
    k = j
    while k < len(data) and 0x30 <= data[k] <= 0x39:
        k += 1
    return int(data[j:k]) if k > j else None


class TokenCorrection:
    """Per model, ``actual ~ a * estimate + b`` by least squares weighted by ``1 / actual**2`` (so it
    minimises the relative error) and decayed exponentially (half-life ~70 observations); a plain
    ratio until the estimates vary enough to fit a slope. Invariant: the prediction is >= 1 and the
    identity before any observation."""

    DECAY = 0.99

    def __init__(self) -> None:
        self._s: dict[str, list[float]] = {}
        self._coef: dict[str, tuple[float, float]] = {}

    def observe(self, model: str, estimate: int, actual: int) -> None:
        if estimate < 1 or actual < 1:
            return
        s = self._s.get(model)
        if s is None:
            s = self._s[model] = [0.0] * 6
        d = self.DECAY
        x, y = float(estimate), float(actual)
        w = 1.0 / (y * y)
        wx = w * x
        s[0] = s[0] * d + w
        s[1] = s[1] * d + wx
        s[2] = s[2] * d + w * y
        s[3] = s[3] * d + wx * x
        s[4] = s[4] * d + wx * y
        s[5] = s[5] * d + 1.0
        self._coef[model] = self._fit(s)

    def coefficients(self, model: str) -> tuple[float, float]:
        return self._coef.get(model, (1.0, 0.0))

    @staticmethod
    def _fit(s: list[float]) -> tuple[float, float]:
        w, sx, sy, sxx, sxy, count = s
        var = sxx * w - sx * sx
        if count >= 8 and var > 1e-6 * sxx * w:
            a = (sxy * w - sx * sy) / var
            b = (sy - a * sx) / w
            if a > 0:
                return a, b
        return (sy / sx if sx > 0 else 1.0), 0.0

    def predict(self, model: str, estimate: int) -> int:
        a, b = self.coefficients(model)
        return max(1, math.ceil(a * estimate + b))
