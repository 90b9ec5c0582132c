"""The console's HTTP routes on a real gateway: the page and its assets are served without a token,
with the right types and a strict Content-Security-Policy; unknown names (and attempts to reach other
files) are 404; the API stays behind Bearer auth; and the assets are packaged with the wheel."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest

from gpupool.adapters.http.console import ASSETS, load_assets
from gpupool.cli.serve import build
from tests.adapters.http.servers import running

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> object:
    bundle = build(data_dir=tmp_path_factory.mktemp("console"), simulate=True)
    with running(bundle.app) as u:
        yield u


@pytest.mark.parametrize("path", ["/", "/ui"])
def test_page_is_served_without_token(url: str, path: str) -> None:
    r = httpx.get(url + path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.headers["referrer-policy"] == "no-referrer"
    for name in ("dom.js", "events.js", "app.js"):
        assert f'<script src="/ui/{name}"' in r.text
    assert "http://" not in r.text and "https://" not in r.text.replace("http://www.w3.org", "")


@pytest.mark.parametrize(
    ("name", "ctype"),
    [
        ("app.js", "text/javascript"),
        ("dom.js", "text/javascript"),
        ("events.js", "text/javascript"),
        ("app.css", "text/css"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
def test_assets(url: str, name: str, ctype: str) -> None:
    r = httpx.get(f"{url}/ui/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(ctype)
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.content == load_assets()[name]


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/__init__.py", "/ui/..%2F__init__.py", "/ui/%2e%2e"])
def test_unknown_assets_are_404(url: str, path: str) -> None:
    r = httpx.get(url + path)
    assert r.status_code == 404
    assert "import" not in r.text


@pytest.mark.parametrize("name", ["nope.js", "%3Cimg src=x onerror=alert(1)%3E.html"])
def test_an_unknown_asset_is_refused_with_the_console_headers(url: str, name: str) -> None:
    """The console's own 404 echoes the name; it carries the same nosniff and CSP as every console
    response (it had neither)."""
    r = httpx.get(f"{url}/ui/{name}")
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("text/plain")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in r.headers["content-security-policy"]


def test_api_still_needs_a_token(url: str) -> None:
    assert httpx.get(f"{url}/v1/pool").status_code == 401


def test_no_asset_loads_anything_from_another_origin() -> None:
    for name, data in load_assets().items():
        text = data.decode()
        for scheme in ("http://", "https://", "//cdn"):
            assert scheme not in text.replace("http://www.w3.org/2000/svg", ""), (name, scheme)


def test_assets_are_packaged_with_the_wheel() -> None:
    """Every console file matches a package-data glob of pyproject.toml (else the wheel lacks it)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = cfg["tool"]["setuptools"]["package-data"]["gpupool"]
    for name in ASSETS:
        rel = f"adapters/http/console/{name}"
        assert any(fnmatch(rel, g) for g in globs), (name, globs)
