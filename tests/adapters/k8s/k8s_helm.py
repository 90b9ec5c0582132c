"""A tiny renderer for the gpupool chart: the templates use only ``{{ .Values.a.b }}`` and
``{{ .Values.a.b | quote }}`` (helm is not installed here). Anything else in ``{{ }}`` is an error,
so the chart cannot silently grow template logic this renderer does not understand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

_EXPR = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
_VALUE = re.compile(r"^\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\s*\|\s*quote)?$")


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

    return _EXPR.sub(sub, text)


def render_chart(chart: Path, overrides: dict[str, Any] | None = None) -> dict[str, str]:
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for k, v in (overrides or {}).items():
        values[k] = v
    return {p.name: render(p.read_text(), values) for p in sorted((chart / "templates").glob("*.yaml"))}
