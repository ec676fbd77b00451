"""`dpfl bench noise`: how fast dpfl draws DP noise, beside the keystream it reads, torch's and
NumPy's own generators, and the sampler it replaced (AES-256-CTR + float64 Box–Muller); on a
device too; and what share of a DP round drawing noise takes. Every number is measured here."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from dpfl.rng import CryptoRNG, gauss, gaussian_rows


@contextmanager
def _threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _best(fn, reps: int = 5, device: torch.device | None = None) -> float:
    best = float("inf")
    for _ in range(reps):
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return best


def _before(key: bytes, out: torch.Tensor, std: float) -> None:
    """The sampler dpfl used before ChaCha20 and the ziggurat (kept here to measure against):
    AES-256-CTR keystream, Box–Muller in float64 on open 53-bit uniforms, in 64 Ki-word chunks."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    flat, n = out.view(-1), out.numel()
    half, ch = (n + 1) // 2, 1 << 16
    zeros, buf = np.zeros(8 * ch, np.uint8), np.empty(8 * ch + 15, np.uint8)
    words = buf[: 8 * ch].view("<u8")
    radius = torch.empty(half, dtype=torch.float64)
    u, z = torch.empty(ch, dtype=torch.float64), torch.empty(ch, dtype=torch.float64)

    def uniforms(m):
        enc.update_into(zeros[: 8 * m], buf)
        np.right_shift(words[:m], np.uint64(11), out=words[:m])
        return u[:m].copy_(torch.from_numpy(words[:m].view(np.int64))).add_(0.5).mul_(1.0 / (1 << 53))

    for s in range(0, half, ch):
        r = radius[s : s + ch]
        torch.log(uniforms(r.numel()), out=r).mul_(-2.0).sqrt_().mul_(std)
    for s in range(0, half, ch):
        r = radius[s : s + ch]
        m = r.numel()
        a = uniforms(m).mul_(2.0 * math.pi)
        flat[s : s + m].copy_(torch.cos(a, out=z[:m]).mul_(r))
        t = min(m, n - half - s)
        if t > 0:
            flat[half + s : half + s + t].copy_(torch.sin(a[:t], out=z[:t]).mul_(r[:t]))


ISAS = ["plain", "avx2", "avx512"]  # the C kernel's paths (dpfl/rng/_gausskernel.c), narrowest first
_ISA_LABELS = {"plain": "plain C", "avx2": "AVX2", "avx512": "AVX-512"}


