"""The project's own docs: every relative link in the README, CONTRIBUTING.md, docs/ (every page)
and deploy/README.md points at a file of the repository (none leaves it) and, with a #fragment, at
a heading of that page, the README shows
the console screenshot, the working notes are gone, no tracked file names an absolute path of a
development machine, and the admin calls docs/ops shows are accepted by a real gateway."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "deploy" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MACHINE_PATH = re.compile(r"(?<![\w.])/(work|home/[a-z][\w-]*|root|Users/[A-Za-z][\w-]*)/")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_stay_in_the_repository(page: Path) -> None:
    for target in _LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # a URL
        path = (page.parent / target.split("#", 1)[0]).resolve() if not target.startswith("#") else page
        assert path.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"
        anchor = target.partition("#")[2]
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.name}: {target}: no heading with that anchor"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a page: lower case, punctuation dropped, spaces as dashes,
    a repeated heading numbered (-1, -2, ...)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchors_follow_githubs_rule() -> None:
    page = ROOT / "docs" / "fgd" / "README.md"
    assert "the-core-policy-frag-gradient-issue-17" in _anchors(page)
    assert "api-cli-events-metrics" in _anchors(ROOT / "docs" / "tidal" / "README.md")


def test_readme_shows_the_console_and_links_the_design() -> None:
    text = (ROOT / "README.md").read_text()
    assert (
        "](docs/img/console.png)" in text and (ROOT / "docs" / "img" / "console.png").stat().st_size > 10_000
    )
    assert "](docs/architecture.md)" in text and "](CONTRIBUTING.md)" in text
    assert "ARCHITECTURE.md" not in text and "HELPERS" not in text
    assert not (ROOT / "docs" / "HELPERS.md").exists()


def test_no_tracked_file_names_a_development_machine_path() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(
        b"\0"
    )
    hits = []
    for name in files:
        if not name:
            continue
        p = ROOT / name.decode()
        if not p.is_file() or p.suffix in (".png", ".jpg", ".gz", ".whl"):
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        hits.extend(f"{name.decode()}: {m.group(0)}" for m in _MACHINE_PATH.finditer(text))
    assert hits == []


def test_machine_path_pattern() -> None:
    root = "/"  # built here so that this file does not name such a path itself
    assert _MACHINE_PATH.search(f"see {root}work/main/README.md")
    assert _MACHINE_PATH.search(f"in {root}home/alice/src")
    assert not _MACHINE_PATH.search("--workloads /etc/gpupool/workloads.yaml")
    assert not _MACHINE_PATH.search("../shared/data and /var/lib/gpupool")


_ADMIN_CALL = re.compile(r"`(POST|PUT|PATCH) (/v1/[^`\s]+)` with\s+`(\{[^`]*\})`")


def test_admin_calls_the_ops_docs_show_are_accepted(tmp_path: Path) -> None:
    """Each `METHOD /v1/... with {body}` of docs/ops, sent as written (the path's {gpu_id} or
    {slice_id} filled in) to a real gateway, is answered 2xx (upgrading.md reset the watermarks with
    `PUT` and `{}`, which is 422: PUT needs every field)."""
    import httpx

    from gpupool.cli.serve import build
    from tests.adapters.http.servers import running

    calls = [
        (page.name, *m.groups())
        for page in sorted((ROOT / "docs" / "ops").glob("*.md"))
        for m in _ADMIN_CALL.finditer(page.read_text())
    ]
    assert any(path == "/v1/admin/watermarks" for _, _, path, _ in calls)
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  - {token: docs-admin-token-1, tenant: ops, role: admin}\n")
    bundle = build(data_dir=tmp_path / "d", auth_file=auth, simulate=True)
    with running(bundle.app) as url:
        cl = httpx.Client(base_url=url, headers={"Authorization": "Bearer docs-admin-token-1"}, timeout=10)
        gpu = cl.get("/v1/pool").json()["nodes"][0]["gpus"][0]
        for page_name, method, shown, body in calls:
            path = shown.replace("{gpu_id}", gpu["gpu_id"]).replace(
                "{slice_id}", gpu["slices"][0]["slice_id"]
            )
            r = cl.request(method, path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code < 300, f"{page_name}: {method} {path} {body}: {r.status_code} {r.text}"


def test_upgrading_names_every_file_the_gateway_keeps_state_in(tmp_path: Path) -> None:
    """docs/ops/upgrading.md says where the state is, what to back up and what to delete for a reset:
    every file a gateway (`build` + the tidal plane, as `gpupool serve` starts by default) writes to
    its data dir is named there, and the state table says that queued tickets and batch jobs are
    kept (they survive a restart), not that they end with the process."""
    from gpupool.cli.serve import build
    from gpupool.cli.tidalplane import attach_tidal, load_plane_config

    bundle = build(data_dir=tmp_path, simulate=True)
    attach_tidal(bundle, config=load_plane_config(None), data_dir=tmp_path, clock=bundle.controller.clock)
    text = (ROOT / "docs" / "ops" / "upgrading.md").read_text()
    stems = {re.sub(r"(-wal|-shm|\.lock)$", "", p.name) for p in tmp_path.iterdir() if p.is_file()}
    assert {"leases.db", "batch.db", "admin.token"} <= stems
    for stem in sorted(stems):
        assert f"DATA_DIR/{stem}" in text, f"upgrading.md does not name DATA_DIR/{stem}"
    rows = [line for line in text.splitlines() if line.startswith("|") and "gateway's memory" in line]
    assert rows and not any("ticket" in r or "batch" in r for r in rows), rows
