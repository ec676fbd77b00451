"""`dpfl bench engine`: one setting-D round (thesis CNN, 100 clients × 5 SGD steps × batch 10),
vectorized engine vs a plain per-client PyTorch loop vs the FLOP lower bound, plus evaluation
of 10,000 test images. Every number printed is measured here."""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch.utils.flop_counter import FlopCounterMode

from dpfl.training.evaluate import evaluate
from dpfl.training.trainer import LocalTraining, Trainer


def matmul_gflops(device: torch.device, n: int = 4096, reps: int = 5) -> float:
    """Best-of dense fp32 matmul throughput (GFLOP/s)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def round_flops(model: torch.nn.Module, batch: int, clients: int, steps: int) -> float:
    x = torch.rand(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    m = copy.deepcopy(model).cpu()
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(m(x), y).backward()
    return float(fc.get_total_flops()) * clients * steps


def _data(device: torch.device, n_train: int = 1000):
    try:
        from dpfl.data import load_dataset

        ds = load_dataset("fashion-mnist", n_train=n_train)
        src = ds.source
        x, y, xt, yt = ds.x_train, ds.y_train, ds.x_test, ds.y_test
    except Exception:  # noqa: BLE001 - any loading problem: fall back to random tensors, named in the output
        g = torch.Generator().manual_seed(0)
        x, y = torch.rand(n_train, 1, 28, 28, generator=g), torch.randint(0, 10, (n_train,), generator=g)
        xt, yt = torch.rand(10000, 1, 28, 28, generator=g), torch.randint(0, 10, (10000,), generator=g)
        src = "random tensors (Fashion-MNIST not installed)"
    return x.to(device), y.to(device), xt.to(device), yt.to(device), src


def training_round_seconds(device: str = "cpu", clients: int = 100, steps: int = 5, batch: int = 10) -> float:
    """Best of two timed setting-D training rounds of the vectorized engine (after a warm-up)."""
    from dpfl.models import build_model

    dev = torch.device(device)
    model = build_model("cnn", seed=0).to(dev)
    x, y, _, _, _ = _data(dev)
    trainer = Trainer(model, "multiclass", LocalTraining(steps=steps, batch_size=batch, lr=0.215))
    w = trainer.flat.flatten(model)
    b = torch.randint(0, x.shape[0], (clients, steps, batch), generator=torch.Generator().manual_seed(0)).to(dev)
    ts = []
    for _ in range(3):
        _sync(dev)
        t = time.perf_counter()
        trainer.train(w, x, y, b)
        _sync(dev)
        ts.append(time.perf_counter() - t)
    return min(ts[1:])


def run_bench(rounds: int = 2, clients: int = 100, steps: int = 5, batch: int = 10, device: str = "cpu",
              console: Console | None = None) -> dict:
    from dpfl.models import build_model

    console = console or Console()
    dev = torch.device(device)
    model = build_model("cnn", seed=0).to(dev)
    x, y, xt, yt, src = _data(dev)
    trainer = Trainer(model, "multiclass", LocalTraining(steps=steps, batch_size=batch, lr=0.215))
    w = trainer.flat.flatten(model)
    g = torch.Generator().manual_seed(0)

    def batches():
        return torch.randint(0, x.shape[0], (clients, steps, batch), generator=g).to(dev)

    def vectorized():
        trainer.train(w, x, y, batches())

    def loop():
        b = batches()
        local = copy.deepcopy(model)
        out = []
        for c in range(clients):
            trainer.flat.load_into(local, w)
            opt = torch.optim.SGD(local.parameters(), lr=0.215)
            for t in range(steps):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(local(x[b[c, t]]), y[b[c, t]]).backward()
                opt.step()
            out.append(trainer.flat.flatten(local) - w)
        return torch.stack(out)

    def timed(fn):
        fn()  # warm-up
        ts = []
        for _ in range(rounds):
            _sync(dev)
            t = time.perf_counter()
            fn()
            _sync(dev)
            ts.append(time.perf_counter() - t)
        return min(ts), sum(ts) / len(ts)

    vec_best, vec_mean = timed(vectorized)
    loop_best, loop_mean = timed(loop)
    ev = []
    for _ in range(max(2, rounds)):
        _sync(dev)
        t = time.perf_counter()
        evaluate(model, xt, yt, "multiclass", batch_size=1000)
        _sync(dev)
        ev.append(time.perf_counter() - t)
    eval_s = min(ev[1:])
    gflops = matmul_gflops(dev)
    flops = round_flops(model, batch, clients, steps)
    bound = flops / (gflops * 1e9)
    res = {"device": str(dev), "threads": torch.get_num_threads(), "data": src, "clients": clients, "steps": steps,
           "batch": batch, "vectorized_s": vec_best, "vectorized_mean_s": vec_mean, "loop_s": loop_best,
           "loop_mean_s": loop_mean, "speedup_vs_loop": loop_best / vec_best, "round_gflop": flops / 1e9,
           "matmul_gflops": gflops, "flop_bound_s": bound, "vectorized_over_bound": vec_best / bound,
           "eval_10k_s": eval_s, "engine_mode": trainer.cohort.mode}
    t = Table(title=f"setting-D round on {dev} ({torch.get_num_threads()} threads); {src}")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("vectorized training, s/round (best / mean)", f"{vec_best:.3f} / {vec_mean:.3f}")
    t.add_row("per-client loop, s/round (best / mean)", f"{loop_best:.3f} / {loop_mean:.3f}")
    t.add_row("speed-up vectorized vs loop", f"{loop_best / vec_best:.2f}×")
    t.add_row("FLOPs per round (fwd+bwd)", f"{flops / 1e9:.1f} GFLOP")
    t.add_row("measured fp32 matmul throughput", f"{gflops:.1f} GFLOP/s")
    t.add_row("FLOP lower bound, s/round", f"{bound:.3f}")
    t.add_row("vectorized / FLOP bound", f"{vec_best / bound:.2f}×")
    t.add_row("evaluate 10,000 images, s", f"{eval_s:.3f}")
    console.print(t)
    return res