def sampler_rates(n: int = 1 << 22, device: str | None = None, sigma_dg: float = 130.0) -> dict:
    """Values per second: one core, all cores, and on `device` (when given)."""
    from dpfl.privacy import samplers
    from dpfl.privacy.samplers import discrete_gaussian, discrete_gaussian_rows

    out: dict = {"n": n}
    with _threads(1):
        g = CryptoRNG(key=bytes(32))
        zeros, buf = np.zeros(8 * n, np.uint8), np.empty(8 * n + 15, np.uint8)
        out["keystream_words_per_s"] = n / _best(lambda: g._fill(zeros, buf))
        f32 = torch.empty(n)
        out["gaussian_per_s"] = n / _best(lambda: g.gaussian_into(f32, 1.0))
        out["c_kernel"] = gauss._gk.isa() if gauss._gk else None  # the vector path it took
        out["gaussian_per_s_by_kernel"] = {}
        for level, name in enumerate(["plain", "avx2", "avx512"][: ISAS.index(out["c_kernel"]) if gauss._gk else 0]):
            cap = gauss._gk.limit(level)  # the same values by each narrower path of the C kernel this CPU has
            try:
                out["gaussian_per_s_by_kernel"][name] = n / _best(lambda: g.gaussian_into(f32, 1.0))
            finally:
                gauss._gk.limit(cap)
        out["before_per_s"] = n / _best(lambda: _before(bytes(32), f32, 1.0), reps=3)
        out["torch_randn_per_s"] = n / _best(lambda: torch.randn(n, out=f32))
        gen = np.random.default_rng(0)
        out["numpy_normal_per_s"] = n / _best(lambda: gen.standard_normal(n, dtype=np.float32))
        out["dg_per_s"] = n / _best(lambda: discrete_gaussian(0, sigma_dg, g, size=n), reps=3)
        if samplers._kernel() is not None:  # the same integers with the lookup in NumPy
            table, dg = samplers._gaussian_table(sigma_dg), np.empty(n, np.int64)
            out["dg_numpy_per_s"] = n / _best(lambda: table.sample_into(dg, samplers.source(g, False), kernel=False),
                                              reps=3)
    cores = torch.get_num_threads()
    rows = 2 * cores  # rows of n/2 values (a client's share is 1.66 M in setting D)
    m = torch.empty(rows, n // 2)
    t = _best(lambda: gaussian_rows([CryptoRNG(key=bytes([r]) * 32) for r in range(rows)], m, 1.0), reps=3)
    out["threads"] = cores
    out["gaussian_all_cores_per_s"] = m.numel() / t
    out["gaussian_ratio_to_keystream"] = out["gaussian_per_s"] / out["keystream_words_per_s"]
    if device:
        dev = torch.device(device)
        k = 100
        d = torch.empty(k, n // k * 8, device=dev)  # 8x the CPU count: a device round's size
        mk = lambda: [CryptoRNG(key=bytes([r]) * 32) for r in range(k)]
        gaussian_rows(mk(), d, 1.0)  # compile / warm up
        out["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
        out["device_gaussian_per_s"] = d.numel() / _best(lambda: gaussian_rows(mk(), d, 1.0), device=dev)
        out["device_torch_randn_per_s"] = d.numel() / _best(lambda: torch.randn(d.shape, out=d), device=dev)
        from dpfl.rng import chacha

        keys = torch.tensor([chacha.key_words(bytes([r]) * 32) for r in range(k)], dtype=torch.int64, device=dev)
        nb = d.shape[1] // 8
        idx = torch.arange(k, device=dev).repeat_interleave(nb)
        ctr = torch.arange(nb, device=dev).repeat(k)
        chacha.blocks(keys, idx, ctr)
        out["device_keystream_words_per_s"] = k * nb * 8 / _best(lambda: chacha.blocks(keys, idx, ctr), device=dev)
        mu = torch.zeros(k, n // k * 8, dtype=torch.int32, device=dev)
        discrete_gaussian_rows(mu, sigma_dg, mk())
        out["device_dg_per_s"] = mu.numel() / _best(lambda: discrete_gaussian_rows(mu, sigma_dg, mk()), device=dev)
        cpu = torch.empty(4, 100_003)
        gaussian_rows([CryptoRNG(key=bytes([r]) * 32) for r in range(4)], cpu, 0.3)
        on = torch.empty(4, 100_003, device=dev)
        gaussian_rows([CryptoRNG(key=bytes([r]) * 32) for r in range(4)], on, 0.3)
        out["device_equals_cpu"] = bool(torch.equal(cpu, on.cpu()))
        mu4 = torch.randint(-1, 2, (4, 100_003), dtype=torch.int32)
        a = discrete_gaussian_rows(mu4, sigma_dg, [CryptoRNG(key=bytes([r]) * 32) for r in range(4)])
        b = discrete_gaussian_rows(mu4.to(dev), sigma_dg, [CryptoRNG(key=bytes([r]) * 32) for r in range(4)])
        out["device_dg_equals_cpu"] = bool(torch.equal(a, b.cpu()))
    return out


ROUNDS = {  # the setting-D shape: 100 clients a round, 5 SGD steps, batch 10, the thesis CNN
    "FL-STD": ("settings/setting-d-fl-std.toml", []),
    "FL-STD-DP": ("table-5.1/fl-std-dp_eps1.toml", []),
    "FL-SIGN-DP": ("table-5.1/fl-sign-dp_eps1.toml", []),
    "DP-SGD in clients": ("record-dp/setting-d-eps8.toml", []),
}


def dp_rounds(device: str = "cpu", rounds: int = 3, names: list[str] | None = None) -> dict:
    """Seconds per round (rounds after the first) for each row of ROUNDS on `device` with all host
    threads, and the noise share where the scheme reports its draw time (dp_noise_seconds)."""
    from dpfl.config import load_config
    from dpfl.engine.simulator import simulate
    from dpfl.experiments import configs_root
    from dpfl.run.state import Run

    res = {}
    for name in names or list(ROUNDS):
        path, extra = ROUNDS[name]
        cfg = load_config(configs_root() / path, [f"federation.rounds={rounds}", f"eval.every={rounds}",
                                                  f"run.device={device}", "run.threads=0", *extra])
        ms: list[dict] = []
        run = Run(cfg, None, log=lambda s: None)
        simulate(run, on_round=ms.append)
        later = ms[1:] or ms
        sec = [m["round_seconds"] - m.get("eval_seconds", 0.0) for m in later]
        r = {"round_s": min(sec), "round_s_mean": sum(sec) / len(sec)}
        for key in ("dp_noise_seconds", "secagg_seconds"):
            v = [m.get("step_" + key) for m in later]
            r[key.replace("_seconds", "_s")] = min(v) if all(x is not None for x in v) else None
        if cfg.train.dpsgd is not None:  # DP-SGD reports no draw time: the round's noise drawn alone
            n = sum(p.numel() for p in run.model.parameters())
            k, steps = cfg.federation.clients_per_round, cfg.train.steps
            dev = torch.device(device)
            z = torch.empty(k, n, device=dev)
            r["dp_noise_s"] = steps * _best(
                lambda k=k, z=z: gaussian_rows([CryptoRNG(key=bytes([i]) * 32) for i in range(k)], z, 1.0), 3, dev)
        res[name] = r
    base = res.get("FL-STD", {}).get("round_s")
    for r in res.values():
        r["ratio_to_fl_std"] = r["round_s"] / base if base else None
    return res


def round_noise(rows: int = 100, n: int = 1_663_370, threads: int | None = None) -> dict:
    """One round's Gaussian shares (rows x n, the setting-D CNN's parameters), drawn alone on the CPU
    in `threads` threads (rows in parallel, each from its own key): dpfl now and the sampler before."""
    from dpfl.threads import for_each

    out = torch.empty(rows, n)
    keys = [bytes([r % 256, r // 256]) * 16 for r in range(rows)]
    now = _best(lambda: gaussian_rows([CryptoRNG(key=k) for k in keys], out, 1.0, threads=threads), reps=2)
    before = _best(lambda: for_each(rows, lambda r: _before(keys[r], out[r], 1.0), threads=threads), reps=2)
    return {"rows": rows, "n": n, "threads": threads or torch.get_num_threads(), "now_s": now, "before_s": before,
            "factor": before / now}


def run_bench(n: int = 1 << 22, device: str | None = None, rounds: int = 3, with_rounds: bool = True,
              console: Console | None = None) -> dict:
    console = console or Console()
    rates = sampler_rates(n, device)
    t = Table(title=f"noise: values per second ({rates['n']:,} values; best of runs)")
    t.add_column("what")
    t.add_column("M/s", justify="right")
    kernel = f"C kernel, {_ISA_LABELS[rates['c_kernel']]}" if rates["c_kernel"] else "torch ops: no C kernel"
    for key, label in [("keystream_words_per_s", "ChaCha20 keystream, 64-bit words, 1 core (OpenSSL)"),
                       ("gaussian_per_s", f"dpfl Gaussian (ziggurat on that stream), 1 core ({kernel})"),
                       ("before_per_s", "before: AES-CTR + float64 Box–Muller, 1 core"),
                       ("torch_randn_per_s", "torch.randn (not cryptographic), 1 core"),
                       ("numpy_normal_per_s", "NumPy standard_normal (not cryptographic), 1 core"),
                       ("dg_per_s", "discrete Gaussian shares (table sampler), 1 core"
                                    + (" (C kernel lookup)" if "dg_numpy_per_s" in rates else "")),
                       ("dg_numpy_per_s", "  the same integers, lookup in NumPy"),
                       ("gaussian_all_cores_per_s", f"dpfl Gaussian, rows in {rates['threads']} threads")]:
        if key not in rates:
            continue
        t.add_row(label, f"{rates[key] / 1e6:,.1f}")
        if key == "gaussian_per_s":
            for name, r in rates["gaussian_per_s_by_kernel"].items():
                t.add_row(f"  the same values, C kernel capped at {_ISA_LABELS[name]}", f"{r / 1e6:,.1f}")
    if device:
        for key, label in [("device_keystream_words_per_s", "ChaCha20 keystream on the device"),
                           ("device_gaussian_per_s", "dpfl Gaussian on the device (100 rows)"),
                           ("device_torch_randn_per_s", "torch.randn on the device"),
                           ("device_dg_per_s", "discrete Gaussian shares on the device (100 rows)")]:
            t.add_row(f"{label} ({rates['device']})", f"{rates[key] / 1e6:,.1f}")
    console.print(t)
    console.print(f"Gaussian / keystream rate on one core: {rates['gaussian_ratio_to_keystream']:.2f} "
                  f"(target >= 0.5); vs the sampler before: {rates['gaussian_per_s'] / rates['before_per_s']:.2f}x")
    if device:
        console.print(f"device values equal the CPU's: Gaussian {rates['device_equals_cpu']}, "
                      f"discrete Gaussian {rates['device_dg_equals_cpu']}")
    rn = round_noise()
    console.print(f"one round's Gaussian shares ({rn['rows']} x {rn['n']:,}) drawn alone on the CPU in {rn['threads']} "
                  f"threads: {rn['now_s']:.3f} s now, {rn['before_s']:.3f} s with the sampler before "
                  f"({rn['factor']:.2f}x)")
    out = {"rates": rates, "round_noise_cpu": rn}
    if with_rounds:
        dev = device or "cpu"
        res = dp_rounds(dev, rounds)
        t = Table(title=f"one round of the setting-D shape on {dev} (rounds 2..{rounds}, best; evaluation excluded)")
        for c in ("scheme", "s/round", "x FL-STD", "noise draw s", "noise share", "secure sum s"):
            t.add_column(c, justify="right" if c != "scheme" else "left")
        fmt = lambda v: f"{v:.3f}" if v is not None else "-"
        for name, r in res.items():
            share = f"{r['dp_noise_s'] / r['round_s']:.0%}" if r["dp_noise_s"] is not None else "-"
            ratio = f"{r['ratio_to_fl_std']:.2f}" if r["ratio_to_fl_std"] else "-"
            t.add_row(name, f"{r['round_s']:.3f}", ratio, fmt(r["dp_noise_s"]), share, fmt(r["secagg_s"]))
        console.print(t)
        console.print("DP-SGD's noise draw time is the round's noise (clients x steps x parameters) drawn alone.")
        out["rounds"] = res
    return out
