"""The node agents' engine directives on the gateway (``gpupool serve`` / ``run`` mount them when tidal
names standby backends).

- ``GET /v1/nodes/{node}/engines`` (role ``admin``, the agents' token) -> ``{"engines": [{"id",
  "gpu_id", "endpoint", "pauser", "level", "state"}]}``: the engines on that node whose sleep the control
  plane decides, each with the state its agent must bring it to (``awake`` | ``asleep``) with the named
  pauser (``vllm-sleep``: ``POST /sleep?level=N``, ``POST /wake_up``). A node without such engines
  gets an empty list. The agent reports the outcome as ``engine_asleep`` / ``engine_awake`` /
  ``engine_failed`` events on ``POST /v1/nodes/{node}/events`` (``lease_id`` = the engine id,
  ``latency_ms`` = the pauser call), which the gateway hands to `Gateway.agent_listeners`.

Why a directive list and not a push: the agent already polls the gateway (readings, ledger) and keeps
working while it is unreachable; a state to converge on survives lost calls and restarts on either
side, where a one-shot "sleep now" command would not. This module imports only the core.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from gpupool.adapters.http.app import admin_principal
from gpupool.adapters.http.auth import Principal

AdminWho = Annotated[Principal, Depends(admin_principal)]


class EnginePort(Protocol):
    def directives(self, node: str) -> list[dict[str, object]]: ...


def add_engine_routes(app: FastAPI, port: EnginePort) -> None:
    app.state.engines = port

    @app.get("/v1/nodes/{node}/engines")
    async def engines(node: str, who: AdminWho) -> JSONResponse:
        return JSONResponse({"engines": port.directives(node)})


__all__ = ["EnginePort", "add_engine_routes"]
