"""The ``gpupool`` command: one typer app, subcommands registered from their own modules."""

from __future__ import annotations

import sys

import typer

from gpupool import __version__
from gpupool.cli import agent as node_agent
from gpupool.cli import batch, bench, demo, doctor, emulate, plan, sim
from gpupool.cli import device_plugin as k8s_device_plugin
from gpupool.cli import extender as k8s_extender
from gpupool.cli import proxy as cli_proxy
from gpupool.cli import run as cli_run
from gpupool.cli import serve as cli_serve
from gpupool.cli import store as cli_store
from gpupool.cli.errors import EXIT_BAD_INPUT, fail, usage_line

app = typer.Typer(
    name="gpupool",
    help=(
        "gpupool pools private NVIDIA GPUs into isolated slices (MIG, MPS, whole cards) and leases them "
        "by VRAM MiB x compute, with priorities, preemption and watermark backpressure."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpupool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """gpupool: GPU pooling and elastic slicing for private AI-agent platforms."""


app.command("run", help="The gateway on the simulated example cluster with emulated backends (`make run`).")(
    cli_run.run
)
app.command("serve", help="Serve the lease API, events, metrics and OpenAI proxy.")(cli_serve.serve)
app.command("proxy", help="A proxy replica: the OpenAI proxy granting inside KV shares a leader delegates.")(
    cli_proxy.proxy
)
app.command("emulate-backend", help="An emulated OpenAI-compatible server.")(emulate.emulate_backend)
app.command(
    "demo", help="Show the allocator on the seed's example pool: slices and leases around a P0 preemption."
)(demo.demo)
app.add_typer(bench.app, name="bench")
app.add_typer(batch.app, name="batch")
app.add_typer(sim.app, name="sim")
app.add_typer(cli_store.app, name="store")
app.command("plan", help="Partition a cluster for workloads (MIG/MPS layout, mig-parted).")(plan.plan)
app.command("extender", help="Kubernetes scheduler extender (filter/bind/...).")(k8s_extender.extender)
app.command("device-plugin", help="Kubelet device plugin (gpupool.io/gpu).")(k8s_device_plugin.device_plugin)
app.command("agent", help="Node agent: 200 ms loop, watermark pausing, /metrics.")(node_agent.agent)
app.command("doctor", help="Preflight of a GPU node: driver, CUDA, MIG, MPS, kubelet.")(doctor.doctor)


def main() -> None:
    """Run the CLI; an error the parser finds in the command line is one line and exit 2, like the
    commands' own checks (typer's default is a framed, multi-line box)."""
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        raise SystemExit(1) from None
    except typer.TyperException as exc:  # the parser's errors (click's family, vendored by typer)
        if type(exc).__name__ == "NoArgsIsHelpError":  # nothing ran: the standard path prints the help
            app()
        elif exc.exit_code == EXIT_BAD_INPUT:  # a usage error
            fail(usage_line(exc, sys.argv[1:]))
        print(f"gpupool: error: {exc.format_message()}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
