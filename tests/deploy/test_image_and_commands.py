"""The container image and what the deployment runs in it.

No container builder or base image can be reached on every development machine, so the Dockerfile is
checked statically: multi-stage, a slim Python base, a non-root user, ``gpupool`` as the entrypoint,
and every path it copies exists and is not excluded by .dockerignore. Every command and flag the plain
manifests, the chart (rendered with its defaults) and the image's default CMD run is checked against
the real CLI: ``gpupool <command> --help`` in a subprocess must succeed and list each flag.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tests.adapters.k8s.k8s_helm import render_chart

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            op, _, rest = s.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _arg(name: str) -> str:
    for op, rest in _instructions():
        if op == "ARG" and rest.startswith(f"{name}="):
            return rest.split("=", 1)[1]
    raise KeyError(name)


def _image_runs() -> list[list[str]]:
    """Argument lists given to ``gpupool`` by the manifests, the rendered chart and the image's CMD."""
    texts = [p.read_text() for p in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))]
    texts += list(render_chart(ROOT / "deploy" / "helm" / "gpupool").values())
    runs: list[list[str]] = []
    for text in texts:
        for d in yaml.safe_load_all(text):
            if not d or d.get("kind") not in ("Deployment", "DaemonSet"):
                continue
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["image"].startswith("gpupool/"):
                    assert "command" not in c, "the image's entrypoint is gpupool; set args only"
                    runs.append([str(a) for a in c["args"]])
    (cmd,) = [json.loads(rest) for op, rest in _instructions() if op == "CMD"]
    runs.append(cmd)
    return runs


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    ins = _instructions()
    froms = [rest for op, rest in ins if op == "FROM"]
    assert len(froms) >= 2
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", _arg("PYTHON_IMAGE"))
    assert froms[0] == "${PYTHON_IMAGE} AS build" and froms[-1].startswith("${PYTHON_IMAGE}")
    users = [rest for op, rest in ins if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert [json.loads(rest) for op, rest in ins if op == "ENTRYPOINT"] == [["gpupool"]]
    # the runtime stage installs from the build stage's wheels only, with the extras the processes need
    runtime = ins[[i for i, (op, _) in enumerate(ins) if op == "FROM"][-1] :]
    run = " ".join(rest for op, rest in runtime if op == "RUN")
    assert "--no-index" in run and "gpupool[gateway,nvml,k8s]" in run


def test_every_copied_path_exists_and_reaches_the_build_context() -> None:
    ignored = [
        ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and ln[0] != "#"
    ]
    for op, rest in _instructions():
        if op != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = rest.split()
        for src in sources:
            assert (ROOT / src).exists(), src
            assert not any(fnmatch.fnmatch(src, pat) for pat in ignored), (src, "excluded by .dockerignore")
    cmd = next(json.loads(rest) for op, rest in _instructions() if op == "CMD")
    for flag in ("--cluster", "--workloads"):
        path = cmd[cmd.index(flag) + 1]
        rel = path.removeprefix("/usr/share/gpupool/")
        assert rel != path and (ROOT / rel).is_file(), path


def test_image_tag_is_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpupool" / "values.yaml").read_text())
    assert values["image"] == f"gpupool/gpupool:{version}"
    assert f"IMAGE ?= gpupool/gpupool:{version}" in (ROOT / "Makefile").read_text()


def _help(command: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("gpupool", path=str(Path(sys.executable).parent))
    argv = [exe] if exe else [sys.executable, "-m", "gpupool.cli.main"]
    return subprocess.run(
        [*argv, command, "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb", "NO_COLOR": "1"},
    )


def test_every_command_and_flag_deployed_exists_in_the_cli() -> None:
    runs = _image_runs()
    flags: dict[str, set[str]] = {}
    for args in runs:
        sub, *rest = args
        flags.setdefault(sub, set()).update(a.split("=", 1)[0] for a in rest if a.startswith("--"))
    assert set(flags) == {"serve", "agent", "device-plugin"}
    for sub, want in sorted(flags.items()):
        r = _help(sub)
        assert r.returncode == 0, (sub, r.stderr)
        listed = set(re.findall(r"--[a-z][a-z0-9-]*", r.stdout))
        assert want <= listed, (sub, sorted(want - listed))


def test_the_flag_check_tells_commands_apart() -> None:
    """The check above is per command: a flag of ``agent`` is not taken for one of ``serve``."""
    agent = set(re.findall(r"--[a-z][a-z0-9-]*", _help("agent").stdout))
    serve = set(re.findall(r"--[a-z][a-z0-9-]*", _help("serve").stdout))
    assert "--metrics-port" in agent and "--metrics-port" not in serve
    assert _help("no-such-command").returncode != 0


def test_deployed_gateway_takes_readings_from_the_agents_only() -> None:
    """In a cluster the node agents report real readings: a gateway that also fed the simulated
    cluster's readings into the watermarks would pause and resume GPUs on made-up numbers."""
    serves = [a for a in _image_runs()[:-1] if a[0] == "serve"]
    assert serves, "no gateway in the manifests"
    for args in serves:
        assert "--no-simulate-readings" in args, args


def test_node_containers_run_as_root_although_the_image_does_not() -> None:
    """The image's user is 10001; the agent (signals, cgroup freezer, NVML) and the device plugin (its
    socket in kubelet's root-owned directory) cannot work as that user, so the DaemonSet says root."""
    users = [rest for op, rest in _instructions() if op == "USER"]
    assert users[-1].split(":")[0] != "0"
    texts = [(ROOT / "deploy" / "kubernetes" / "node-daemonset.yaml").read_text()]
    texts.append(render_chart(ROOT / "deploy" / "helm" / "gpupool")["node-daemonset.yaml"])
    for text in texts:
        (ds,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet"]
        containers = ds["spec"]["template"]["spec"]["containers"]
        assert {c["name"] for c in containers} == {"agent", "device-plugin"}
        for c in containers:
            assert c["securityContext"]["runAsUser"] == 0, c["name"]
