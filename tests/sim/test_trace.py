"""Trace loaders: good files load; malformed rows fail with file, line, column and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.trace import TraceFormatError, load_nodes, load_pods, workload_name

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_loads_nodes_and_pods(tmp_path: Path) -> None:
    nodes = load_nodes(
        write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nx,8000,1024,2,T4\ny,4000,512,0,\n")
    )
    assert [(n.name, n.gpu_count, n.gpu_model) for n in nodes] == [("x", 2, "T4"), ("y", 0, "")]
    pods = load_pods(
        write(tmp_path, "p.csv", POD_HEADER + "a,1000,10,1,300,V100M32|V100M16|V100M32,LS\nb,500,0,0,0,,BE\n")
    )
    assert pods[0].gpu_spec == frozenset({"V100M16", "V100M32"})
    assert pods[0].spec_key == "V100M16|V100M32"
    assert pods[0].is_sharing and pods[1].total_gpu_milli == 0


def test_five_column_pod_lists_load(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,8,1000\n"))
    assert pods[0].total_gpu_milli == 8000 and pods[0].gpu_spec == frozenset()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,1x,10,1,300,,LS", "line 2: column cpu_milli='1x' is not an integer"),
        ("a,100,-5,1,300,,LS", "column memory_mib=-5 out of range"),
        ("a,100,5,0,300,,LS", "gpu_milli=300 but num_gpu=0"),
        ("a,100,5,1,0,,LS", "gpu_milli=0 but num_gpu=1"),
        ("a,100,5,2,500,,LS", "gpu_milli=500 but num_gpu=2"),
        ("a,100,5,1,1001,,LS", "gpu_milli=1001 out of range"),
        ("a,100,5,9,1000,,LS", "num_gpu=9 out of range"),
        (",100,5,1,100,,LS", "column name is empty"),
        ("a,100,5,1", "line 2: 4 field(s), the header has 7"),
        ("a,100,5,1,300,,LS,extra,more", "line 2: 9 field(s), the header has 7"),
    ],
)
def test_malformed_pod_rows(tmp_path: Path, row: str, message: str) -> None:
    p = write(tmp_path, "p.csv", POD_HEADER + row + "\n")
    with pytest.raises(TraceFormatError) as err:
        load_pods(p)
    assert message.replace("line 2", f"{p}:2") in str(err.value) or message in str(err.value)
    assert str(p) in str(err.value)


def test_malformed_node_rows_and_headers(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="model is empty"):
        load_nodes(write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nx,8000,1024,2,\n"))
    with pytest.raises(TraceFormatError, match="repeats an earlier row"):
        load_nodes(write(tmp_path, "m.csv", "sn,cpu_milli,memory_mib,gpu,model\nx,1,1,1,T4\nx,1,1,1,T4\n"))
    with pytest.raises(TraceFormatError, match=r"header lacks column\(s\) \['gpu_milli'\]"):
        load_pods(write(tmp_path, "h.csv", "name,cpu_milli,memory_mib,num_gpu\na,1,1,1\n"))
    with pytest.raises(FileNotFoundError):
        load_pods(tmp_path / "absent.csv")


def test_a_byte_order_mark_is_no_part_of_the_header_and_other_encodings_are_named(tmp_path: Path) -> None:
    """A list saved by a spreadsheet starts with a UTF-8 byte-order mark: it loads as without one.
    A file that is not UTF-8 is one `TraceFormatError`, not a decoding traceback."""
    text = POD_HEADER + "a,1000,10,1,300,,LS\n"
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_pods(bom) == load_pods(write(tmp_path, "plain.csv", text))
    latin = tmp_path / "latin.csv"
    latin.write_bytes((POD_HEADER + "caf\xe9,1000,10,1,300,,LS\n").encode("latin-1"))
    with pytest.raises(TraceFormatError, match="not UTF-8 text"):
        load_pods(latin)


def test_workload_name() -> None:
    assert workload_name("x/openb_pod_list_gpuspec20.csv") == "gpuspec20"
    assert workload_name("mine.csv") == "mine"


def test_line_numbers_count_blank_lines_and_line_breaks_inside_quoted_fields(tmp_path: Path) -> None:
    """The line an error names is the file's line (an editor's), not the row's index: blank lines
    and a quoted name that spans two lines come before the bad value."""
    pods = write(tmp_path, "p.csv", POD_HEADER + "\n\na,1000,10,1,300,,LS\n\n" + '"b\nc",1000,10,1,300,,LS\n')
    with open(pods, "a") as fh:
        fh.write("d,1x,10,1,300,,LS\n")
    with pytest.raises(TraceFormatError, match=rf"{pods}:8: column cpu_milli='1x'"):
        load_pods(pods)
    nodes = write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\n\nx,8000,1024,2,T4\n\ny,1,1,2,\n")
    with pytest.raises(TraceFormatError, match=rf"{nodes}:5: column model is empty"):
        load_nodes(nodes)


def test_a_line_of_white_space_only_is_skipped_like_an_empty_line(tmp_path: Path) -> None:
    """An empty line is skipped (the csv module's rule); a line of spaces (an editor's trailing line,
    a spreadsheet's padding) was '1 field(s), the header has 7', naming neither column nor value.
    Values are read stripped, so it holds no data either: it is skipped too, and the line numbers
    after it stay the file's."""
    text = POD_HEADER + "a,1000,10,1,300,,LS\n   \n\t \nb,500,0,0,0,,BE\n  \n"
    pods = load_pods(write(tmp_path, "p.csv", text))
    assert [p.name for p in pods] == ["a", "b"]
    nodes = load_nodes(write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\n \nx,8000,1024,2,T4\n"))
    assert [n.name for n in nodes] == ["x"]
    bad = write(tmp_path, "q.csv", POD_HEADER + "   \n" + "a,1x,10,1,300,,LS\n")
    with pytest.raises(TraceFormatError, match=rf"{bad}:3: column cpu_milli='1x'"):
        load_pods(bad)
    with pytest.raises(TraceFormatError, match="no pod rows"):
        load_pods(write(tmp_path, "blank.csv", POD_HEADER + "   \n \n"))
    with pytest.raises(TraceFormatError, match="2 field"):  # white space beside a comma is a row
        load_pods(write(tmp_path, "comma.csv", POD_HEADER + "  ,  \n"))
