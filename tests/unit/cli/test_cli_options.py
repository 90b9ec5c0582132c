"""Bad numeric options and empty spec files, as a user types them: real subprocesses of the CLI.

Each is exit code 2 with one line naming the option (or the file) and the value, before anything
starts: no data directory is created, no port is bound, nothing runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CLUSTER = str(EXAMPLES / "cluster-a100-l40s.yaml")
WORKLOADS = str(EXAMPLES / "workloads-agent-platform.yaml")


def gpupool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=cwd,
    )


def assert_one_line_exit_2(out: subprocess.CompletedProcess[str], want: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout[-500:], out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupool: error: "), out.stderr
    assert want in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["run", "--port", "70000"], "invalid --port=70000: must be in [0, 65535]"),
        (["run", "--port", "-1"], "invalid --port=-1: must be in [0, 65535]"),
        (["run", "--tidal-speed", "-5"], "invalid --tidal-speed=-5.0: must be >= 0"),
        (["run", "--tidal-speed", "inf"], "invalid --tidal-speed=inf"),
        (["serve", "--port", "70000"], "invalid --port=70000: must be in [0, 65535]"),
        (["serve", "--port", "-1"], "invalid --port=-1"),
    ],
)
def test_gateway_commands_check_their_options_before_starting(
    tmp_path: Path, args: list[str], want: str
) -> None:
    data = tmp_path / "data"
    assert_one_line_exit_2(gpupool(*args, "--data-dir", str(data)), want)
    assert not data.exists()  # nothing started: no store, no token


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["emulate-backend", "--model", "qwen2.5-0.5b", "--port", "70000"], "invalid --port=70000"),
        (
            ["emulate-backend", "--model", "qwen2.5-0.5b", "--port", "0", "--speed", "-1"],
            "invalid --speed=-1.0",
        ),
        (["sim", "fgd", "--pods", "p.csv", "--nodes", "n.csv", "--seeds", "-1"], "invalid --seeds='-1'"),
        (["sim", "fgd", "--pods", "p.csv", "--nodes", "n.csv", "--seeds", "4294967296"], "--seeds"),
        (["sim", "report", "--workers", "0"], "invalid --workers=0: must be in [1, 1024]"),
        (["sim", "tidal", "--days", "0"], "invalid --days=0: must be in [1, 366]"),
        (["sim", "tidal", "--scale", "-1"], "invalid --scale=-1.0: must be in (0, 10]"),
        (["sim", "tidal", "--backlog-scale", "nan"], "invalid --backlog-scale=nan"),
        (["agent", "--node", "n", "--metrics-port", "-1", "--duration-s", "-3"], "invalid --duration-s=-3.0"),
        (["bench", "gateway", "--clients", "0"], "invalid --clients=0: must be >= 1"),
        (["bench", "gateway", "--duration-s", "0"], "invalid --duration-s=0.0: must be > 0"),
        (["bench", "proxy-peers", "--duration-s", "inf"], "invalid --duration-s=inf: must be > 0"),
        (["bench", "proxy-peers", "--warmup-s", "inf"], "invalid --warmup-s=inf: must be >= 0"),
        (
            ["device-plugin", "--node", "n", "--no-kube", "--cluster", CLUSTER, "--verify-s", "0"],
            "invalid --verify-s=0.0: must be > 0",
        ),
        (
            ["device-plugin", "--node", "n", "--no-kube", "--cluster", CLUSTER, "--mps-pipe-dir", "rel"],
            "invalid --mps-pipe-dir='rel': must be an absolute directory",
        ),
    ],
)
def test_numeric_options_name_the_option_and_the_value(args: list[str], want: str) -> None:
    assert_one_line_exit_2(gpupool(*args), want)


def test_an_empty_yaml_file_says_so_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "cluster.yaml"
    empty.write_text("# nothing here yet\n")
    out = gpupool("plan", "--cluster", str(empty), "--workloads", WORKLOADS)
    assert_one_line_exit_2(out, f"{empty}: empty file")
    empty.write_text("")
    out = gpupool("serve", "--cluster", str(empty), "--data-dir", str(tmp_path / "d"), "--port", "0")
    assert_one_line_exit_2(out, f"{empty}: empty file")


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["plan", "-w", WORKLOADS, "--cluster", "typo\nname.yaml"], "typo\\nname.yaml: no such file"),
        (["emulate-backend", "--model", "m", "--host", "bad\nhost"], "cannot listen on bad\\nhost:"),
    ],
)
def test_a_value_with_a_line_break_is_still_one_line(args: list[str], want: str) -> None:
    """An error quoting a value as typed (a file name, a host) escapes its line breaks: one line."""
    assert_one_line_exit_2(gpupool(*args), want)


def test_every_port_option_is_checked() -> None:
    """Every ``--*port*`` option of every command refuses 70000 with a line naming it."""
    import typer.main

    from gpupool.cli.main import app

    found: list[tuple[str, str]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)  # NOTE: a group (typer ships its own click classes)
        if subs is not None:
            for name, sub in subs.items():
                walk(sub, [*path, name])
            return
        for p in cmd.params:
            for opt in p.opts:
                if "port" in opt and opt.startswith("--") and "socket" not in opt:
                    found.append((" ".join(path), opt))

    walk(typer.main.get_command(app), [])
    assert ("run", "--port") in found and ("extender", "--port") in found
    extra = {"extender": ["--cluster", CLUSTER, "--no-kube"], "agent": ["--node", "n"]}
    extra["emulate-backend"] = ["--model", "qwen2.5-0.5b"]
    extra["proxy"] = [
        "--leader",
        "http://127.0.0.1:9",
        "--auth-file",
        "none.yaml",
        "--leader-token",
        "t" * 12,
    ]
    for command, opt in found:
        out = gpupool(*command.split(), *extra.get(command, []), opt, "70000")
        assert_one_line_exit_2(out, f"invalid {opt}=70000")


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--no-kube", "--kube-api", "http://127.0.0.1:1"], "--no-kube excludes --kube-api"),
        (["--kube-api", "ftp://api"], "invalid --kube-api='ftp://api'"),
        (["--no-kube", "--extender-port", "-3"], "invalid --extender-port=-3"),
    ],
)
def test_serve_kubernetes_bad_options_exit_2_before_anything_opens(
    args: list[str], want: str, tmp_path: Any
) -> None:
    out = gpupool("serve", "--kubernetes", "--data-dir", str(tmp_path / "data"), *args)
    assert_one_line_exit_2(out, want)
    assert not (tmp_path / "data").exists(), "the store was opened before the options were checked"


URL_OPTIONS = [
    ["agent", "--node", "n", "--token", "t", "--metrics-port", "-1", "--gateway"],
    ["agent", "--node", "n", "--metrics-port", "-1", "--kube", "--kube-api"],
    ["doctor", "--devices", "simulated", "--gateway"],
    ["doctor", "--devices", "simulated", "--kube", "--kube-api"],
    ["proxy", "--auth-file", "none.yaml", "--leader-token", "t" * 12, "--leader"],
    ["batch", "list", "--token", "t", "--url"],
    ["extender", "--cluster", CLUSTER, "--port", "0", "--kube-api"],
    ["device-plugin", "--node", "n", "--cluster", CLUSTER, "--plugin-dir", ".", "--kube-api"],
]


@pytest.mark.parametrize("command", URL_OPTIONS, ids=lambda c: f"{c[0]} {c[-1]}")
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:abc", "Port could not be cast to integer value as 'abc'"),
        ("http://127.0.0.1:99999", "Port out of range 0-65535"),
        ("http://[::1", "Invalid IPv6 URL"),
    ],
)
def test_url_options_with_a_bad_port_or_host_exit_2_naming_the_option(
    command: list[str], url: str, why: str
) -> None:
    """A URL whose port or host cannot be parsed is refused at start (it was an HTTP client's
    traceback, or a loop retrying it forever)."""
    assert_one_line_exit_2(gpupool(*command, url), f"invalid {command[-1]}={url!r}: {why}")


def test_agent_metrics_port_in_use_or_foreign_host_is_exit_2_naming_the_option() -> None:
    """dcgm-exporter already on 9400 (the agent's default), or an address not on this host: one line
    naming the option (it was an OSError traceback, after the agent's threads had started)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = gpupool("agent", "--node", "n", "--metrics-port", str(port), "--duration-s", "1")
        assert_one_line_exit_2(out, f"invalid --metrics-port={port}: cannot listen on 127.0.0.1:{port}")
    out = gpupool("agent", "--node", "n", "--metrics-host", "192.0.2.1", "--metrics-port", "0")
    assert_one_line_exit_2(out, "invalid --metrics-host='192.0.2.1': cannot listen on 192.0.2.1:0")


@pytest.mark.parametrize(
    ("endpoint", "want"),
    [
        ("a/b", "invalid --endpoint='a/b': must be a file name in --plugin-dir"),  # was a traceback
        ("../gpupool.sock", "invalid --endpoint='../gpupool.sock'"),  # served outside --plugin-dir
        ("kubelet.sock", "invalid --endpoint='kubelet.sock': kubelet's own socket"),  # was deleted
    ],
)
def test_device_plugin_endpoint_is_a_file_name_in_the_plugin_dir(
    tmp_path: Path, endpoint: str, want: str
) -> None:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    kubelet = plugin_dir / "kubelet.sock"
    kubelet.write_text("")  # stands for kubelet's registration socket
    args = [
        "device-plugin",
        "--node",
        "gpu-a",
        "--no-kube",
        "--cluster",
        CLUSTER,
        "--plugin-dir",
        str(plugin_dir),
    ]
    assert_one_line_exit_2(gpupool(*args, "--endpoint", endpoint), want)
    assert kubelet.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["plugins"]


@pytest.mark.parametrize("domain", ["", "a b", "Gpupool.IO", "-x.io", "x.io/", "a" * 254])
@pytest.mark.parametrize(
    "command",
    [
        ["extender", "--cluster", CLUSTER, "--port", "0"],
        ["device-plugin", "--node", "n", "--no-kube", "--cluster", CLUSTER],
        ["agent", "--node", "n", "--metrics-port", "-1", "--duration-s", "0.1"],
        ["serve", "--port", "0", "--kubernetes", "--no-kube"],
    ],
    ids=["extender", "device-plugin", "agent", "serve"],
)
def test_a_domain_that_kubernetes_would_refuse_is_exit_2_naming_it(command: list[str], domain: str) -> None:
    """``--domain`` prefixes extended resource and annotation names (``<domain>/gpu``): kubelet or the
    API server would refuse a bad one only later, far from the option."""
    assert_one_line_exit_2(gpupool(*command, "--domain", domain), "invalid --domain=")


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["serve", "--port", "abc"], "invalid --port='abc': "),
        (["serve", "--port=abc"], "invalid --port='abc': "),
        (
            ["plan", "-c", CLUSTER, "-w", WORKLOADS, "-f", "bogus"],
            "invalid --format='bogus': 'bogus' is not one of",
        ),
        (["sim", "variants"], "sim variants: Missing option '--out' (see --help)"),
        (["serve", "--no-such-option"], "serve: No such option: --no-such-option"),
        (["demo", "extra"], "demo: Got unexpected extra argument"),
    ],
)
def test_what_the_parser_refuses_is_one_line_and_exit_2(args: list[str], want: str) -> None:
    """Errors found while parsing the command line (wrong type, not a choice, unknown or missing
    option) read like the commands' own checks: one line naming the option and the value."""
    assert_one_line_exit_2(gpupool(*args), want)


