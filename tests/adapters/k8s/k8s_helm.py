"""A tiny renderer for the gpupool chart: the templates use only ``{{ .Values.a.b }}``,
``{{ .Values.a.b | quote }}`` and, on lines of their own, ``{{- if [not] .Values.a.b }}`` /
``{{- end }}`` (helm is not installed here). Anything else in ``{{ }}`` is an error, so the chart
cannot silently grow template logic this renderer does not understand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

_EXPR = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
_VALUE = re.compile(r"^\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\s*\|\s*quote)?$")
_IF = re.compile(r"^\{\{-?\s*if\s+(not\s+)?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*-?\}\}$")
_END = re.compile(r"^\{\{-?\s*end\s*-?\}\}$")


def _lookup(values: dict[str, Any], path: str) -> Any:
    cur: Any = values
    for key in path.strip(".").split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise KeyError(f"no value .Values{path}")
        cur = cur[key]
    return cur


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise TypeError(f"only scalars can be substituted, got {value!r}")


def render(text: str, values: dict[str, Any]) -> str:
    def sub(m: re.Match[str]) -> str:
        v = _VALUE.match(m.group(1))
        if v is None:
            raise ValueError(f"unsupported template expression {m.group(0)!r}")
        value = _scalar(_lookup(values, v.group(1)))
        return json.dumps(value) if v.group(2) else value

    out: list[str] = []
    shown: list[bool] = []
    for line in text.splitlines(keepends=True):
        cond = _IF.match(line.strip())
        if cond is not None:
            shown.append(bool(_lookup(values, cond.group(2))) != bool(cond.group(1)))
            continue
        if _END.match(line.strip()):
            shown.pop()
            continue
        if all(shown):
            out.append(_EXPR.sub(sub, line))
    if shown:
        raise ValueError("an if without its end")
    return "".join(out)


def render_chart(
    chart: Path, overrides: dict[str, Any] | None = None, *, pattern: str = "*.yaml"
) -> dict[str, str]:
    """Template path (relative to templates/) -> rendered text; ``pattern`` "**/*.yaml" takes the
    sub-folders too (monitoring/, ha/), the default only the plain-manifest set."""
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for k, v in (overrides or {}).items():
        values[k] = v
    root = chart / "templates"
    return {str(p.relative_to(root)): render(p.read_text(), values) for p in sorted(root.glob(pattern))}
