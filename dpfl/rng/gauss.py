"""dpfl's one Gaussian sampler: the Marsaglia–Tsang ziggurat (256 layers) on 64-bit words of a
random stream, with the same values on the CPU and on any device.

Word w (int64) gives a candidate: layer i = w & 255, an odd integer j = (w >> 10) | 1 in
(-2^53, 2^53) (bits 8-9 unused), x = j · X[i] / 2^53. Fast path (about 99 % of words): accept x if
|j| < K[i] (= floor(2^53 · X[i+1] / X[i])). The others are resolved after all n values of a draw,
in index order, from the words that follow the n in the same stream: each still-open value takes 3
words per pass (two uniforms for the wedge or tail test, then a fresh candidate). Wedge:
f(X[i]) + u1 · (f(X[i+1]) − f(X[i])) < f(x); tail (layer 0): x' = −ln(u1)/r, y = −ln(u2), accept
r + x' with x's sign if 2y > x'². The value is (x · std) in float64, rounded to the output's dtype.

Bit-identical on every device: the fast path is integer work and one float64 product; the rare
path's exp and log are written here with + − × / only (no library transcendental, no fused
multiply-add), each op IEEE-rounded the same way on the CPU and a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch

from dpfl.rng.kernel import c_kernel

_gk = c_kernel()  # None where it is not built (tests set it to None for the torch path)

R = 3.6541528853610088  # Marsaglia & Tsang (2000), 256 layers
INV_R = 1.0 / R  # multiplied, never divided by: CUDA divides by a scalar as a product by its inverse
V = 4.92867323399e-3
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # fdlibm's split of ln 2
_SQRT2 = math.sqrt(2.0)
_PIECE = 4096  # candidates per call of the C slow pass (3 words each: 96 KiB)


def _layers() -> list[float]:
    f = lambda x: math.exp(-0.5 * x * x)
    x = [0.0] * 257
    x[0], x[1] = V / f(R), R
    for i in range(1, 255):
        x[i + 1] = math.sqrt(-2.0 * math.log(V / x[i] + f(x[i])))
    return x


@lru_cache(maxsize=8)
def tables(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X[i]/2^53 float64, K[i] int64, f(X[i]) float64 for i = 0..256) on `device`; computed on the
    host once, so every device reads the same numbers."""
    x = _layers()
    wt = torch.tensor([x[i] * 2.0**-53 for i in range(256)], dtype=torch.float64)
    kt = torch.tensor([int(x[i + 1] / x[i] * 2.0**53) for i in range(256)], dtype=torch.int64)
    fx = torch.tensor([math.exp(-0.5 * v * v) for v in x], dtype=torch.float64)
    return wt.to(device), kt.to(device), fx.to(device)