def test_no_arguments_still_prints_the_help() -> None:
    out = gpupool("sim")
    assert (
        out.returncode == 2 and "Usage:" in out.stdout + out.stderr and "variants" in out.stdout + out.stderr
    )


TOKEN_OPTIONS = [
    ["proxy", "--leader", "http://127.0.0.1:9", "--auth-file", "none.yaml", "--port", "0", "--leader-token"],
    ["agent", "--node", "n", "--gateway", "http://127.0.0.1:9", "--metrics-port", "-1", "--token"],
    ["batch", "list", "--url", "http://127.0.0.1:9", "--token"],
    ["batch", "submit", "--vram-mib", "1024", "--url", "http://127.0.0.1:9", "--token"],
]


@pytest.mark.parametrize("command", TOKEN_OPTIONS, ids=lambda c: f"{c[0]} {c[-1]}")
@pytest.mark.parametrize("token", ["t\u00f6ken-of-the-leader", "token with spaces", "token\nsecond-line"])
def test_a_token_no_http_header_can_carry_is_exit_2_naming_the_option(command: list[str], token: str) -> None:
    """A bearer token travels in an HTTP header: one with a character outside visible ASCII can never
    be sent (it was a traceback, or a loop failing every call), so it is refused at start; the line
    names the option but does not echo the secret."""
    tail = ["--", "true"] if command[:2] == ["batch", "submit"] else []
    out = gpupool(*command, token, *tail)
    assert_one_line_exit_2(out, f"invalid {command[-1]}: ")
    assert "leader" not in out.stderr.replace("--leader-token", "")
    assert "spaces" in out.stderr or "ASCII" in out.stderr


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["sim", "tidal", "--main-model", "x"], "invalid --main-model='x': expected one of ['14b', '7b']"),
        (["sim", "tidal", "--lending-target", "0"], "invalid --lending-target=0.0: must be in (0, 1]"),
        (["extender", "--policy", "x", "--port", "0"], "invalid --policy='x': known policies: bestfit"),
        (
            ["extender", "--no-kube", "--cluster", CLUSTER, "--host", "\u00fc\u2603", "--port", "0"],
            "--host/--port: cannot listen on \u00fc\u2603:0: ",
        ),
        (["extender", "--log-level", "", "--port", "0"], "invalid --log-level='': expected debug, info"),
        (
            ["device-plugin", "--node", "n", "--no-kube", "--cluster", CLUSTER, "--log-level", ""],
            "invalid --log-level='': expected debug, info, warning or error",
        ),
    ],
)
def test_errors_name_the_option_not_the_field_behind_it(args: list[str], want: str) -> None:
    """A value the core or `logging` refuses is named by the option the user typed (it was
    ``invalid main_model='x'``, ``invalid policy='x'``, ``Unknown level: ''``)."""
    assert_one_line_exit_2(gpupool(*args), want)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["sim", "fgd", "--pods", "{dir}", "--nodes", "/dev/null"], "/dev/null: a character device, not a"),
        (["sim", "fgd", "--nodes", "{dir}", "--pods", "{dir}"], "{dir}: a directory, not a regular file"),
        (["sim", "variants", "--pods", "/dev/null", "--out", "{dir}"], "/dev/null: a character device"),
    ],
)
def test_a_trace_path_that_exists_but_is_no_file_says_what_it_is(
    tmp_path: Path, args: list[str], want: str
) -> None:
    """It said ``trace file not found: /dev/null``, of a path that exists."""
    out = gpupool(*(a.format(dir=tmp_path) for a in args))
    assert_one_line_exit_2(out, want.format(dir=tmp_path))
    assert "not found" not in out.stderr


