"""The core and hardware layers import only the standard library and gpupool itself.

import-linter enforces the same in `make lint`; this test keeps the rule inside `make test` too and
also catches imports hidden inside functions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "gpupool"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", ["core", "hardware"])
def test_layer_imports_only_stdlib(layer: str) -> None:
    bad = {}
    for path in sorted((SRC / layer).rglob("*.py")):
        extra = {n for n in _imports(path) if n not in sys.stdlib_module_names and n != "gpupool"}
        if extra:
            bad[str(path.relative_to(SRC))] = sorted(extra)
    assert bad == {}
