"""``dpfl bench privacy``: measured time to account many rounds under each backend, and the
throughput of the fast discrete-Gaussian sampler and of one client's Gaussian noise share."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from dpfl.privacy.events import SampledGaussianEvent
from dpfl.privacy.ledger import ACCOUNTANTS, Ledger
from dpfl.privacy.mechanisms import gaussian_noise
from dpfl.privacy.samplers import discrete_gaussian
from dpfl.rng import CryptoRNG


def _timed(fn, repeats: int) -> tuple[float, float, object]:
    """Best wall and CPU seconds over ``repeats`` runs, and the last result."""
    best_w = best_c = float("inf")
    out = None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        best_w, best_c = min(best_w, time.perf_counter() - w), min(best_c, time.process_time() - c)
    return best_w, best_c, out


def run_bench(
    rounds: int = 10_000,
    sigma: float = 1.54,
    q: float = 1 / 60,
    delta: float = 1e-5,
    repeats: int = 3,
    per_round_pld: int = 200,
    sampler_samples: int = 16_633_700,
    sampler_sigma: float = 198.6,
    share_size: int = 1_663_370,
    shares: int = 10,
) -> dict:
    ev = SampledGaussianEvent(sigma, q)

    def once(acc):
        led = Ledger(acc)
        led.add(ev, count=rounds)
        return led.epsilon(delta)

    def per_round(acc, n, query_each):
        led = Ledger(acc)
        for _ in range(n):
            led.add(ev)
            if query_each:
                led.epsilon(delta)
        return led.epsilon(delta)

    rows, result = [], {"rounds": rounds, "sigma": sigma, "q": q, "delta": delta, "accountants": {}}
    once("pld")  # import dp-accounting's PLD modules outside the timings
    for acc in ACCOUNTANTS:
        w, c, eps = _timed(lambda acc=acc: once(acc), repeats)
        r = {"epsilon": eps, "self_composed_wall_s": w, "self_composed_cpu_s": c}
        rows.append((acc, f"1 event x {rounds}", w, c, eps))
        if acc != "pld":
            for query_each in (False, True):
                w, c, e2 = _timed(lambda acc=acc, qe=query_each: per_round(acc, rounds, qe), 1)
                key = "per_round_query_each" if query_each else "per_round"
                r[key + "_wall_s"], r[key + "_cpu_s"] = w, c
                rows.append((acc, f"{rounds} x add" + (" + eps query each" if query_each else ""), w, c, e2))
        else:
            w, c, e2 = _timed(lambda acc=acc: per_round(acc, per_round_pld, True), 1)
            r["per_round_query_each_wall_s"], r["per_round_query_each_cpu_s"] = w, c
            r["per_round_rounds"] = per_round_pld
            rows.append((acc, f"{per_round_pld} x add + eps query each", w, c, e2))
        result["accountants"][acc] = r

    rng = CryptoRNG(key=bytes(32))
    discrete_gaussian(0, sampler_sigma, rng, size=10)  # build the table outside the timing
    w, c, _ = _timed(lambda: discrete_gaussian(0, sampler_sigma, rng, size=sampler_samples), 1)
    result["sampler"] = {
        "sigma": sampler_sigma,
        "samples": sampler_samples,
        "wall_s": w,
        "cpu_s": c,
        "samples_per_s": sampler_samples / w,
        "projected_s_per_166M": 166_337_000 / sampler_samples * w,
    }

    # one client's FL-STD-DP share per call, from its own seeded CryptoRNG (as in dpfl.schemes.dp)
    w, c, _ = _timed(lambda: [gaussian_noise(share_size, 0.33, CryptoRNG(key=bytes([i]) * 32))
                              for i in range(shares)], 1)
    result["gaussian_share"] = {"size": share_size, "shares": shares, "wall_s": w, "cpu_s": c,
                                "s_per_share": w / shares, "cpu_s_per_share": c / shares}

    table = Table(title=f"privacy accounting: sigma={sigma}, q={q:.4g}, delta={delta:g}")
    for col in ("accountant", "workload", "wall ms", "cpu ms", "epsilon"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    for acc, work, w, c, e in rows:
        table.add_row(acc, work, f"{w * 1e3:.1f}", f"{c * 1e3:.1f}", f"{e:.4f}")
    table.add_row(
        "sampler",
        f"discrete_gaussian sigma={sampler_sigma}, {sampler_samples:,} samples, CryptoRNG",
        f"{result['sampler']['wall_s'] * 1e3:.0f}",
        f"{result['sampler']['cpu_s'] * 1e3:.0f}",
        "",
    )
    g = result["gaussian_share"]
    table.add_row("sampler", f"gaussian_noise: {shares} client shares of {share_size:,} (CryptoRNG each); "
                  f"per share {g['s_per_share'] * 1e3:.1f} ms wall, {g['cpu_s_per_share'] * 1e3:.1f} ms CPU",
                  f"{g['wall_s'] * 1e3:.0f}", f"{g['cpu_s'] * 1e3:.0f}", "")
    Console().print(table)
    return result
