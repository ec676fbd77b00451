"""`dpfl bench dpsgd`: DP-SGD training throughput of dpfl vs Opacus on the same model and batch.

One measured step = per-example gradients, clipping, Gaussian noise, parameter update, on a
fixed batch (sampling excluded on both sides). Runs alternate between the two so that load
changes on a shared machine hit both alike; the median step time is reported.
"""

from __future__ import annotations

import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from dpfl.dpsgd.core import dpsgd_step
from dpfl.models import build_model, count_params
from dpfl.rng import Seeds


def _dpfl_stepper(model, x, y, clip, sigma, lr):
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    rng = Seeds(0).crypto("bench", "noise")

    def step():
        nonlocal params
        params = dpsgd_step(params, {}, model, x, y, clip=clip, noise_multiplier=sigma, lr=lr, generator=rng)

    return step


def _opacus_stepper(model, x, y, clip, sigma, lr):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gsm = GradSampleModule(model)
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=lr),
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=len(x),
    )

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(gsm(x), y).backward()
        opt.step()

    return step


def run_bench(
    model: str = "cnn",
    model_options: dict | None = None,
    batch_size: int = 64,
    steps: int = 5,
    warmup: int = 1,
    clip: float = 1.0,
    noise_multiplier: float = 1.0,
    lr: float = 0.1,
    threads: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    print_table: bool = True,
) -> dict:
    """Examples/s of one DP-SGD step for dpfl and Opacus (if installed) on `model`, same batch."""
    if threads is not None:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(batch_size, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (batch_size,), generator=g).to(device)

    def fresh():
        return build_model(model, seed=seed, **(model_options or {})).to(device)

    steppers = {"dpfl": _dpfl_stepper(fresh(), x, y, clip, noise_multiplier, lr)}
    opacus_note = None
    try:
        import opacus

        steppers["opacus"] = _opacus_stepper(fresh(), x, y, clip, noise_multiplier, lr)
        opacus_note = f"opacus {opacus.__version__}"
    except ImportError as e:
        opacus_note = f"opacus not available: {e}"
    times: dict[str, list[float]] = {k: [] for k in steppers}

    def sync():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    for i in range(warmup + steps):
        for name, step in steppers.items():
            sync()
            t = time.perf_counter()
            step()
            sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    rates = {k: batch_size / statistics.median(v) for k, v in times.items()}
    out = {
        "model": model,
        "params": count_params(fresh()),
        "batch_size": batch_size,
        "steps": steps,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "examples_per_s": rates,
        "step_seconds": {k: sorted(v) for k, v in times.items()},
        "opacus": opacus_note,
    }
    if "opacus" in rates:
        out["speedup_vs_opacus"] = rates["dpfl"] / rates["opacus"]
    if print_table:
        t = Table(
            title=f"DP-SGD step throughput: {model} ({out['params']:,} params), batch {batch_size}, "
            f"{out['threads']} threads, median of {steps}"
        )
        t.add_column("implementation")
        t.add_column("examples/s", justify="right")
        t.add_column("median step (s)", justify="right")
        for k, r in rates.items():
            t.add_row(k, f"{r:.1f}", f"{statistics.median(times[k]):.3f}")
        Console().print(t)
        if "speedup_vs_opacus" in out:
            Console().print(f"dpfl / opacus = {out['speedup_vs_opacus']:.2f}x")
        else:
            Console().print(opacus_note)
    return out
