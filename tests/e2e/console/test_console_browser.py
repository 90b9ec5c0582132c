"""The web console in a real headless Chromium (Debian's ``chromium``, driven by Playwright) against a
real gateway on the simulated example cluster: the page signs in from ``?token=`` and drops it from the
address bar, loads with no console error, shows every GPU of ``/v1/pool``, a GPU past the high
watermark as paused, its heat map follows a grant within 1 s (the SSE event triggers the refresh; the
periodic poll alone is 2 s), a drain from the page changes ``/v1/pool``, it has no horizontal overflow
at 800 px, a tenant token sees only its own leases and no admin controls, and the event stream
reconnects after failures; a late 401 for an old token does not sign out a newer one; a sign-in
while the gateway answers errors is retried; a cleared watermark field is never sent; a caller's long
model name wraps in its cell instead of widening the page; a token a header cannot carry is refused
as such, not retried; a gateway that never answers leaves the figures marked stale. Screenshots go to
``.gpupool/artifacts/console/`` (gitignored).

Skipped when chromium or playwright is absent (``.ci/run`` installs chromium).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.cli.serve import build
from tests.adapters.http.servers import running

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"),
]

ADMIN, ALICE, BOB = "console-admin-token-1", "console-alice-token-1", "console-bob-token-01"
ARTIFACTS = Path(__file__).resolve().parents[3] / ".gpupool" / "artifacts" / "console"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {ALICE}, tenant: alice, role: tenant}}\n"
        f"  - {{token: {BOB}, tenant: bob, role: tenant}}\n"
    )
    bundle = build(data_dir=tmp_path / "d", auth_file=auth, simulate=True)
    with running(bundle.app) as url:
        yield url, bundle


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def _watch_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    return errors


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _gpus(pool: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for n in pool["nodes"] for g in n["gpus"]]


def _submit_token(page: Any, token: str) -> None:
    page.fill("#token", token)
    page.click("#signin-form button[type='submit']")


def _sign_in_refused(page: Any, url: str) -> None:
    """Open the console and sign in with a token the gateway does not know; wait for the refusal."""
    page.goto(f"{url}/ui")
    page.wait_for_selector("#signin-form", state="visible")
    _submit_token(page, "not-a-real-token")
    wait_js(page, "() => document.getElementById('signin-error').textContent.includes('rejected')")


def _wait_for_role(page: Any, role: str) -> None:
    wait_js(page, "(role) => document.getElementById('who').textContent === role", role)


def _granted(g: dict[str, Any]) -> int:
    return sum(s["granted"]["vram_mib"] for s in g["slices"])


def wait_js(page: Any, fn: str, arg: Any = None, *, timeout_ms: int = 5000) -> None:
    """Poll ``fn(arg)`` in the page until truthy, at most ``timeout_ms``. Playwright's own
    ``wait_for_function`` polls through ``eval`` inside the page, which the console's CSP (no
    'unsafe-eval') rightly refuses; ``evaluate`` goes through the DevTools protocol instead."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(fn, arg):
        assert time.monotonic() < deadline, f"not true within {timeout_ms} ms: {fn}"
        time.sleep(0.02)


def _push_readings(adm: httpx.Client, sim: Any, pool: dict[str, Any], hot_gpu: str) -> None:
    """What the node agents would send: the simulated cluster's readings, one GPU at 90 % VRAM."""
    for n in pool["nodes"]:
        node = n["node"]
        for g in sim.read(node).gpus:
            if f"{node}/{g.index}" == hot_gpu:
                sim.force(hot_gpu, memory_used_mib=int(g.memory_total_mib * 0.9))
        body = {
            "gpus": [
                {
                    "gpu_id": f"{node}/{g.index}",
                    "vram_used_mib": g.memory_used_mib,
                    "vram_total_mib": g.memory_total_mib,
                    "temperature_c": g.temperature_c,
                }
                for g in sim.read(node).gpus
            ]
        }
        r = adm.post(f"/v1/nodes/{node}/readings", json=body)
        assert r.status_code == 200, r.text