def fast(w: torch.Tensor, std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates of words `w` times std (float64) and the mask of the ones the fast path rejects."""
    wt, kt, _ = tables(str(w.device))
    i = w & 255
    j = (w >> 10) | 1
    x = j.to(torch.float64).mul_(torch.take(wt, i)).mul_(std)
    return x, j.abs_() >= torch.take(kt, i)


def uniform(w: torch.Tensor) -> torch.Tensor:
    """Open uniforms (k + 1/2) / 2^53 from the top 53 bits of each word."""
    return ((w >> 11) & ((1 << 53) - 1)).to(torch.float64).add_(0.5).mul_(2.0**-53)


def log(u: torch.Tensor) -> torch.Tensor:
    """ln u for normal float64 u > 0 (error about 1 ulp): ln m + e ln 2 with m in [√½, √2),
    ln m = 2s(1 + s²/3 + ... + s²⁰/21), s = (m − 1)/(m + 1)."""
    b = u.view(torch.int64)
    e = (b >> 52) - 1023
    m = ((b & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000).view(torch.float64)
    big = m > _SQRT2
    m = torch.where(big, m * 0.5, m)
    e = (e + big.to(torch.int64)).to(torch.float64)
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    p = torch.full_like(z, 1.0 / 23)
    for k in range(21, 0, -2):
        p.mul_(z).add_(1.0 / k)
    return (e * LN2_LO).add_(p.mul_(s + s)).add_(e.mul_(LN2_HI))


def exp_neg(t: torch.Tensor) -> torch.Tensor:
    """exp(−t) for float64 0 <= t < 700 (error about 1 ulp): 2^−k · exp(−r), |r| <= ln2/2, Taylor to r¹⁴."""
    k = torch.floor(t * (1.0 / math.log(2.0)) + 0.5)
    y = (k * LN2_HI).sub_(t).add_(k * LN2_LO)  # −r = −((t − k ln2_hi) − k ln2_lo)
    p = torch.full_like(y, 1.0 / math.factorial(14))
    for j in range(13, -1, -1):
        p.mul_(y).add_(1.0 / math.factorial(j))
    return p.mul_(((1023 - k.to(torch.int64)) << 52).view(torch.float64))


def resolve(cand: torch.Tensor, extra: Callable[[torch.Tensor], torch.Tensor], std: float) -> torch.Tensor:
    """Values (float64, times std) for the candidates the fast path rejected, in their order.
    `extra(todo)` gives [len(todo), 3]: for each still-open value (todo: ascending indices into
    cand), the next 3 words of its own stream, the streams read in index order."""
    out = torch.empty(cand.numel(), dtype=torch.float64, device=cand.device)
    todo = torch.arange(cand.numel(), device=cand.device)
    c = cand
    while todo.numel():
        e = extra(todo)  # [m, 3]
        done, val, nc = _pass(c, e, std)
        fin = done.nonzero().view(-1)
        out.index_copy_(0, todo.index_select(0, fin), val.index_select(0, fin))
        left = (~done).nonzero().view(-1)
        todo, c = todo.index_select(0, left), nc.index_select(0, left)
    return out


@lru_cache(maxsize=1)
def np_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`tables("cpu")` as NumPy arrays, for the C kernel."""
    return tuple(t.numpy() for t in tables("cpu"))


def resolve_into(out: np.ndarray, idx: np.ndarray, cand: np.ndarray, read: Callable[[int], np.ndarray],
                 std: float) -> None:
    """`resolve` by the C kernel, written straight to out[idx] (out: float32 or float64, idx and
    cand: int64, both overwritten), in NumPy only (no torch op: nothing for torch's intra-op threads
    to spin on while other rows are drawn in other threads). read(k): the next k words (int64).
    A pass runs in pieces of _PIECE candidates (their words stay in cache); each piece packs its
    still-open candidates, in order, and they are moved up behind the ones before."""
    wt, kt, fx = np_tables()
    m = cand.size
    while m:
        left = 0
        for a in range(0, m, _PIECE):
            b = min(a + _PIECE, m)
            k = _gk.slow(cand[a:b], idx[a:b], np.ascontiguousarray(read(3 * (b - a))), std, wt, kt, fx, out)
            if k and a > left:
                cand[left : left + k], idx[left : left + k] = cand[a : a + k], idx[a : a + k]
            left += k
        m = left


def _pass_c(c: torch.Tensor, e: torch.Tensor, std: float):
    """One pass of the C kernel as `_pass` gives it, (done, value, next candidate): for the tests."""
    m = c.numel()
    cand, idx, val = c.contiguous().numpy().copy(), np.arange(m, dtype=np.int64), np.zeros(m)
    k = _gk.slow(cand, idx, e.contiguous().numpy(), float(std), *np_tables(), val)
    done, nc = np.ones(m, dtype=bool), np.zeros(m, dtype=np.int64)
    done[idx[:k]], nc[idx[:k]] = False, cand[:k]
    return torch.from_numpy(done), torch.from_numpy(val), torch.from_numpy(nc)


def _pass(c: torch.Tensor, e: torch.Tensor, std: float):
    """One pass over the open candidates c with their 3 words e: (done, value, next candidate)."""
    wt, _, fx = tables(str(c.device))
    i = c & 255
    j = (c >> 10) | 1
    x = j.to(torch.float64).mul_(torch.take(wt, i))
    u1 = uniform(e[:, 0])
    lo = torch.take(fx, i)
    # wedge: f(X[i]) + u1 (f(X[i+1]) - f(X[i])) < exp(-x^2/2)  (layer 0 is replaced below)
    ok = (torch.take(fx, i + 1) - lo).mul_(u1).add_(lo) < exp_neg(x * x * 0.5)
    tail = (i == 0).nonzero().view(-1)
    if tail.numel():  # layer 0 beyond r: x' = -ln(u1)/r, y = -ln(u2), accept if 2y > x'^2: r + x', x's sign
        xt = -log(u1[tail]) * INV_R
        ok[tail] = (-log(uniform(e[tail, 1]))) * 2.0 > xt * xt
        x[tail] = torch.where(j[tail] < 0, -(xt + R), xt + R)
    nc = e[:, 2].contiguous()  # the others: a fresh candidate through the fast path
    x2, rej = fast(nc, std)
    return ok | ~rej, torch.where(ok, x.mul_(std), x2), nc
