"""The gateway's HTTP adapter (FastAPI/uvicorn/httpx/pydantic): lease API, admin and agent routes,
server-sent events, group commit, and the OpenAI-compatible proxy. Build with `create_app`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app(*args: Any, **kwargs: Any) -> FastAPI:
    from gpupool.adapters.http.app import create_app as _create

    return _create(*args, **kwargs)


__all__ = ["create_app"]
