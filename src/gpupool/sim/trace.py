"""Loaders for the Alibaba GPU-sharing trace (``cluster-trace-gpu-v2023``, the FGD paper's "openb" trace).

Role: turn the node list (``sn,cpu_milli,memory_mib,gpu,model``) and a pod list
(``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]``) into frozen values. Only the columns
the FGD experiment uses are read; time columns, ``qos`` and ``pod_phase`` are ignored.

Invariants (a row that breaks one raises `TraceFormatError` naming file, line, column and value):
- integers are non-negative (CPU and memory at most `MAX_QUANTITY`); a node has
  0..`MAX_GPUS_PER_NODE` GPUs and a GPU node names its model;
- a pod with ``num_gpu == 0`` asks for ``gpu_milli == 0``; with ``num_gpu == 1`` for 1..1000;
  with ``num_gpu > 1`` for exactly 1000 (multi-GPU tasks take whole cards);
- ``gpu_spec`` is a ``|``-separated set of allowed models; empty means any model. Repeated names
  collapse (the trace has strings like ``V100M16|V100M32|V100M32``), so the key is the sorted set.
- names are unique within a file.
- a line of white space only is skipped like an empty line (which `csv.DictReader` skips): every
  value is read stripped, so such a line holds no data; a line number in a message is still the
  file's line.
"""

from __future__ import annotations

import csv
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MILLI_PER_GPU = 1000
MAX_GPUS_PER_NODE = 8
MAX_QUANTITY = 2**40
"""Largest CPU (milli) or memory (MiB) of a node or pod: far beyond any machine, and small enough
that the simulator's int64 arrays hold every sum and difference of them."""

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceFormatError(ValueError):
    """A malformed trace file or row. The message names the file, line, column and value."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    """Per-GPU share in thousandths of a GPU (1000 = a whole card)."""
    gpu_spec: frozenset[str] = frozenset()
    """Allowed GPU models; empty = any."""

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def spec_key(self) -> str:
        return "|".join(sorted(self.gpu_spec))

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def check_trace_file(path: Path) -> None:
    """`FileNotFoundError` when ``path`` does not exist; `TraceFormatError` saying what it is when it
    is not a regular file (``/dev/null``, a directory: they exist, so "not found" would mislead)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"trace file not found: {path}") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    raise TraceFormatError(f"{path}: {kind}, not a regular file (expected a CSV trace)")


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    check_trace_file(path)
    # utf-8-sig: a list saved by a spreadsheet starts with a byte-order mark, which is no column name
    with path.open(newline="", encoding="utf-8-sig") as fh:
        try:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise TraceFormatError(f"{path}: header lacks column(s) {missing}; got {header}")
            for row in reader:
                # the file's line (where the row ends), not the row's index: DictReader skips blank
                # lines and a quoted field may hold a line break
                lineno = reader.line_num
                extra = row.pop(None, None)  # DictReader's restkey: fields past the header
                short = sum(v is None for v in row.values())
                if not extra and short == len(row) - 1 and not (row[header[0]] or "").strip():
                    continue  # white space only: no data, skipped as csv skips an empty line
                if extra or short:
                    got = len(header) + len(extra or ()) - short
                    raise TraceFormatError(f"{path}:{lineno}: {got} field(s), the header has {len(header)}")
                yield lineno, row
        except UnicodeDecodeError as exc:
            raise TraceFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except csv.Error as exc:
            raise TraceFormatError(f"{path}:{reader.line_num}: {exc}") from None


def _int(
    path: Path, lineno: int, row: dict[str, str], col: str, *, lo: int = 0, hi: int | None = None
) -> int:
    raw = row.get(col)
    text = "" if raw is None else raw.strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(f"{path}:{lineno}: column {col}={raw!r} is not an integer") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise TraceFormatError(f"{path}:{lineno}: column {col}={value} out of range {bound}")
    return value


def _name(path: Path, lineno: int, row: dict[str, str], col: str, seen: set[str]) -> str:
    name = (row.get(col) or "").strip()
    if not name:
        raise TraceFormatError(f"{path}:{lineno}: column {col} is empty")
    if name in seen:
        raise TraceFormatError(f"{path}:{lineno}: column {col}={name!r} repeats an earlier row")
    seen.add(name)
    return name


