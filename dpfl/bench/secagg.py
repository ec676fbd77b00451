"""`dpfl bench secagg`: secure-aggregation time per round vs plain summation.

The workload is FL-SIGN-DP's: k clients each send n integers (sign + discrete-Gaussian share)
in Z_(2^b) with b from the thesis formula (22 bits for n = 1,663,370, σ = 1.54, |K| = 100).
For each neighbour graph the whole secure path runs in this process, from the clients' int32
rows: their encoding in Z_(2^b) (range check, in place), every client's key agreement, Shamir
sharing and masking in turn, then the server's unmasking; and the exact
sum is checked against a plain integer sum of the survivors' rows, which is also the baseline
(what the server does without secure aggregation). Masks come from the C kernel
(`dpfl/secagg/_maskkernel.c`) where it is built: 512-bit VAES on CPUs with AVX-512 and VAES,
256-bit VAES on CPUs with AVX2 and VAES, else AES-NI; `DPFL_SECAGG_KERNEL=aesni` forces the AES-NI level and `DPFL_SECAGG_KERNEL=0` the
OpenSSL + NumPy path (same words in every case).

Reported per graph: wall and CPU seconds of the round (CPU time is the fairer number on a
shared machine), the slowest single client's masking and the server's own work (what a real
deployment, with clients in parallel, waits for), the overhead over the plain summation
as a fraction of a `round_seconds` training round, bytes per client, and the security
parameter of the graph (`graph.security_bits`) for a `corrupt_frac` of corrupt clients plus
the dropouts. Security parameters of the default graphs at n = 100, t = ⌊k/2⌋ + 1, 5 corrupt
clients, no dropouts: complete graph ∞ (statistically perfect; computational security of
X25519/AES only), k = 16 and k = 12: ∞, k = 8: ≈ 13.7 bits, k = 4: ≈ 5 bits (with 10
dropouts: ∞ for k = 16, 28.8 bits for k = 12; with 30: ∞ for the complete graph, 16 bits for
k = 16, 8 for k = 12, < 1 bit for k ≤ 8).
"""

from __future__ import annotations

import math
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from dpfl.rng import Seeds
from dpfl.secagg.graph import default_threshold, security_bits
from dpfl.secagg.prg import default_workers, kernel_in_use
from dpfl.secagg.protocol import Client, RoundAborted, Server
from dpfl.secagg.ring import centred_lift, client_bound, encode_int, sign_dp_bits
from dpfl.secagg.simulate import exchange_keys, make_config, secure_sum


def _timed(fn, *args, **kwargs):
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - w, time.process_time() - c


def _plain_sum(rows: np.ndarray) -> np.ndarray:
    """What the server does without secure aggregation: add the clients' integer rows."""
    acc = np.zeros(rows.shape[1], dtype=np.int64)
    for row in rows:
        np.add(acc, row, out=acc)
    return acc


def _one_client_masking(x: np.ndarray, bits: int, k: int, neighbours: int | None, seed: int) -> float:
    """Seconds one client takes to mask its input (its key agreements and k + 1 keystreams, 1 thread)."""
    cfg = make_config(k, x.size, bits, neighbours=neighbours, rng_seed=seed, round_id=1)
    clients = [Client(u, cfg, Seeds(seed).crypto("bench", u)) for u in range(k)]
    srv = Server(cfg)
    inbox = exchange_keys(srv, clients)
    t = time.perf_counter()
    clients[0].masked_input(x, inbox[0])
    return time.perf_counter() - t