def test_console_live_heat_map_and_drain(gateway: tuple[str, Any], browser: Any) -> None:
    url, bundle = gateway
    adm, alice, bob = _client(url, ADMIN), _client(url, ALICE), _client(url, BOB)
    pool = adm.get("/v1/pool").json()
    gpus = _gpus(pool)
    hot = gpus[0]["gpu_id"]
    _push_readings(adm, bundle.sim, pool, hot)
    assert adm.get("/v1/pool").json()["paused_gpus"] == [hot]
    for prio, mib in (("P0", 16384), ("P2", 8192), ("P2", 12288)):
        assert bob.post("/v1/leases", json={"priority": prio, "vram_mib": mib}).status_code == 201
    pool = adm.get("/v1/pool").json()
    gpus = _gpus(pool)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = _watch_errors(page)
    page.goto(f"{url}/?token={ADMIN}")
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    page.wait_for_selector("#live.on", timeout=10_000)  # the event stream is connected

    # ?token= is kept for the tab and gone from the address bar
    assert "token" not in page.url
    assert page.evaluate("sessionStorage.getItem('gpupool.token')") == ADMIN

    # every GPU of /v1/pool has a tile, with its granted VRAM
    shown = page.eval_on_selector_all(
        ".gpu", "els => els.map(e => [e.dataset.gpuId, Number(e.dataset.grantedMib)])"
    )
    assert sorted(map(tuple, shown)) == sorted((g["gpu_id"], _granted(g)) for g in gpus)
    slices_shown = page.eval_on_selector_all(".slice", "els => els.map(e => e.dataset.sliceId)")
    assert sorted(slices_shown) == sorted(s["slice_id"] for g in gpus for s in g["slices"])
    # the GPU past the high watermark is shown paused, with its reading
    assert page.get_attribute(f".gpu[data-gpu-id='{hot}']", "data-state") == "paused"
    assert "reading" in page.inner_text(f".gpu[data-gpu-id='{hot}']")

    # a grant shows on the heat map within 1 s (bounded wait on the tile's figure)
    target = next(
        g
        for g in gpus
        if any(s["kind"] != "time-slice" and s["free"]["vram_mib"] >= 4096 for s in g["slices"])
    )
    r = alice.post("/v1/leases", json={"priority": "P1", "vram_mib": 4096, "gpu_id": target["gpu_id"]})
    assert r.status_code == 201, r.text
    want = _granted(target) + 4096
    wait_js(
        page,
        "([id, want]) => { const e = document.querySelector(`.gpu[data-gpu-id='${id}']`);"
        " return e !== null && Number(e.dataset.grantedMib) === want; }",
        [target["gpu_id"], want],
        timeout_ms=1000,
    )
    page.wait_for_selector("#events li[data-kind='granted']", timeout=2000)
    # ... and exactly once: after the refreshes that follow, the figure is still the granted total
    page.wait_for_timeout(300)
    assert int(page.get_attribute(f".gpu[data-gpu-id='{target['gpu_id']}']", "data-granted-mib")) == want
    assert page.locator("#lease-bands tr[data-tenant='alice']").count() == 1
    assert page.locator("#lease-bands tr[data-tenant='bob']").count() == 1
    # a release moves it back
    assert alice.delete(f"/v1/leases/{r.json()['id']}").status_code == 200
    wait_js(
        page,
        "([id, want]) => Number(document.querySelector(`.gpu[data-gpu-id='${id}']`).dataset.grantedMib)"
        " === want",
        [target["gpu_id"], want - 4096],
        timeout_ms=5000,
    )
    page.wait_for_selector("#lease-bands tr[data-tenant='alice']", state="detached", timeout=5000)
    assert alice.post("/v1/leases", json={"priority": "P1", "vram_mib": 4096}).status_code == 201

    # drain from the page: button, confirmation, result; /v1/pool changes
    victim = gpus[-1]["gpu_id"]
    tile = page.locator(f".gpu[data-gpu-id='{victim}']")
    tile.locator("button[data-action='drain']").click()
    page.wait_for_selector("#confirm[open]")
    page.fill("#confirm-reason", "maintenance from the console test")
    page.click("#confirm-ok")
    page.wait_for_selector(".toast.ok", timeout=5000)
    after = {g["gpu_id"]: g for g in _gpus(adm.get("/v1/pool").json())}
    assert after[victim]["drained"] is True
    assert sum(g["drained"] for g in after.values()) == 1
    page.wait_for_selector(f".gpu[data-gpu-id='{victim}'][data-drained='1']", timeout=5000)
    _shot(page, "console-1280.png")

    # cancelling the confirmation changes nothing
    page.locator(f".gpu[data-gpu-id='{victim}'] button[data-action='undrain']").click()
    page.wait_for_selector("#confirm[open]")
    page.click("#confirm button[value='cancel']")
    assert {g["gpu_id"]: g for g in _gpus(adm.get("/v1/pool").json())}[victim]["drained"] is True

    # usable at 800 px: no horizontal scrolling
    page.set_viewport_size({"width": 800, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
    _shot(page, "console-800.png")
    assert errors == []


def test_console_tenant_sees_own_leases_and_bad_token_is_refused(
    gateway: tuple[str, Any], browser: Any
) -> None:
    url, _ = gateway
    alice, bob = _client(url, ALICE), _client(url, BOB)
    assert alice.post("/v1/leases", json={"priority": "P2", "vram_mib": 2048}).status_code == 201
    assert bob.post("/v1/leases", json={"priority": "P1", "vram_mib": 2048}).status_code == 201

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    # the event stream fails twice (as through a restarting proxy); the page retries until it is live
    failures = [0]

    def flaky(route: Any) -> None:
        if failures[0] < 2:
            failures[0] += 1
            route.abort()
        else:
            route.continue_()

    page.route("**/v1/events", flaky)
    _sign_in_refused(page, url)
    assert page.evaluate("sessionStorage.getItem('gpupool.token')") is None

    _submit_token(page, ALICE)
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    tenants = page.eval_on_selector_all(
        "#lease-bands tr[data-tenant]", "els => els.map(e => e.dataset.tenant)"
    )
    assert tenants == ["alice"]

    # a tenant token is offered no admin control (they were shown until one was refused): the role
    # is shown, the drain buttons and the watermark form are hidden, a slice click opens nothing
    _wait_for_role(page, "tenant")
    first = _gpus(_client(url, ADMIN).get("/v1/pool").json())[0]["gpu_id"]
    assert page.locator(f".gpu[data-gpu-id='{first}'] .gpu-actions").is_hidden()
    assert page.locator("#wm-form").is_hidden()
    page.locator(".slice").first.click()
    page.wait_for_timeout(200)
    assert not page.evaluate("document.getElementById('confirm').open")
    pool = _client(url, ADMIN).get("/v1/pool").json()
    assert not any(g["drained"] or not all(s["healthy"] for s in g["slices"]) for g in _gpus(pool))


def test_console_late_refusal_of_an_old_token_keeps_the_new_sign_in(
    gateway: tuple[str, Any], browser: Any
) -> None:
    """A bad token's sign-in reads /v1/pool and /v1/leases at once; the first 401 shows the sign-in
    form. When the second 401 arrives only after a good token has signed in, it refers to the old
    token and must not sign the new one out (it did: the admin action that followed went out with
    no token and was refused as "missing bearer token" instead of "needs admin")."""
    url, _ = gateway
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    held: list[Any] = []

    def hold_bad(route: Any) -> None:
        if route.request.headers.get("authorization") == "Bearer not-a-real-token":
            held.append(route)  # answered later, after the good sign-in
        else:
            route.continue_()

    page.route("**/v1/leases", hold_bad)
    _sign_in_refused(page, url)
    assert len(held) == 1

    _submit_token(page, ALICE)
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    held.pop().continue_()  # the old token's refusal arrives now
    page.wait_for_timeout(300)
    assert page.evaluate("sessionStorage.getItem('gpupool.token')") == ALICE
    assert page.locator("#app").is_visible()

    _wait_for_role(page, "tenant")
    with page.expect_response(  # the next poll still goes out with the new token, and is answered
        lambda r: r.url.endswith("/v1/pool") and r.request.headers.get("authorization") == f"Bearer {ALICE}"
    ) as polled:
        pass
    assert polled.value.status == 200


def test_console_sign_in_outlasts_a_gateway_that_answers_errors(
    gateway: tuple[str, Any], browser: Any
) -> None:
    """Opened while the gateway (or the proxy in front of it) answers 502 or does not answer, the
    page keeps the token and tries again until the gateway is back (it stayed on the sign-in form
    for good, the token field empty)."""
    url, _ = gateway
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    down = [True]

    def bad_gateway(route: Any) -> None:
        if not down[0]:
            route.continue_()
        elif route.request.url.endswith("/v1/pool"):
            route.fulfill(status=502, body="<html>Bad Gateway</html>", content_type="text/html")
        else:
            route.abort()

    page.route("**/v1/pool", bad_gateway)
    page.route("**/v1/leases", bad_gateway)
    page.goto(f"{url}/?token={ALICE}")
    wait_js(page, "() => document.getElementById('signin-error').textContent !== ''")
    assert "token" not in page.url
    down[0] = False
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    assert page.locator("#app").is_visible()
    assert page.evaluate("sessionStorage.getItem('gpupool.token')") == ALICE


def test_console_watermarks_form_refuses_an_empty_field(gateway: tuple[str, Any], browser: Any) -> None:
    """A cleared field is not sent as 0 (it was: clearing "VRAM low" and confirming set the resume
    threshold to 0 %, so paused P2 work would never resume); the watermarks stay as they were."""
    url, _ = gateway
    adm = _client(url, ADMIN)
    before = adm.get("/v1/admin/watermarks").json()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    puts: list[str] = []
    page.on("request", lambda r: puts.append(r.url) if r.method == "PUT" else None)
    page.goto(f"{url}/?token={ADMIN}")
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    page.fill("#wm-form input[name='vram_low']", "")
    page.click("#wm-form button[type='submit']")
    page.wait_for_timeout(300)
    if page.evaluate("document.getElementById('confirm').open"):
        page.click("#confirm-ok")
        page.wait_for_timeout(500)
    assert puts == []
    assert adm.get("/v1/admin/watermarks").json() == before


def test_console_says_its_figures_are_stale_while_refreshes_fail(
    gateway: tuple[str, Any], browser: Any
) -> None:
    """While ``/v1/pool`` answers errors and the event stream stays up, the page kept showing the old
    figures with the pill saying "live"; it now says since when the figures are stale, retries, and
    drops the notice once a refresh lands."""
    url, _ = gateway
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{url}/?token={ADMIN}")
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    page.wait_for_selector("#live.on", timeout=10_000)
    assert page.locator("#stale").is_hidden()
    down = [True]

    def failing(route: Any) -> None:
        if down[0]:
            route.fulfill(status=500, body='{"error": "boom"}', content_type="application/json")
        else:
            route.continue_()

    page.route("**/v1/pool", failing)
    with _client(url, BOB) as bob:
        assert bob.post("/v1/leases", json={"priority": "P1", "vram_mib": 1024}).status_code == 201
    wait_js(page, "() => !document.getElementById('stale').hidden", timeout_ms=10_000)
    assert (
        "stale since" in page.locator("#stale").inner_text() and "boom" in page.locator("#stale").inner_text()
    )
    down[0] = False
    wait_js(page, "() => document.getElementById('stale').hidden", timeout_ms=10_000)


def test_console_long_model_name_does_not_widen_the_page(gateway: tuple[str, Any], browser: Any) -> None:
    """A lease's ``model`` is the caller's own text (up to 256 characters, unchecked when ``vram_mib``
    is given). One long word in it stretched the active-lease table, and with it the page, to
    thousands of pixels once the list was opened; it now wraps inside its cell."""
    url, _ = gateway
    with _client(url, ALICE) as alice:
        r = alice.post("/v1/leases", json={"priority": "P1", "vram_mib": 1024, "model": "M" * 256})
        assert r.status_code == 201, r.text
    page = browser.new_page(viewport={"width": 800, "height": 900})
    errors = _watch_errors(page)
    page.goto(f"{url}/?token={ADMIN}")
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    page.click("#app details summary")
    page.wait_for_selector("#lease-list tr[data-lease-id]", state="visible")
    assert page.locator("#lease-list td", has_text="M" * 256).count() == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
    assert errors == []


def test_console_token_a_header_cannot_carry_is_refused_as_such(
    gateway: tuple[str, Any], browser: Any
) -> None:
    """A token with a character an HTTP header cannot carry (typographic quotes picked up with a copy,
    a line break) never reaches the gateway: ``fetch`` throws. The page took that for a gateway that
    cannot be reached, kept the token and retried it every 2 s for good; it now says what is wrong
    with the token, keeps nothing, and a good token signs in after it."""
    url, _ = gateway
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{url}/?token=%E2%80%9C{ALICE}%E2%80%9D")
    wait_js(page, "() => document.getElementById('signin-error').textContent !== ''")
    message = page.inner_text("#signin-error")
    assert "U+201C" in message and "token" in message, message
    assert "reach the gateway" not in message
    assert "token" not in page.url
    assert page.evaluate("sessionStorage.getItem('gpupool.token')") is None
    assert page.locator("#signin-form").is_visible()

    _submit_token(page, ALICE)
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    _wait_for_role(page, "tenant")


def test_console_says_its_figures_are_stale_while_the_gateway_does_not_answer(
    gateway: tuple[str, Any], browser: Any
) -> None:
    """A gateway that takes requests and never answers them (a blocked process, a proxy holding the
    connection): the console's read of ``/v1/pool`` waited for good, every later refresh waited
    behind it, and the page went on showing its old figures as current, the stream pill still
    "live". A read now gives up after ``REQUEST_TIMEOUT_MS``, the page says its figures are stale, and
    it recovers once the gateway answers again."""
    url, _ = gateway
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{url}/?token={ADMIN}")
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    page.wait_for_selector("#live.on", timeout=10_000)
    held: list[Any] = []
    hang = [True]

    def never_answer(route: Any) -> None:
        if hang[0]:
            held.append(route)
        else:
            route.continue_()

    page.route("**/v1/pool", never_answer)
    try:
        wait_js(page, "() => !document.getElementById('stale').hidden", timeout_ms=30_000)
        assert "stale since" in page.locator("#stale").inner_text()
        hang[0] = False
        wait_js(page, "() => document.getElementById('stale').hidden", timeout_ms=30_000)
    finally:
        hang[0] = False
        for route in held:
            with contextlib.suppress(Exception):  # the page gave up on it already
                route.abort()
