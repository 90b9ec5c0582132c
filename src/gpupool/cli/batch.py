"""``gpupool batch submit|list|cancel``: the batch queue of a running gateway, over its HTTP API.

The gateway (``gpupool serve`` / ``run`` with tidal on) runs the jobs: each is a local process group
(or a Ray task with ``serve --ray-address``) holding a P2 lease. These commands only call
``/v1/batch/jobs`` with an admin token: ``--token``, else ``$GPUPOOL_TOKEN``, else the token file
``DATA_DIR/admin.token`` that ``serve`` wrote. A 4xx answer (bad field, unknown or ended job) is
printed as one line and exits 2; an unreachable gateway exits 1.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.data_dir import data_dir_option
from gpupool.cli.errors import UserError, check_token, check_url, user_errors

app = typer.Typer(help="The batch queue: P2 jobs run by the gateway with P2 leases.", no_args_is_help=True)

URL = typer.Option("http://127.0.0.1:8080", "--url", envvar="GPUPOOL_URL", help="The gateway.")
TOKEN = typer.Option(
    None, "--token", envvar="GPUPOOL_TOKEN", help="Admin token (default DATA_DIR/admin.token)."
)
DATA_DIR = data_dir_option("Where serve keeps admin.token.")


def _token(token: str | None, data_dir: Path) -> str:
    if token is not None:  # (an empty --token is refused, not taken as unset)
        return check_token("--token", token)
    path = data_dir / "admin.token"
    if not path.is_file():
        raise UserError(f"--token: none given, $GPUPOOL_TOKEN unset and no {path}")
    return path.read_text().strip()


def _call(method: str, url: str, token: str, path: str, **kw: Any) -> Any:
    import httpx

    check_url("--url", url)
    try:
        r = httpx.request(
            method, url.rstrip("/") + path, headers={"Authorization": f"Bearer {token}"}, timeout=30, **kw
        )
    except httpx.HTTPError as exc:
        typer.echo(f"gpupool batch: cannot reach the gateway at {url}: {exc}", err=True)
        raise typer.Exit(1) from None
    if 400 <= r.status_code < 500:
        try:
            msg = str(r.json().get("error") or r.text)
        except (ValueError, AttributeError):
            msg = r.text
        raise UserError(f"{r.status_code}: {msg}")
    if r.status_code >= 500:
        typer.echo(f"gpupool batch: the gateway answered {r.status_code}: {r.text[:200]}", err=True)
        raise typer.Exit(1)
    return r.json()


@app.command("submit")
@user_errors
def submit(  # noqa: PLR0917 (typer options)
    command: list[str] = typer.Argument(..., help="The job's argv (after --), run without a shell."),
    vram_mib: int = typer.Option(..., "--vram-mib", help="VRAM of the job's P2 lease (MiB)."),
    job_id: str | None = typer.Option(None, "--id", help="Job id (default: generated)."),
    compute_pct: int = typer.Option(0, "--compute-pct", help="Compute share of the lease (0-100)."),
    checkpointable: bool = typer.Option(
        False, "--checkpointable", help="Pausing keeps its progress (SIGSTOP) instead of a requeue."
    ),
    deadline_s: float | None = typer.Option(
        None, "--deadline-s", help="Unix seconds; earliest deadline first."
    ),
    url: str = URL,
    token: str | None = TOKEN,
    data_dir: Path = DATA_DIR,
) -> None:
    """Queue a job: gpupool batch submit --vram-mib 20480 -- python train.py --epochs 3"""
    body: dict[str, Any] = {
        "command": command,
        "vram_mib": vram_mib,
        "compute_pct": compute_pct,
        "checkpointable": checkpointable,
    }
    if job_id is not None:
        body["id"] = job_id
    if deadline_s is not None:
        if not math.isfinite(deadline_s):
            raise UserError(f"invalid --deadline-s={deadline_s}: must be finite Unix seconds")
        body["deadline_s"] = deadline_s
    job = _call("POST", url, _token(token, data_dir), "/v1/batch/jobs", json=body)
    typer.echo(f"{job['id']} {job['state']}")


@app.command("list")
@user_errors
def list_jobs(
    state: str | None = typer.Option(
        None, "--state", help="queued | running | paused | done | failed | cancelled"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the jobs as JSON."),
    url: str = URL,
    token: str | None = TOKEN,
    data_dir: Path = DATA_DIR,
) -> None:
    """The jobs in queue order."""
    params = {} if state is None else {"state": state}  # (an empty value is refused, not ignored)
    jobs = _call("GET", url, _token(token, data_dir), "/v1/batch/jobs", params=params)["jobs"]
    if as_json:
        typer.echo(json.dumps(jobs))
        return
    for j in jobs:
        rc = "" if j["returncode"] is None else f" rc={j['returncode']}"
        cmd = " ".join(j["command"])
        typer.echo(f"{j['id']}\t{j['state']}\t{j['vram_mib']} MiB\tattempts={j['attempts']}{rc}\t{cmd}")
        if j.get("waiting"):
            typer.echo(f"\twaiting: {j['waiting']}")


@app.command("cancel")
@user_errors
def cancel(
    job_id: str = typer.Argument(..., help="The job to cancel."),
    url: str = URL,
    token: str | None = TOKEN,
    data_dir: Path = DATA_DIR,
) -> None:
    """Stop a job's process, release its lease, mark it cancelled."""
    path = "/v1/batch/jobs/" + urllib.parse.quote(job_id, safe="")  # the id as one path segment
    job = _call("DELETE", url, _token(token, data_dir), path)
    typer.echo(f"{job['id']} {job['state']}")


__all__ = ["app"]
