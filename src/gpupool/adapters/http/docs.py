"""The gateway's OpenAPI document and an offline ``/docs`` page.

`install_docs` serves Swagger UI (swagger-ui-dist 5.35.0, Apache-2.0, vendored in ``swagger_ui/``
with its LICENSE and NOTICE) from the package at ``/docs/assets/``: the page loads nothing from the
network but ``/openapi.json`` (the validator badge is off). The OpenAPI document declares the bearer
`securitySchemes` (``bearer``, so ``/docs`` has an Authorize button) and, on every operation but
``/healthz``, the security requirement and its 401. Operations of the OpenAI-compatible routes also
get their error responses in OpenAI's shape (400, 401, 404, 413, 429, 503 unless declared already),
so a generated client or a response validator sees what those routes answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from gpupool.adapters.http import schemas as s
from gpupool.adapters.http.errors import is_openai_path

ASSETS = Path(__file__).with_name("swagger_ui")
PUBLIC_PATHS = frozenset({"/healthz"})
OPENAI_ERROR_CODES = (400, 401, 404, 413, 429, 503)

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API docs</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="data:,">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({{
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  validatorUrl: null,
  persistAuthorization: true,
  deepLinking: true,
}});
</script>
</body>
</html>
"""


def install_docs(app: FastAPI) -> None:
    """Mount the Swagger UI assets, add ``GET /docs`` and replace ``app.openapi`` (cached)."""
    app.mount("/docs/assets", StaticFiles(directory=ASSETS), name="swagger-ui-assets")
    page = _PAGE.format(title=app.title)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_openapi(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    comps = doc.setdefault("components", {})
    comps.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from the gateway's auth file (or the generated admin token).",
    }
    schemas = comps.setdefault("schemas", {})
    for model in (s.ErrorOut, s.OpenAIErrorOut):
        for name, sub in (
            model.model_json_schema(ref_template="#/components/schemas/{model}").get("$defs", {}).items()
        ):
            schemas.setdefault(name, sub)
        top = model.model_json_schema(ref_template="#/components/schemas/{model}")
        top.pop("$defs", None)
        schemas.setdefault(model.__name__, top)
    for path, ops in doc.get("paths", {}).items():
        for op in ops.values():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            responses = op["responses"]
            if path in PUBLIC_PATHS:
                continue
            op["security"] = [{"bearer": []}]
            if is_openai_path(path):
                for code in OPENAI_ERROR_CODES:
                    responses.setdefault(str(code), _ref("OpenAIErrorOut", code))
            else:
                responses.setdefault("401", _ref("ErrorOut", 401))
    return doc


def _ref(name: str, code: int) -> dict[str, Any]:
    return {
        "description": f"error ({code})",
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
    }
