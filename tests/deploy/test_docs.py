"""The project's own docs: every relative link in the README, CONTRIBUTING.md, docs/architecture.md,
docs/ops/ and deploy/README.md points at a file of the repository (none leaves it), the README shows
the console screenshot, the working notes are gone, and no tracked file names an absolute path of a
development machine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "docs" / "architecture.md",
    ROOT / "deploy" / "README.md",
    *sorted((ROOT / "docs" / "ops").glob("*.md")),
]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MACHINE_PATH = re.compile(r"(?<![\w.])/(work|home/[a-z][\w-]*|root|Users/[A-Za-z][\w-]*)/")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_stay_in_the_repository(page: Path) -> None:
    for target in _LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


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
