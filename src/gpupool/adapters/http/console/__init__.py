"""The operator web console: static assets served by the gateway at ``/`` and ``/ui``.

`add_console_routes` mounts ``GET /`` and ``GET /ui`` (the page) and ``GET /ui/{asset}`` (its script,
style sheet and icon), each also answering HEAD (``curl -I``, uptime monitors). The page itself
holds no data and needs no token; it signs in with a Bearer token (kept in the browser's
``sessionStorage``) and reads the same JSON and SSE API as any client
(``/v1/pool``, ``/v1/leases``, ``/v1/events``, ``/v1/admin/*``), so it can do nothing the token could
not do with curl.

Invariants: assets come from this package's own files (packaged with the wheel, no build step, no CDN,
no network access beyond the gateway); only the names in ``ASSETS`` and the inline icon are served (no
path from the URL reaches the file system); every response carries a strict Content-Security-Policy
(scripts, styles and connections from the gateway's own origin only), ``no-referrer`` (the first load
may carry ``?token=``) and ``nosniff``.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "events.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}

FAVICON_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    b'<rect x="1" y="1" width="6" height="6" rx="1" fill="#2f9e44"/>'
    b'<rect x="9" y="1" width="6" height="6" rx="1" fill="#f08c00"/>'
    b'<rect x="1" y="9" width="6" height="6" rx="1" fill="#1c7ed6"/>'
    b'<rect x="9" y="9" width="6" height="6" rx="1" fill="#e03131"/></svg>'
)

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def load_assets() -> dict[str, bytes]:
    """The console's files, read once from the installed package (the icon is inline)."""
    root = resources.files(__package__)
    out = {name: (root / name).read_bytes() for name in ASSETS}
    out["favicon.svg"] = FAVICON_SVG
    return out


def add_console_routes(app: FastAPI) -> None:
    """Mount the console on ``app``: ``/`` and ``/ui`` serve the page, ``/ui/{asset}`` its files."""
    assets = load_assets()

    types = {**ASSETS, "favicon.svg": "image/svg+xml"}

    def asset(name: str) -> Response:
        return Response(assets[name], media_type=types[name], headers=SECURITY_HEADERS)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def console_root() -> Response:
        return asset("index.html")

    @app.api_route("/ui", methods=["GET", "HEAD"], include_in_schema=False)
    async def console_ui() -> Response:
        return asset("index.html")

    @app.api_route("/ui/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def console_asset(name: str) -> Response:
        if name not in assets:
            return Response(
                f"no console asset {name!r}\n",
                status_code=404,
                media_type="text/plain",
                headers=SECURITY_HEADERS,
            )
        return asset(name)