@pytest.mark.parametrize("command", ["serve", "run"])
@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("directory", "cannot read it: Is a directory"),
        ("empty", "empty (delete it to have a new admin token generated)"),
    ],
)
def test_a_damaged_admin_token_file_is_one_line_naming_it(
    tmp_path: Path, command: str, damage: str, why: str
) -> None:
    """A directory in its place was a traceback; an empty file was ``tokens: invalid tokens[0]``."""
    data = tmp_path / "data"
    data.mkdir()
    token = data / "admin.token"
    if damage == "directory":
        token.mkdir()
    else:
        token.write_text("\n")
    out = gpupool(command, "--no-traffic" if command == "run" else "--no-tidal", "--port", "0",
                  "--data-dir", str(data))  # fmt: skip
    assert_one_line_exit_2(out, f"invalid --data-dir={str(data)!r}: {token}: {why}")
    assert not (data / "leases.db").exists()  # no store opened
    assert not (data / "batch.db").exists()  # the batch queue this start opened first is removed


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--no-traffic", "--no-agents", "--port", "0"],
        ["run", "--no-traffic", "--no-agents", "--port", "0", "--keep-state"],
        ["serve", "--no-tidal", "--port", "0"],
        ["store", "check"],
        ["store", "repair"],
        ["batch", "list"],
    ],
)
def test_an_empty_data_dir_is_refused_and_touches_nothing(tmp_path: Path, args: list[str]) -> None:
    """``--data-dir ''`` was the working directory: `run` deleted the lease store and the batch
    queue there, then served from it."""
    for name in ("leases.db", "batch.db", "admin.token"):
        (tmp_path / name).write_bytes(b"someone else's " + name.encode())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    out = gpupool(*args, "--data-dir", "", cwd=tmp_path)
    assert_one_line_exit_2(out, "invalid --data-dir='': ")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("command", TOKEN_OPTIONS, ids=lambda c: f"{c[0]} {c[-1]}")
def test_an_empty_token_is_refused_not_taken_as_unset(command: list[str], tmp_path: Path) -> None:
    """``--token ''`` given on the command line is a mistake (an unset variable in a script), not
    "no token": `gpupool batch` took it as unset and read DATA_DIR/admin.token instead, so the
    call went out with another identity than the one asked for. Every token option refuses it."""
    (tmp_path / "admin.token").write_text("a-token-from-the-file\n")
    data = ["--data-dir", str(tmp_path)] if command[0] == "batch" else []
    tail = ["--", "true"] if command[:2] == ["batch", "submit"] else []
    out = gpupool(*command[:2], *data, *command[2:], "", *tail)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and command[-1] in out.stderr, out.stderr
