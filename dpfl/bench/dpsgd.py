"""`dpfl bench dpsgd`: DP-SGD training throughput of dpfl vs every Opacus mode, same model and batch.

One measured step = clipped gradient sum, Gaussian noise, parameter update, on a fixed batch
(sampling excluded on both sides). dpfl draws its noise from CryptoRNG (ChaCha20); Opacus from
torch's default generator (secure_mode off). Within a round every contender runs once, in an order
rotated each round, so that load changes on a shared machine hit all alike; the median step
time of each is reported.
"""

from __future__ import annotations

import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from dpfl.dpsgd.core import gaussian_like
from dpfl.dpsgd.ghost import path_for
from dpfl.dpsgd.step import dpsgd_step
from dpfl.models import build_model, count_params
from dpfl.rng import Seeds

OPACUS_MODES = ("hooks", "functorch", "ghost")


def _dpfl_stepper(model, x, y, clip, sigma, lr):
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    rng = Seeds(0).crypto("bench", "noise")

    def step():
        nonlocal params
        params = dpsgd_step(params, {}, model, x, y, clip=clip, noise_multiplier=sigma, lr=lr, generator=rng)

    return step


def _noise_stepper(model, clip, sigma):
    """dpfl's CryptoRNG noise draw alone (part of the dpfl step), to show its share."""
    zero = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    rng = Seeds(1).crypto("bench", "noise")
    return lambda: gaussian_like(zero, sigma * clip, rng)


def _opacus_stepper(model, x, y, clip, sigma, lr, mode):
    import warnings

    from opacus import PrivacyEngine

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=lr),
            criterion=torch.nn.CrossEntropyLoss(),
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=clip,
            poisson_sampling=False,
            grad_sample_mode=mode,
        )
    gsm, opt = made[0], made[1]
    crit = made[2] if mode == "ghost" else torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        crit(gsm(x), y).backward()
        opt.step()

    return step


def _measure(steppers: dict, warmup: int, steps: int, sync) -> dict[str, list[float]]:
    import warnings

    names = list(steppers)
    times: dict[str, list[float]] = {k: [] for k in names}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook")
        _rounds(steppers, names, times, warmup, steps, sync)
    return times


def _rounds(steppers, names, times, warmup, steps, sync) -> None:
    for i in range(warmup + steps):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            sync()
            t = time.perf_counter()
            steppers[name]()
            sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - t)


def run_bench(
    model: str = "cnn",
    model_options: dict | None = None,
    batch_sizes: tuple[int, ...] = (10, 64, 256),
    steps: int = 7,
    warmup: int = 1,
    clip: float = 1.0,
    noise_multiplier: float = 1.0,
    lr: float = 0.1,
    threads: int | None = 1,
    seed: int = 0,
    device: str = "cpu",
    print_table: bool = True,
) -> dict:
    """Examples/s of one DP-SGD step for dpfl and each Opacus mode (if installed) on `model`."""
    if threads is not None:
        torch.set_num_threads(threads)

    def fresh():
        return build_model(model, seed=seed, **(model_options or {})).to(device)

    def sync():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    try:
        import opacus

        opacus_note = f"opacus {opacus.__version__}"
    except ImportError as e:
        opacus, opacus_note = None, f"opacus not available: {e}"
    out = {
        "model": model,
        "params": count_params(fresh()),
        "path": path_for(fresh()),
        "steps": steps,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "opacus": opacus_note,
        "batches": {},
    }
    for b in batch_sizes:
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(b, 1, 28, 28, generator=g).to(device)
        y = torch.randint(0, 10, (b,), generator=g).to(device)
        steppers = {"dpfl": _dpfl_stepper(fresh(), x, y, clip, noise_multiplier, lr)}
        steppers["noise draw"] = _noise_stepper(fresh(), clip, noise_multiplier)
        if opacus is not None:
            for mode in OPACUS_MODES:
                steppers[f"opacus-{mode}"] = _opacus_stepper(fresh(), x, y, clip, noise_multiplier, lr, mode)
        times = _measure(steppers, warmup, steps, sync)
        rates = {k: b / statistics.median(v) for k, v in times.items()}
        res = {"examples_per_s": rates, "step_seconds": {k: sorted(v) for k, v in times.items()}}
        rates.pop("noise draw")
        res["noise_draw_seconds"] = statistics.median(times["noise draw"])
        others = {k: r for k, r in rates.items() if k != "dpfl"}
        if others:
            best = max(others, key=others.get)
            res["fastest_opacus"] = best
            res["speedup_vs_fastest_opacus"] = rates["dpfl"] / others[best]
        out["batches"][b] = res
    if print_table:
        _print(out)
    return out


def _print(out: dict) -> None:
    con = Console(width=130)
    t = Table(
        title=f"DP-SGD step throughput (examples/s): {out['model']} ({out['params']:,} params), "
        f"{out['threads']} threads, {out['device']}, median of {out['steps']} interleaved steps"
    )
    t.add_column("batch", justify="right")
    names = list(next(iter(out["batches"].values()))["examples_per_s"])
    for k in names:
        t.add_column(k, justify="right")
    t.add_column("dpfl / fastest Opacus", justify="right")
    t.add_column("dpfl noise draw (s)", justify="right")
    for b, res in out["batches"].items():
        sp = res.get("speedup_vs_fastest_opacus")
        t.add_row(
            str(b),
            *(f"{res['examples_per_s'][k]:.1f}" for k in names),
            f"{sp:.2f}x ({res['fastest_opacus']})" if sp else "-",
            f"{res['noise_draw_seconds']:.3f}",
        )
    con.print(t)
    con.print(
        f"dpfl path: {out['path']}; noise from CryptoRNG (ChaCha20), Opacus from torch's generator; "
        f"{out['opacus']}"
    )
