"""`gpupool emulate-backend`: run the emulated OpenAI-compatible inference server for one model.

Token timing follows the roofline model of `gpupool.adapters.backends.roofline` for the model
(parameters and KV bytes per token from the hardware catalogue) on the given GPU and slice fraction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpupool.cli.errors import UserError, check_listen, check_port, check_range, user_errors


def build_engine(
    model: str,
    *,
    gpu: str = "A100-SXM4-80GB",
    compute_fraction: float = 1.0,
    kv_budget_mib: int = 8192,
    quant: str = "bf16",
    speed: float = 1.0,
    max_num_seqs: int = 256,
) -> object:
    """An `EmulatedEngine` for a catalogue model (imported lazily: the adapter needs FastAPI)."""
    from gpupool.adapters.backends import EmulatedEngine, Roofline, gpu_peaks
    from gpupool.hardware.memory import QUANT_BYTES, kv_bytes_per_token_of, resolve_model

    arch = resolve_model(model)
    if quant not in QUANT_BYTES:
        raise UserError(f"--quant {quant!r}: expected one of {', '.join(QUANT_BYTES)}")
    if not 0 < compute_fraction <= 1:
        raise UserError(f"--compute-fraction {compute_fraction}: must be in (0, 1]")
    if kv_budget_mib < 1:
        raise UserError(f"--kv-budget-mib {kv_budget_mib}: must be >= 1")
    check_range("--speed", speed, lo=0, lo_open=True)
    bw, flops = gpu_peaks(gpu)
    roof = Roofline(
        params=arch.param_count,
        bytes_per_param=QUANT_BYTES[quant],
        kv_bytes_per_token=max(1, kv_bytes_per_token_of(arch)),
        mem_bw_bytes_s=bw,
        peak_flops=flops,
        compute_fraction=compute_fraction,
    )
    return EmulatedEngine(roof, kv_budget_mib=kv_budget_mib, speed=speed, max_num_seqs=max_num_seqs)


def build_backend_app(
    model: str,
    *,
    scheduling_policy: str = "fcfs",
    max_model_len: int | None = None,
    on_memory: Any = None,
    **kw: object,
) -> object:
    """The emulated server for a catalogue model: task (generate / embed) and default ``max_model_len``
    from the catalogue; ``scheduling_policy`` as vLLM's ``--scheduling-policy`` (fcfs rejects priorities)."""
    from gpupool.adapters.backends.app import SCHEDULING_POLICIES, create_backend_app
    from gpupool.adapters.backends.engine import EmulatedEngine
    from gpupool.hardware.memory import resolve_model

    if scheduling_policy not in SCHEDULING_POLICIES:
        raise UserError(f"--scheduling-policy {scheduling_policy!r}: expected fcfs or priority")
    if max_model_len is not None and max_model_len < 1:
        raise UserError(f"--max-model-len {max_model_len}: must be >= 1")
    engine = build_engine(model, **kw)  # type: ignore[arg-type]
    assert isinstance(engine, EmulatedEngine)
    arch = resolve_model(model)
    return create_backend_app(
        engine,
        model=model,
        task="generate" if arch.is_decoder else "embed",
        max_model_len=max_model_len or arch.max_positions,
        scheduling_policy=scheduling_policy,
        on_memory=on_memory,
    )


def _vram_holder(mib: int, on: str, sleep_mib: int) -> Any:
    """``on_memory`` for the backend app: this process's record in the simulated VRAM registry.
    Only checks the options: nothing is written until it is called (``on_memory(False)`` once the
    app is built, so a start refused for another option leaves no record claiming memory)."""
    if mib == 0:
        return None
    import os

    from gpupool.adapters.simulated.vram import REGISTRY_ENV, hold

    check_range("--hold-vram-mib", mib, lo=0)
    check_range("--sleep-vram-mib", sleep_mib, lo=0, hi=mib)
    registry = os.environ.get(REGISTRY_ENV, "")
    if not registry:
        raise UserError(f"--hold-vram-mib needs the simulated VRAM registry directory in ${REGISTRY_ENV}")
    if not on:
        raise UserError("--hold-vram-mib needs --hold-on: the GPU or slice id it runs on")
    path = Path(registry)

    def on_memory(asleep: bool) -> None:
        try:
            hold(path, on, sleep_mib if asleep else mib)
        except OSError as exc:
            raise UserError(
                f"${REGISTRY_ENV}={registry!r}: cannot write to it: {exc.strerror or exc}"
            ) from None

    return on_memory


@user_errors
def emulate_backend(  # noqa: PLR0917 (typer options)
    model: str = typer.Option(..., "--model", help="Catalogue model name, e.g. qwen2.5-7b."),
    port: int = typer.Option(8001, "--port", help="TCP port (0 = any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    gpu: str = typer.Option("A100-SXM4-80GB", "--gpu", help="GPU model the slice is on (roofline peaks)."),
    compute_fraction: float = typer.Option(1.0, "--compute-fraction", help="Share of the GPU's SMs, (0, 1]."),
    kv_budget_mib: int = typer.Option(8192, "--kv-budget-mib", help="KV-cache budget of the instance (MiB)."),
    quant: str = typer.Option("bf16", "--quant", help="Weight format (bf16, fp8, int4, awq, ...)."),
    speed: float = typer.Option(1.0, "--speed", help="Time scale: 10 = ten times faster than the model."),
    scheduling_policy: str = typer.Option(
        "fcfs", "--scheduling-policy", help="fcfs (non-zero priorities are rejected, as vLLM) or priority."
    ),
    max_model_len: int | None = typer.Option(None, "--max-model-len", help="Context (default: the model's)."),
    hold_vram_mib: int = typer.Option(
        0,
        "--hold-vram-mib",
        help="Simulated devices: hold this much VRAM on --hold-on through the registry $GPUPOOL_SIM_VRAM_DIR "
        "(weights + KV), shrinking to --sleep-vram-mib while asleep.",
    ),
    hold_on: str = typer.Option("", "--hold-on", help="GPU or slice id of the simulated cluster it runs on."),
    sleep_vram_mib: int = typer.Option(512, "--sleep-vram-mib", help="What it keeps asleep (CUDA context)."),
) -> None:
    """Serve an emulated OpenAI-compatible model (vLLM metric names, sleep/pause endpoints)."""
    import uvicorn

    from gpupool.adapters.backends.roofline import GPU_PEAKS, known_gpu

    check_port("--port", port)
    if known_gpu(gpu) is None:
        raise UserError(f"--gpu {gpu!r}: unknown GPU model (known: {', '.join(GPU_PEAKS)})")
    check_listen("--host/--port", host, port)
    on_memory = _vram_holder(hold_vram_mib, hold_on, sleep_vram_mib)
    app = build_backend_app(
        model,
        gpu=gpu,
        compute_fraction=compute_fraction,
        kv_budget_mib=kv_budget_mib,
        quant=quant,
        speed=speed,
        scheduling_policy=scheduling_policy,
        max_model_len=max_model_len,
        on_memory=on_memory,
    )
    if on_memory is not None:  # every option is good: hold the weights + KV now
        on_memory(False)
    typer.echo(f"emulated backend {model} on http://{host}:{port} (gpu {gpu}, fraction {compute_fraction})")
    uvicorn.run(app, host=host, port=port, log_level="warning")  # type: ignore[arg-type]
