"""`dpfl bench sign`: the CPU sign pipeline of FL-SIGN and signSGD on one thread and on several.

One cohort's updates, `clients` rows of `params` float32 values (the thesis CNN: 1,663,370) with a
fraction `zeros` of exact zeros (those draw random signs), go through the stages a plain sign
round runs after training: the clients' signs (`random_sign_rows`, one generator per client), the
1-bit encoding, the server's decoding and the integer sum of the votes. Each stage is timed at
1 thread and at `threads` (default: all cores), median of `reps`; the outputs of the two are
checked to be identical. Every number printed is measured here.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from dpfl.compression.bits import SignCodec, random_sign_rows
from dpfl.rng import Seeds
from dpfl.schemes.transport import sum_rows


def _stages(x: torch.Tensor, seeds: Seeds) -> tuple[dict[str, float], torch.Tensor]:
    codec, t = SignCodec(), {}
    s = time.perf_counter()
    signs = random_sign_rows(x, lambda i: seeds.numpy("zeros", i))
    t["sign"], s = time.perf_counter() - s, time.perf_counter()
    payload = codec.encode(signs)
    t["encode"], s = time.perf_counter() - s, time.perf_counter()
    rows = codec.decode(payload, x.shape[1])
    t["decode"], s = time.perf_counter() - s, time.perf_counter()
    total = sum_rows(rows)
    t["sum"] = time.perf_counter() - s
    t["total"] = sum(t.values())
    return t, total


def run_bench(clients: int = 200, params: int = 1_663_370, zeros: float = 0.3, reps: int = 3,
              threads: int | None = None, seed: int = 0, console: Console | None = None) -> dict:
    console = console or Console()
    threads = int(threads or os.cpu_count() or 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(clients, params, generator=g)
    x[torch.rand(clients, params, generator=g) < zeros] = 0.0
    seeds, before = Seeds(seed), torch.get_num_threads()
    res: dict[int, dict[str, float]] = {}
    totals = {}
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            runs = [_stages(x, seeds) for _ in range(reps)]
            totals[n] = runs[0][1]
            res[n] = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
    finally:
        torch.set_num_threads(before)
    same = all(torch.equal(totals[1], v) for v in totals.values())
    tab = Table(title=f"sign pipeline, {clients} × {params:,} float32, {zeros:.0%} zeros (median of {reps})")
    tab.add_column("stage")
    for n in res:
        tab.add_column(f"{n} thread{'s' if n > 1 else ''} (s)", justify="right")
    if threads > 1:
        tab.add_column(f"speed-up ×{threads}", justify="right")
    for k in res[1]:
        cells = [f"{res[n][k]:.3f}" for n in res]
        if threads > 1:
            cells.append(f"{res[1][k] / res[threads][k]:.2f}")
        tab.add_row(k, *cells)
    console.print(tab)
    console.print(f"vote sums identical across thread counts: {same}")
    if not same:
        raise RuntimeError("the sign pipeline gave different votes on different thread counts")
    return {"clients": clients, "params": params, "zeros": zeros, "reps": reps,
            "seconds": {str(n): v for n, v in res.items()}, "identical": same}
