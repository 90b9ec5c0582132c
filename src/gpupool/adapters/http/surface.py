"""The proxy's per-app OpenAI surface (``app.state.openai``): what each model is (task, context
length, from the hardware catalogue unless declared), each backend's options (vLLM priority
scheduling), the objective-name table of ``x-gateway-inference-objective`` and the learned prompt-size
correction.

Role: configuration the composition roots set (`configure_backend`, `configure_model`,
`set_objectives`) and the proxy reads per request; no I/O.
Invariant: a declared model card overrides the catalogue's; bad values raise `InvalidInput` naming
the field and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import FastAPI

from gpupool.adapters.http.openai_request import DEFAULT_OBJECTIVES, TokenCorrection
from gpupool.core.errors import InvalidInput

TASKS = ("generate", "embed")


@dataclass(frozen=True, slots=True)
class BackendOptions:
    priority_scheduling: bool = False
    """The backend runs vLLM ``--scheduling-policy priority``: send it the request's ``priority``."""


@dataclass(slots=True)
class ModelCard:
    task: str | None
    """``generate`` (chat / completions), ``embed`` (embeddings) or None (unknown: anything goes)."""
    max_model_len: int | None
    created: int


@dataclass
class OpenAISurface:
    """Per-app state of the proxy (``app.state.openai``)."""

    objectives: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_OBJECTIVES))
    backends: dict[str, BackendOptions] = field(default_factory=dict)
    models: dict[str, ModelCard] = field(default_factory=dict)
    correction: TokenCorrection = field(default_factory=TokenCorrection)
    tokenize_calls: int = 0

    def card(self, model: str, now_s: float) -> ModelCard:
        c = self.models.get(model)
        if c is None:
            task, ctx = _catalogue(model)
            c = self.models[model] = ModelCard(task, ctx, int(now_s))
        return c


def _catalogue(model: str) -> tuple[str | None, int | None]:
    from gpupool.hardware.memory import resolve_model

    try:
        arch = resolve_model(model)
    except (ValueError, OSError):
        return None, None
    return ("generate" if arch.is_decoder else "embed"), arch.max_positions


def configure_backend(app: FastAPI, backend_id: str, *, priority_scheduling: bool = False) -> None:
    app.state.openai.backends[backend_id] = BackendOptions(priority_scheduling=priority_scheduling)


def configure_model(
    app: FastAPI, model: str, *, task: str | None = None, max_model_len: int | None = None
) -> None:
    """Declare what a model is (overrides the catalogue); raises InvalidInput naming the field."""
    if task is not None and task not in TASKS:
        raise InvalidInput("task", task, "expected generate or embed")
    if max_model_len is not None and (type(max_model_len) is not int or max_model_len < 1):
        raise InvalidInput("max_model_len", max_model_len, "must be an integer >= 1")
    surf: OpenAISurface = app.state.openai
    base = surf.card(model, app.state.gateway.controller.clock.now())
    surf.models[model] = ModelCard(task or base.task, max_model_len or base.max_model_len, base.created)


def set_objectives(app: FastAPI, table: dict[str, int]) -> None:
    app.state.openai.objectives = dict(table)