def run_bench(
    clients: int = 100,
    params: int = 1_663_370,
    sigma: float = 1.54,
    graphs: tuple[int | None, ...] = (None, 16, 12, 8, 4),
    drop_frac: float = 0.0,
    corrupt_frac: float = 0.05,
    round_seconds: float | None = None,
    seed: int = 0,
    workers: int | None = None,
    console: Console | None = None,
) -> dict:
    """Time one secure-aggregation round per neighbour graph (None = complete) and print a table."""
    console = console or Console()
    kernel_in_use()  # a bad DPFL_SECAGG_KERNEL is refused before anything is timed
    if round_seconds is None:  # the reference: this machine's setting-D training round (vectorized engine)
        from dpfl.bench.engine import training_round_seconds

        round_seconds = training_round_seconds()
        console.print(f"setting-D training round on this machine: {round_seconds:.2f} s")
    workers = default_workers() if workers is None else int(workers)
    k, n = int(clients), int(params)
    bits = sign_dp_bits(n, sigma, k)
    rng = np.random.default_rng(seed)
    xi = math.sqrt(n) * sigma / math.sqrt(k)  # per-client discrete-Gaussian scale
    lim = int(6 * xi)
    rows = rng.integers(-lim, lim + 1, size=(k, n), dtype=np.int32)  # stand-in values; timing is value-free
    first = encode_int(rows[:1], bits, bound=client_bound(bits, k))[0]  # for one client's masking below
    _, plain_wall, plain_cpu = _timed(_plain_sum, rows)
    n_drop = int(drop_frac * k)
    drops = rng.choice(k, size=n_drop, replace=False) if n_drop else np.array([], dtype=int)
    keep = np.setdiff1d(np.arange(k), drops)
    expect = rows[keep].sum(axis=0, dtype=np.int64)

    results, table_rows = [], []
    for g in graphs:
        degree = k - 1 if g is None or g >= k - 1 else int(g)
        name = "complete" if degree == k - 1 else f"sparse k={degree}"
        inputs = rows.copy()  # made outside the timing: each client encodes and masks its own buffer
        try:
            (total, st), wall, cpu = _timed(
                secure_sum,  # encodes the int32 rows in place (range check), then the protocol
                inputs,
                bits,
                drop_after_masking=drops,
                neighbours=g,
                rng_seed=seed,
                round_id=1,
                workers=workers,
                overwrite=True,
            )
        except (
            RoundAborted
        ) as e:  # too many dropped neighbours for some client's threshold (SecAgg+ correctness)
            results.append({"graph": name, "degree": degree, "aborted": str(e)})
            table_rows.append([name, "", "", "aborted", "", "", "", "", "", "", "", str(e)[:40]])
            continue
        exact = bool(np.array_equal(centred_lift(total, bits), expect))
        del total, inputs
        client_s = _one_client_masking(first, bits, k, g, seed)
        server = st["server_sum_s"] + st["unmask_s"]
        results.append(
            {
                "graph": name,
                "degree": degree,
                "threshold": st["threshold"],
                "security_bits": security_bits(
                    k, degree, default_threshold(degree), round(corrupt_frac * k), n_drop
                ),
                "wall_s": wall,
                "cpu_s": cpu,
                "keys_s": st["keys_s"],
                "mask_s": st["mask_s"],
                "one_client_mask_s": client_s,
                "server_s": server,
                "deploy_latency_s": client_s + server,
                "overhead_wall_frac_of_round": (wall - plain_wall) / round_seconds,
                "overhead_cpu_frac_of_round": (cpu - plain_cpu) / round_seconds,
                "payload_bytes": int(st["masked_input_bytes"][keep[0]]),
                "bits_per_param": 8 * int(st["masked_input_bytes"][keep[0]]) / n,
                "protocol_bytes": float(st["protocol_bytes"].mean()),
                "exact": exact,
            }
        )
        r = results[-1]
        table_rows.append(
            [
                r["graph"],
                str(r["threshold"]),
                f"{r['security_bits']:.1f}",
                f"{r['wall_s']:.3f}",
                f"{r['cpu_s']:.3f}",
                f"{100 * r['overhead_wall_frac_of_round']:.0f} %",
                f"{100 * r['overhead_cpu_frac_of_round']:.0f} %",
                f"{r['one_client_mask_s']:.4f}",
                f"{r['server_s']:.3f}",
                f"{r['bits_per_param']:.3f}",
                f"{r['protocol_bytes']:.0f}",
                "yes" if r["exact"] else "NO",
            ]
        )

    table = Table(
        title=f"secure aggregation: {k} clients × {n:,} params, b = {bits}, "
        f"{n_drop} dropped after masking, {workers} threads, masks by "
        f"{'the C kernel (' + kernel_in_use() + ')' if kernel_in_use() else 'OpenSSL + NumPy (no C kernel)'}"
    )
    for col in (
        "graph",
        "t",
        "sec. bits",
        "wall s",
        "CPU s",
        "overhead wall",
        "overhead CPU",
        "1 client s",
        "server s",
        "bits/param",
        "key+share B",
        "exact",
    ):
        table.add_column(col, justify="right")
    table.add_row("plain sum", "", "", f"{plain_wall:.3f}", f"{plain_cpu:.3f}", "", "", "", "", "32", "", "")
    for row in table_rows:
        table.add_row(*row)
    console.print(table)
    console.print(
        f"overhead = (secure aggregation from the clients' int32 rows: range check and encoding in Z_2^b + "
        f"protocol − plain int64 sum of the rows) / {round_seconds:.2f} s round (wall and CPU seconds; CPU counts all threads); "
        f"1 client s = one client's masking; security bits with "
        f"{round(corrupt_frac * k)} corrupt + {n_drop} dropped clients (dpfl.secagg.graph)"
    )
    return {
        "clients": k,
        "params": n,
        "bits": bits,
        "dropped": n_drop,
        "plain_wall_s": plain_wall,
        "plain_cpu_s": plain_cpu,
        "workers": workers,
        "c_kernel": kernel_in_use(),
        "round_seconds": round_seconds,
        "graphs": results,
    }
