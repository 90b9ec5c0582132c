"""`make mutate`: mutation testing of the modules that carry the guarantees, with cosmic-ray.

Role: for each listed module, copy the repository's sources and tests into a scratch folder, let
cosmic-ray mutate the module there (the working tree is never touched, even if the run is
interrupted), run only the tests that cover that module against each mutant (``pytest -x``, no
plugins), and print generated / killed / survived / timed out. Survivors' diffs are written to
``out/mutation/<module>.survivors.txt`` (cosmic-ray's session database beside it,
``<module>.sqlite``) so each can be judged (equivalent mutant, or a missing test).

Invariants:
- the unmutated baseline must pass with the same test selection, otherwise the module is reported
  as failed and no mutant is run (a red baseline would "kill" every mutant);
- the scratch copy's ``src`` comes first on ``PYTHONPATH``, before the editable
  install, so the tests import the mutated module;
- operators that only produce noise are filtered out (see ``EXCLUDED_OPERATORS``), and mutants inside
  annotations (never evaluated: every listed module has ``from __future__ import annotations``) are
  skipped; both are counted apart (``filtered``, ``annotation``), never as killed.

Usage: ``python tests/mutation/mutate.py [--module core/ledger.py ...] [--jobs 2] [--timeout-s 60]
[--mode fresh|resume|rerun-survivors]``
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The tests that cover each module, fastest and most targeted first (pytest -x stops at the first
# failure, so a mutant is usually killed in the first file; the stateful property test of the
# allocator, ~10 s, comes last).
MODULE_TESTS: dict[str, list[str]] = {
    "core/ledger.py": [
        "tests/unit/core/test_ledger_edges.py",
        "tests/unit/core/test_allocator_edges.py",
        "tests/unit/core/test_indexes.py",
        "tests/unit/core/test_allocator.py",
        "tests/unit/core/test_preemption.py",
        "tests/scenarios/test_scenarios.py",
        "tests/unit/core/test_properties.py",
    ],
    "core/allocator.py": [
        "tests/unit/core/test_allocator_edges.py",
        "tests/unit/core/test_preemption_edges.py",
        "tests/unit/core/test_allocator.py",
        "tests/unit/core/test_preemption.py",
        "tests/scenarios/test_scenarios.py",
        "tests/unit/core/test_properties.py",
    ],
    "core/preemption.py": [
        "tests/unit/core/test_preemption_edges.py",
        "tests/unit/core/test_preemption.py",
        "tests/unit/core/test_allocator.py",
        "tests/scenarios/test_scenarios.py",
        "tests/unit/core/test_properties.py",
    ],
    "core/watermarks.py": [
        "tests/unit/core/test_watermarks_edges.py",
        "tests/unit/core/test_watermarks.py",
        "tests/unit/core/test_controller.py",
    ],
    "core/admission.py": [
        "tests/unit/core/test_admission_edges.py",
        "tests/unit/core/test_admission.py",
        "tests/unit/core/test_admission_rule.py",
        "tests/unit/core/test_controller.py",
        "tests/unit/core/test_ticket_durability.py",
        "tests/unit/core/test_admission_properties.py",
    ],
    "core/controller.py": [
        "tests/unit/core/test_controller_edges.py",
        "tests/unit/core/test_kvlane.py",
        "tests/unit/core/test_controller.py",
        "tests/unit/core/test_kv_request_leases.py",
        "tests/unit/core/test_admission_rule.py",
        "tests/unit/core/test_ticket_durability.py",
        "tests/unit/core/test_admission.py",
        "tests/unit/core/test_watermarks.py",
        "tests/adapters/store/test_store_faults.py",
        "tests/adapters/store/test_store_faults_property.py",
        "tests/unit/core/test_admission_properties.py",
    ],
    "core/gpu_admin.py": [
        "tests/unit/core/test_gpu_admin_edges.py",
        "tests/unit/core/test_controller.py",
        "tests/unit/core/test_admission_rule.py",
        "tests/unit/core/test_admission_properties.py",
    ],
    "core/ticketbook.py": [
        "tests/unit/core/test_ticket_durability.py",
        "tests/unit/core/test_controller_edges.py",
        "tests/unit/core/test_controller.py",
        "tests/adapters/store/test_store_faults.py",
    ],
    "core/queuepump.py": [
        "tests/unit/core/test_sessions.py",
        "tests/unit/core/test_admission_properties.py",
        "tests/unit/core/test_controller.py",
    ],
    "core/kvbackends.py": [
        "tests/unit/core/test_kvlane.py",
        "tests/unit/core/test_kv_request_leases.py",
        "tests/unit/core/test_controller_edges.py",
    ],
    "core/kvlane.py": [
        "tests/unit/core/test_kvlane.py",
        "tests/unit/core/test_kv_request_leases.py",
        "tests/unit/core/test_controller_edges.py",
    ],
    "core/kvshares.py": ["tests/unit/core/test_kvshares.py"],
    "core/kvreplica.py": ["tests/unit/core/test_kvshares.py", "tests/unit/core/test_replica.py"],
    "core/replica.py": ["tests/unit/core/test_replica.py"],
    "adapters/store/sqlite.py": [
        "tests/adapters/store/test_sqlite_edges.py",
        "tests/contract/store/test_lease_store_contract.py",
        "tests/contract/store/test_ticket_store_contract.py",
        "tests/adapters/store/test_sqlite_damage.py",
        "tests/adapters/store/test_store_faults.py",
        "tests/contract/store/test_power_loss.py",
    ],
}

# Regular expressions (matched at the start of cosmic-ray's operator names; the filter drops a mutant
# whose operator matches). cosmic-ray replaces every binary, comparison and unary operator by every
# other one; most of those (``a - b`` -> ``a << b``, ``x <= y`` -> ``x is y``) die on the first
# assertion and would triple the run. Kept: one replacement per operator, the one that tests a
# boundary or a sign (``+``/``-``, ``*``/``//``//``/``, ``<``/``<=``, ``>``/``>=``, ``==``/``!=``,
# ``is``/``is not``, ``in``/``not in``, deleting ``not``/``-``/``~``, unary ``-``/``+``), as mutmut
# does, plus every other cosmic-ray operator (numbers, ``not`` added, ``and``/``or``, ``True``/
# ``False``, ``break``/``continue``, zero-iteration loops, exceptions, decorators).
EXCLUDED_OPERATORS = [
    r"core/ReplaceBinaryOperator_(?!(Add_Sub|Sub_Add|Mul_FloorDiv|FloorDiv_Mul|Div_Mul|Mul_Div"
    r"|Mod_FloorDiv|Pow_Mul)$)",
    r"core/ReplaceComparisonOperator_(?!(Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is"
    r"|In_NotIn|NotIn_In)$)",
    r"core/ReplaceUnaryOperator_(?!(Delete_\w+|USub_UAdd|UAdd_USub)$)",
]

COPIED = ["src", "tests", "pyproject.toml"]


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.egg-info")
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def _config(module: str, timeout_s: int) -> str:
    tests = " ".join(t for t in MODULE_TESTS[module] if (REPO / t).exists())
    # plugins off (PYTEST_DISABLE_PLUGIN_AUTOLOAD, set by run_module): importing hypothesis' pytest
    # plugin, anyio and xdist costs more CPU than most of these test files; cosmic-ray times out
    # hanging mutants itself, and ``@given`` tests run without the plugin.
    command = (
        f"{sys.executable} -m pytest -x -q -p no:cacheprovider -o addopts= --import-mode=importlib {tests}"
    )
    excluded = ", ".join(json.dumps(e) for e in EXCLUDED_OPERATORS)
    return (
        "[cosmic-ray]\n"
        f'module-path = "src/gpupool/{module}"\n'
        f"timeout = {float(timeout_s)}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
        "[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = [{excluded}]\n"
    )


def _tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _summary(session: Path) -> tuple[dict[str, int], list[str]]:
    con = sqlite3.connect(session)
    try:
        generated = con.execute("SELECT COUNT(*) FROM work_items").fetchone()[0]
        rows = con.execute(
            "SELECT r.worker_outcome, r.test_outcome, r.output, r.diff, s.operator_name, s.start_pos_row "
            "FROM work_results r JOIN mutation_specs s ON s.job_id = r.job_id"
        ).fetchall()
    finally:
        con.close()
    counts = dict.fromkeys(("filtered", "annotation", "killed", "survived", "timed_out", "other"), 0)
    counts["generated"] = generated
    survivors: list[str] = []
    for worker_raw, test_raw, output, diff, operator, row in rows:
        worker, test = str(worker_raw).lower(), str(test_raw).lower()
        if worker == "skipped":
            counts["annotation" if output == "annotation" else "filtered"] += 1
        elif test == "killed" and output == "timeout":
            counts["timed_out"] += 1
        elif test == "killed":
            counts["killed"] += 1
        elif test == "survived":
            counts["survived"] += 1
            survivors.append(f"## line {row}: {operator}\n{diff}\n")
        else:
            counts["other"] += 1
    counts["pending"] = generated - len(rows)
    return counts, survivors


def _forget_survivors(session: Path) -> None:
    con = sqlite3.connect(session)
    try:
        con.execute("DELETE FROM work_results WHERE lower(test_outcome) = 'survived'")
        con.commit()
    finally:
        con.close()


def _annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (row, col) of every annotation: never evaluated under ``from __future__ import
    annotations``, so a mutant there is equivalent by construction."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        found: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node.returns)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            found.append(node.annotation)
        for a in found:
            if a is not None and a.end_lineno is not None and a.end_col_offset is not None:
                spans.append(((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)))
    return spans


def _skip_annotations(session: Path, module_file: Path) -> None:
    source = module_file.read_text()
    if "from __future__ import annotations" not in source:
        return
    spans = _annotation_spans(source)
    con = sqlite3.connect(session)
    try:
        rows = con.execute(
            "SELECT job_id, start_pos_row, start_pos_col, end_pos_row, end_pos_col FROM mutation_specs"
        ).fetchall()
        for job_id, r0, c0, r1, c1 in rows:
            if any(a <= (r0, c0) and (r1, c1) <= b for a, b in spans):
                con.execute(
                    "INSERT OR REPLACE INTO work_results"
                    " (worker_outcome, output, test_outcome, diff, job_id) "
                    "VALUES ('SKIPPED', 'annotation', NULL, '', ?)",
                    (job_id,),
                )
        con.commit()
    finally:
        con.close()


def run_module(module: str, timeout_s: int, out: Path, mode: str) -> dict[str, int]:
    """Run one module's mutants in a scratch copy; return its counts and write its survivors.

    The session lives in ``out`` (``<module>.sqlite``), so an interrupted run keeps what it did.
    ``mode``: ``fresh`` starts a new session; ``resume`` runs what the last one left pending;
    ``rerun-survivors`` also runs its survivors again (killed mutants stay killed: the test
    selection only grows).
    """
    safe = module.replace("/", "_")
    session = out / f"{safe}.sqlite"
    with tempfile.TemporaryDirectory(prefix="gpupool-mutate-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        (work / "cr.toml").write_text(_config(module, timeout_s))
        env = dict(os.environ)
        env["PYTHONPATH"] = str(work / "src")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"

        def step(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, check=False)

        if mode == "fresh" or not session.exists():
            session.unlink(missing_ok=True)
            init = step(_tool("cosmic-ray"), "init", "cr.toml", str(session))
            if init.returncode != 0:
                raise SystemExit(f"{module}: cosmic-ray init failed:\n{init.stderr}")
            step(_tool("cr-filter-operators"), str(session), "cr.toml")
        elif mode == "rerun-survivors":
            _forget_survivors(session)
        _skip_annotations(session, work / "src" / "gpupool" / module)
        baseline = step(_tool("cosmic-ray"), "baseline", "cr.toml")
        if baseline.returncode != 0:
            raise SystemExit(f"{module}: the baseline (unmutated) test run fails:\n{baseline.stderr[-4000:]}")
        step(_tool("cosmic-ray"), "exec", "cr.toml", str(session))
    counts, survivors = _summary(session)
    (out / f"{safe}.json").write_text(json.dumps(counts, indent=2) + "\n")
    (out / f"{safe}.survivors.txt").write_text("".join(survivors))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", help="module under src/gpupool (default: all listed)")
    parser.add_argument("--jobs", type=int, default=2, help="modules run at the same time")
    parser.add_argument("--timeout-s", type=int, default=60, help="per-mutant test timeout in seconds")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "mutation")
    parser.add_argument(
        "--mode",
        choices=["fresh", "resume", "rerun-survivors"],
        default="fresh",
        help="fresh session; resume the last one; or resume and run its survivors again",
    )
    args = parser.parse_args(argv)
    modules = args.module or list(MODULE_TESTS)
    for module in modules:
        if module not in MODULE_TESTS:
            print(f"--module: {module!r} is not one of {sorted(MODULE_TESTS)}", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, int]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_module, m, args.timeout_s, args.out, args.mode): m for m in modules}
        for future in concurrent.futures.as_completed(futures):
            module = futures[future]
            results[module] = future.result()
            c = results[module]
            tested = c["killed"] + c["survived"] + c["timed_out"]
            score = 100.0 * (c["killed"] + c["timed_out"]) / tested if tested else 0.0
            print(
                f"{module}: generated {c['generated']}, filtered {c['filtered']}, "
                f"annotation {c['annotation']}, "
                f"killed {c['killed']}, survived {c['survived']}, timed out {c['timed_out']}, "
                f"other {c['other']}, pending {c['pending']}; score {score:.1f} %",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
