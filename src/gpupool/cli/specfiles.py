"""YAML spec files for the CLI (``gpupool plan``, ``gpupool serve``): read, parse, validate.

Role: the only place that turns a cluster / workload YAML file into hardware spec values. Every failure is
a one-line ``UserError`` or ``SpecError`` naming the file (and key/value where there is one), which
``gpupool.cli.errors.user_errors`` prints and exits with code 2.

Public API: ``load_yaml(path)``, ``load_cluster_file(path)``, ``load_workload_file(path)``,
``load_specs(cluster_path, workloads_path)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from gpupool.cli.errors import UserError
from gpupool.hardware.spec import ClusterSpec, WorkloadSet, load_cluster_spec, load_workload_spec


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping (YAML says keys are unique;
    PyYAML keeps the last one silently, so a second ``timezone:`` or ``count:`` overrode the first
    unseen). Keys brought in by a merge (``<<: *anchor``) may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class names it
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (first at line {first + 1})", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> object:
    """Parse one YAML document; raise ``UserError`` naming the file (and line/column) on failure.

    An empty file (or one with only comments) is an error too: no spec file may be empty."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{p}: is a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: cannot read: {exc}") from None
    try:
        doc = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise UserError(f"{p}: malformed YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{p}: malformed YAML: {' '.join(str(exc).split())}") from None
    if doc is None:
        raise UserError(f"{p}: empty file (no YAML document in it)")
    return doc


def load_cluster_file(path: str | Path) -> ClusterSpec:
    return load_cluster_spec(load_yaml(path), source=str(path))


def load_workload_file(path: str | Path) -> WorkloadSet:
    """Relative config.json model paths resolve against the workload file's directory."""
    p = Path(path)
    return load_workload_spec(load_yaml(p), source=str(p), base_dir=p.parent)


def load_specs(cluster_path: str | Path, workloads_path: str | Path) -> tuple[ClusterSpec, WorkloadSet]:
    return load_cluster_file(cluster_path), load_workload_file(workloads_path)


def spec_option(default: Path, flag: str, what: str) -> Any:
    """A ``--cluster`` / ``--workloads`` option whose default is a bundled example: ``--help`` names
    it by its place in the project, not by the absolute path of wherever the package is installed."""
    shown = f"the bundled examples/{default.name}"
    return typer.Option(default, flag, help=f"{what} spec YAML.", show_default=shown)