def load_nodes(path: str | Path) -> tuple[NodeSpec, ...]:
    """Read a node list. Raises `TraceFormatError` on the first malformed row."""
    p = Path(path)
    seen: set[str] = set()
    out = []
    for lineno, row in _rows(p, NODE_COLUMNS):
        name = _name(p, lineno, row, "sn", seen)
        cpu = _int(p, lineno, row, "cpu_milli", hi=MAX_QUANTITY)
        mem = _int(p, lineno, row, "memory_mib", hi=MAX_QUANTITY)
        gpus = _int(p, lineno, row, "gpu", hi=MAX_GPUS_PER_NODE)
        model = (row.get("model") or "").strip()
        if gpus > 0 and not model:
            raise TraceFormatError(f"{p}:{lineno}: column model is empty for a node with {gpus} GPU(s)")
        out.append(NodeSpec(name=name, cpu_milli=cpu, memory_mib=mem, gpu_count=gpus, gpu_model=model))
    if not out:
        raise TraceFormatError(f"{p}: no node rows")
    return tuple(out)


def load_pods(path: str | Path) -> tuple[PodSpec, ...]:
    """Read a pod list. Raises `TraceFormatError` on the first malformed row."""
    p = Path(path)
    seen: set[str] = set()
    out = []
    for lineno, row in _rows(p, POD_COLUMNS):
        name = _name(p, lineno, row, "name", seen)
        cpu = _int(p, lineno, row, "cpu_milli", hi=MAX_QUANTITY)
        mem = _int(p, lineno, row, "memory_mib", hi=MAX_QUANTITY)
        num = _int(p, lineno, row, "num_gpu", hi=MAX_GPUS_PER_NODE)
        milli = _int(p, lineno, row, "gpu_milli", hi=MILLI_PER_GPU)
        if num == 0 and milli != 0:
            raise TraceFormatError(f"{p}:{lineno}: column gpu_milli={milli} but num_gpu=0 (must be 0)")
        if num == 1 and milli == 0:
            raise TraceFormatError(f"{p}:{lineno}: column gpu_milli=0 but num_gpu=1 (must be 1..1000)")
        if num > 1 and milli != MILLI_PER_GPU:
            raise TraceFormatError(
                f"{p}:{lineno}: column gpu_milli={milli} but num_gpu={num} (multi-GPU tasks take 1000)"
            )
        spec = frozenset(s.strip() for s in (row.get("gpu_spec") or "").split("|") if s.strip())
        out.append(
            PodSpec(name=name, cpu_milli=cpu, memory_mib=mem, num_gpu=num, gpu_milli=milli, gpu_spec=spec)
        )
    if not out:
        raise TraceFormatError(f"{p}: no pod rows")
    return tuple(out)


def require_gpu_work(
    nodes: Iterable[NodeSpec], pods: Iterable[PodSpec], *, nodes_path: str | Path, pods_path: str | Path
) -> None:
    """The FGD experiment fills the GPU capacity with GPU pods: refuse (`TraceFormatError`, naming
    the file) a node list without a GPU node or a pod list without a GPU pod."""
    if not any(n.gpu_count for n in nodes):
        raise TraceFormatError(f"{nodes_path}: no node has a GPU (the experiment fills the GPU capacity)")
    if not any(p.num_gpu for p in pods):
        raise TraceFormatError(f"{pods_path}: no pod asks for a GPU (nothing fills the GPU capacity)")


def gpu_capacity_milli(nodes: Iterable[NodeSpec]) -> int:
    return sum(n.gpu_count for n in nodes) * MILLI_PER_GPU


def data_dir(repo_root: str | Path) -> Path:
    """``../shared/data`` next to the repository, or ``$GPUPOOL_DATA_DIR`` when set."""
    import os

    env = os.environ.get("GPUPOOL_DATA_DIR")
    if env:
        return Path(env)
    return Path(repo_root).resolve().parent / "shared" / "data"


def workload_name(pods_path: str | Path) -> str:
    """``openb_pod_list_default.csv`` -> ``default``; other names keep their stem."""
    stem = Path(pods_path).stem
    prefix = "openb_pod_list_"
    return stem[len(prefix) :] if stem.startswith(prefix) else stem
