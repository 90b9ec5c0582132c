"""The CLI as a user runs it: real subprocesses of the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys


def gpupool(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_help_lists_the_commands() -> None:
    out = gpupool("--help")
    assert out.returncode == 0
    assert "demo" in out.stdout and "bench" in out.stdout


def test_demo_shows_a_p0_preemption() -> None:
    out = gpupool("demo")
    assert out.returncode == 0, out.stderr
    assert "preempted_victims" in out.stdout
    assert "batch-eval-2" in out.stdout


def test_bench_allocator_json_shape() -> None:
    out = gpupool("bench", "allocator", "--json", "--sizes", "200", "--ops", "200", "--seed-ops", "50")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["benchmark"] == "allocator"
    (row,) = doc["results"]
    assert row["slices"] == 200
    assert row["gpupool_us_per_op"] > 0 and row["seed_us_per_op"] > 0


def test_bad_input_exits_2_with_one_line() -> None:
    out = gpupool("bench", "allocator", "--sizes", "0", "--ops", "10")
    assert out.returncode == 2
    assert out.stderr.startswith("gpupool: error:") and "sizes" in out.stderr
    assert "Traceback" not in out.stderr


def test_demo_pool_is_a_legal_mig_layout() -> None:
    from gpupool.cli.demo import seed_example_pool
    from gpupool.hardware.mig import MigInstance, validate_layout

    mig = [s for s in seed_example_pool() if s.kind.value == "mig"]
    starts = [MigInstance(s.profile, int(s.id.rsplit("-", 1)[1])) for s in mig]
    validate_layout("A100-SXM4-80GB", starts)


def test_bench_allocator_takes_a_core_policy_and_rejects_an_unknown_one() -> None:
    out = gpupool(
        "bench", "allocator", "--json", "--sizes", "200", "--ops", "100", "--seed-ops", "30",
        "--policy", "frag-gradient",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["results"][0]["gpupool_us_per_op"] > 0
    bad = gpupool("bench", "allocator", "--sizes", "200", "--policy", "nope")
    assert bad.returncode == 2 and "--policy" in bad.stderr and "nope" in bad.stderr


def test_every_choice_of_an_option_is_explained_in_its_help() -> None:
    """An option that takes one of a fixed set of values names each value in its --help text
    (``plan --format`` listed four of its five formats: ``vllm`` was missing)."""
    import enum
    import typing

    import typer

    from gpupool.cli.main import app

    missing: list[str] = []

    def walk(cmd: typing.Any, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        for p in cmd.params:
            ann = p.type_descriptor.annotation
            for t in typing.get_args(ann) or (ann,):
                if isinstance(t, type) and issubclass(t, enum.Enum):
                    missing.extend(
                        f"gpupool {' '.join(path)} {p.opts[0]}: {m.value}"
                        for m in t
                        if str(m.value) not in (p.help or "")
                    )

    walk(typer.main.get_command(app), [])
    assert missing == []


def test_no_default_in_any_help_shows_where_the_package_is_installed() -> None:
    """``serve`` / ``run --help`` showed the bundled example specs' defaults as absolute paths of
    the checkout or site-packages; defaults are shown as the project names them."""
    import typing

    import typer

    from gpupool.cli.main import app
    from gpupool.cli.serve import REPO_ROOT

    shown: list[str] = []

    def walk(cmd: typing.Any, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        for p in cmd.params:
            default = p.show_default if isinstance(p.show_default, str) else p.default
            if str(REPO_ROOT) in str(default):
                shown.append(f"gpupool {' '.join(path)} {p.opts[0]}: {default}")

    walk(typer.main.get_command(app), [])
    assert shown == []
