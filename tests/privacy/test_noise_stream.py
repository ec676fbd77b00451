"""dpfl's noise stream: ChaCha20 (RFC 8439) computed by OpenSSL on the CPU and in tensor ops on a
device, and the one Gaussian sampler (the ziggurat) on it, bit-identical across paths, devices
and thread counts, and normal."""

import math
import platform
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import dpfl.rng as R
from dpfl.errors import PrivacyError
from dpfl.privacy import mechanisms as M
from dpfl.rng import CryptoRNG, Seeds, chacha, gauss, gaussian_cpu, gaussian_rows
from dpfl.rng import device as D

CUDA = torch.cuda.is_available()


def test_chacha20_known_answers_and_tensor_blocks_equal_openssl():
    # RFC 8439 A.1, test vectors 1 and 2 (zero key, zero nonce, block counters 0 and 1)
    ks = CryptoRNG(key=bytes(32)).bytes(128)
    assert ks[:16].hex() == "76b8e0ada0f13d90405d6ae55386bd28"
    assert ks[64:80].hex() == "9f07e7be5551387a98ba977c732d080d"
    rng = np.random.default_rng(1)
    keys = [rng.bytes(32) for _ in range(3)]
    kt = torch.tensor([chacha.key_words(k) for k in keys], dtype=torch.int64)
    ctr = torch.tensor([0, 5, 1 << 31, (1 << 32) - 1])
    for r, key in enumerate(keys):
        got = chacha.blocks_eager(kt, torch.full((4,), r), ctr)
        for b, c in enumerate(ctr.tolist()):
            g = CryptoRNG(key=key)
            g.advance(64 * c)
            assert np.array_equal(got[b].numpy().astype("<u4").view(np.uint8), np.frombuffer(g.bytes(64), np.uint8))


def test_positions_seek_and_word_readers_agree():
    key = bytes(range(32))
    whole = CryptoRNG(key=key).bytes(1000)
    g = CryptoRNG(key=key)
    g.bytes(3)
    g.advance(97)
    assert g.bytes(200) == whole[100:300] and g.position == 300
    kt = torch.tensor([chacha.key_words(key)] * 2, dtype=torch.int64)
    w64 = chacha.words64_rows(kt, torch.tensor([0, 13]), 40).numpy().view(np.uint64)
    assert np.array_equal(w64[1], np.frombuffer(whole[104:424], "<u8"))
    w32 = chacha.words32_rows(kt, torch.tensor([3, 0]), 50).numpy()
    assert np.array_equal(w32[0], np.frombuffer(whole[12:212], "<u4"))
    with pytest.raises(ValueError, match="2\\^32"):
        CryptoRNG(key=key).advance((64 << 32) + 1)


def _draw(g, n, std, dtype, skip=0):
    g.bytes(skip)
    out = torch.empty(n, dtype=dtype)
    g.gaussian_into(out, std)
    return out, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_sampler_every_path_bit_for_bit(dtype, monkeypatch):
    """The C kernel, the torch fallback and the device path (ChaCha20 in tensor ops) give the same
    values and leave each stream at the same position, for sizes across chunk edges."""
    monkeypatch.setattr(R, "_CHUNK", 4096)
    for n in (1, 7, 4097, 60_001):
        for std in (0.7, 0.0):
            want, g1 = _draw(Seeds(3).crypto("x", n), n, std, dtype)
            monkeypatch.setattr(gauss, "_gk", None)
            py, g2 = _draw(Seeds(3).crypto("x", n), n, std, dtype)
            monkeypatch.undo()
            monkeypatch.setattr(R, "_CHUNK", 4096)
            rows = [Seeds(3).crypto("x", n), Seeds(4).crypto("y")]
            rows[1].bytes(40)
            dev = torch.empty(2, n, dtype=dtype)
            D.gaussian_rows(rows, dev, std)
            other, _ = _draw(Seeds(4).crypto("y"), n, std, dtype, skip=40)
            assert torch.equal(want, py) and torch.equal(want, dev[0]) and torch.equal(other, dev[1]), (n, std)
            assert g1.position == g2.position == rows[0].position >= 8 * n
            assert g1.bytes(8) == g2.bytes(8) == rows[0].bytes(8)


def test_rows_do_not_depend_on_threads_and_odd_positions_take_the_cpu():
    def rows(skip):
        gs = [Seeds(9).crypto("r", i) for i in range(5)]
        gs[2].bytes(skip)
        return gs

    a, b, c = torch.empty(5, 30_001), torch.empty(5, 30_001), torch.empty(5, 30_001)
    gaussian_rows(rows(3), a, 1.3, threads=1)
    gaussian_rows(rows(3), b, 1.3, threads=4)
    D.gaussian_rows(rows(3), c, 1.3)  # row 2 is not at a word boundary: drawn on the CPU
    assert torch.equal(a, b) and torch.equal(a, c)


def test_many_rejects_and_other_dtypes_equal_the_torch_ops(monkeypatch):
    """A stream whose first words all miss the fast path (layer 255): the reject list grows past
    its first size and a pass runs in many pieces; and float16 / bfloat16 (torch ops either way)."""
    words = np.random.default_rng(5).integers(-(2**63), 2**63 - 1, 2_000_000, dtype=np.int64)
    words[:300_000] |= 255

    def reader():
        at = [0]

        def read(m):
            at[0] += m
            return words[at[0] - m : at[0]]

        return read, at

    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        (ra, at_a), (rb, at_b) = reader(), reader()
        a = gaussian_cpu(ra, torch.empty(400_000, dtype=dtype), 0.8)
        with monkeypatch.context() as mp:
            mp.setattr(gauss, "_gk", None)
            b = gaussian_cpu(rb, torch.empty(400_000, dtype=dtype), 0.8)
        assert torch.equal(a, b) and at_a[0] == at_b[0] > 1_300_000, dtype
    g = Seeds(6).crypto("half")
    half = g.gaussian_into(torch.empty(10_001, dtype=torch.float16), 1.0)
    assert torch.isfinite(half).all() and g.position >= 8 * 10_001


def _levels() -> list[int]:
    """The C kernel's vector paths this CPU can run: 0 plain C, 1 AVX2, 2 AVX-512."""
    return list(range(["plain", "avx2", "avx512"].index(gauss._gk.isa()) + 1)) if gauss._gk else []


def test_the_c_kernel_takes_the_widest_path_this_cpu_has():
    """isa() against the CPU's own flags (x86-64 Linux), so that the per-path tests below cannot
    quietly test plain C alone on a CPU with vector instructions."""
    cpuinfo = Path("/proc/cpuinfo")
    if gauss._gk is None or not cpuinfo.is_file() or platform.machine() != "x86_64":
        pytest.skip("C kernel not built, or not x86-64 Linux")
    flags = set(next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")).split())
    want = "avx512" if {"avx512f", "avx512dq", "avx512vl", "avx512bw"} <= flags else "avx2" if "avx2" in flags else "plain"
    assert gauss._gk.isa() == want
    cap = gauss._gk.limit(0)
    try:
        assert gauss._gk.isa() == "plain" and gauss._gk.limit(0) == 0
    finally:
        gauss._gk.limit(cap)
    assert gauss._gk.isa() == want


def test_every_vector_path_of_the_c_kernel_gives_the_torch_values(monkeypatch):
    """Each instruction set the kernel has and this CPU runs (plain C, AVX2, AVX-512) gives the
    torch ops' values and stream position: sizes across its 4-word groups and 4096-word blocks,
    float32 and float64, a stream of extreme words (|j| near 2^53, every layer, the tail layer 0)
    and one whose first words all miss the fast path."""
    if gauss._gk is None:
        pytest.skip("C kernel not built")
    rng = np.random.default_rng(11)
    words = rng.integers(-(2**63), 2**63 - 1, 4_000_000, dtype=np.int64)
    words[:200_000] |= 255  # every one rejected: many slow passes
    words[200_000:203_000] &= ~255  # layer 0
    ext = np.array([-(2**63), 2**63 - 1, -1, 0, 1023, -1024, 2**53, -(2**53)], dtype=np.int64)
    words[203_000:211_000] = np.tile(ext, 1000) ^ rng.integers(0, 256, 8000)

    def draw(n, dtype, at):
        pos = [at]

        def read(m):
            pos[0] += m
            return words[pos[0] - m : pos[0]]

        return gaussian_cpu(read, torch.empty(n, dtype=dtype), 0.9), pos[0]

    cases = [(n, 211_000 - n) for n in (1, 3, 4, 5, 4095, 4096, 4097, 9_003)] + [(300_001, 0), (300_001, 1_000_000)]
    want = {}
    with monkeypatch.context() as mp:
        mp.setattr(gauss, "_gk", None)
        for dtype in (torch.float32, torch.float64):
            for n, at in cases:
                want[dtype, n, at] = draw(n, dtype, at)
    cap = gauss._gk.limit(2)
    try:
        for level in _levels():
            gauss._gk.limit(level)
            for (dtype, n, at), (vals, pos) in want.items():
                got, gpos = draw(n, dtype, at)
                assert torch.equal(got, vals) and gpos == pos, (level, dtype, n, at)
    finally:
        gauss._gk.limit(cap)
    with pytest.raises(ValueError, match="level must be"):
        gauss._gk.limit(3)


def test_the_slow_path_in_c_equals_torch_and_log_exp_are_accurate():
    if gauss._gk is None:
        pytest.skip("C kernel not built")
    g = Seeds(2).crypto("slow")
    w = torch.from_numpy(g.uint64(400_000).view(np.int64).copy())
    _, bad = gauss.fast(w, 1.0)
    cand = torch.cat([w[bad], w[(w & 255) == 0][:2000]])  # wedge rejects, and layer-0 words (tail)
    e = torch.from_numpy(g.uint64(3 * cand.numel()).view(np.int64).copy()).view(-1, 3)
    b = gauss._pass(cand, e, 0.9)
    cap = gauss._gk.limit(2)
    try:
        for level in _levels():  # each vector path of the pass, and plain C
            gauss._gk.limit(level)
            a = gauss._pass_c(cand, e, 0.9)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1][a[0]], b[1][a[0]]) and torch.equal(a[2][~a[0]], b[2][~a[0]])
    finally:
        gauss._gk.limit(cap)
    u = torch.rand(100_000, dtype=torch.float64).add_(1e-300)
    assert ((gauss.log(u) - u.log()).abs() <= 6e-16 * u.log().abs()).all()  # within 3 ulp
    assert repr(gauss.INV_R) in Path(gauss.__file__).with_name("_gausskernel.c").read_text()
    t = torch.rand(100_000, dtype=torch.float64) * 50
    assert ((gauss.exp_neg(t) - (-t).exp()).abs() <= 4e-16 * (-t).exp()).all()


def _reference(words):
    """Marsaglia–Tsang's ziggurat written out per value in Python (math.exp / math.log), on the
    same stream layout: fast path on the n words, then 3 words per open value per pass."""
    x = gauss._layers()
    f = lambda v: math.exp(-0.5 * v * v)
    vals, open_ = {}, []

    def cand(wd):
        i, j = wd & 255, (wd >> 10) | 1
        return i, j, j * (x[i] * 2.0**-53)

    for e in range(len(words)):
        i, j, v = cand(int(words[e]))
        if abs(j) < int(x[i + 1] / x[i] * 2.0**53):
            vals[e] = v
        else:
            open_.append((e, int(words[e])))
    return vals, open_, f, x, cand


def test_the_sampler_against_a_per_value_reference():
    n = 200_000
    g = Seeds(11).crypto("ref")
    got = g.gaussian_into(torch.empty(n, dtype=torch.float64), 1.0)
    words = Seeds(11).crypto("ref").uint64(n + 200_000).view(np.int64)
    vals, open_, f, x, cand = _reference(words[:n])
    for e, v in vals.items():
        assert got[e].item() == v  # the fast path: the same product, exactly
    pos = n
    while open_:
        nxt = []
        for e, wd in open_:
            u1, u2, fresh = (int(t) for t in words[pos : pos + 3])
            pos += 3
            uni = lambda t: (((t >> 11) & ((1 << 53) - 1)) + 0.5) * 2.0**-53
            i, j, v = cand(wd)
            if i == 0:
                xt = -math.log(uni(u1)) * gauss.INV_R
                ok, v = -math.log(uni(u2)) * 2 > xt * xt, math.copysign(gauss.R + xt, j)
            else:
                ok = f(x[i]) + uni(u1) * (f(x[i + 1]) - f(x[i])) < f(v)
            if not ok:
                i, j, v = cand(fresh)
                if abs(j) >= int(x[i + 1] / x[i] * 2.0**53):
                    nxt.append((e, fresh))
                    continue
            assert got[e].item() == pytest.approx(v, rel=1e-15, abs=1e-300)
        open_ = nxt
    assert g.position == 8 * pos


def test_gaussian_is_normal_with_the_right_tails():
    z = M.gaussian_noise(1_000_000, 2.5, CryptoRNG(key=b"n" * 32)) / 2.5
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5e-3 and abs(z.var() - 1) < 5e-3 and abs(stats.skew(z)) < 0.01
    for t in (1.0, 2.0, 3.0, gauss.R, 4.0):  # tail mass beyond the layers' edge r, too
        p = 2 * stats.norm.sf(t)
        k = int((np.abs(z) > t).sum())
        assert abs(k - p * z.size) < 5 * math.sqrt(p * z.size) + 1, t
    w = M.gaussian_noise(400_000, 1.0, np.random.default_rng(4))  # the same sampler on numpy's words
    assert stats.kstest(w, "norm").pvalue > 1e-3
    words = np.random.default_rng(4).integers(0, 1 << 64, size=420_000, dtype=np.uint64).view(np.int64)
    at = [0]

    def read(m):
        at[0] += m
        return words[at[0] - m : at[0]]

    assert np.array_equal(gaussian_cpu(read, torch.empty(400_000, dtype=torch.float64), 1.0).numpy(), w)


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_rows_equal_the_cpu_bit_for_bit():
    for dtype in (torch.float32, torch.float64):
        for n in (1, 9, 1_000_003):
            cpu = torch.empty(6, n, dtype=dtype)
            gpu_rngs = [Seeds(5).crypto("c", r) for r in range(6)]
            cpu_rngs = [Seeds(5).crypto("c", r) for r in range(6)]
            gaussian_rows(cpu_rngs, cpu, 0.37)
            gpu = torch.empty(6, n, dtype=dtype, device="cuda")
            gaussian_rows(gpu_rngs, gpu, 0.37)
            assert torch.equal(cpu, gpu.cpu()), (dtype, n)
            assert [g.position for g in gpu_rngs] == [g.position for g in cpu_rngs]
    kt = torch.tensor([chacha.key_words(bytes([7]) * 32)], dtype=torch.int64)
    idx, ctr = torch.zeros(1000, dtype=torch.int64), torch.arange(1000) * 7919
    assert torch.equal(chacha.blocks(kt.cuda(), idx.cuda(), ctr.cuda()).cpu(), chacha.blocks_eager(kt, idx, ctr))


@pytest.mark.parametrize("sigma", [3.0, 150.0, 1300.0])
def test_discrete_gaussian_rows_in_tensor_ops_equal_the_cpu_sampler(sigma):
    """The device path of the integer shares (table lookups in tensor ops, the rare exact cases on
    the CPU), run on CPU tensors: the CPU sampler's integers and stream positions, odd positions too."""
    from dpfl.privacy.samplers import _gaussian_table, _rows_tensor, discrete_gaussian

    mu = torch.randint(-1, 2, (4, 200_000), generator=torch.Generator().manual_seed(0), dtype=torch.int32)

    def rngs():
        gs = [Seeds(1).crypto("dg", r) for r in range(4)]
        gs[1].bytes(4)
        gs[2].bytes(3)  # not at a 32-bit boundary: the CPU sampler
        return gs

    a, b = rngs(), rngs()
    want = [discrete_gaussian(mu[r].numpy().astype(np.int64), sigma, g) for r, g in enumerate(a)]
    got = _rows_tensor(mu, sigma, b, host=False)
    assert all(np.array_equal(want[r], got[r].numpy()) for r in range(4))
    assert [g.position for g in a] == [g.position for g in b]
    shared = Seeds(1).crypto("dg", 9)
    with pytest.raises(PrivacyError, match="generator of its own"):  # rows in threads: no stream twice
        _rows_tensor(mu[:2], sigma, [shared, shared], host=True)
    with pytest.raises(ValueError, match="generator of its own"):
        gaussian_rows([shared, shared], torch.empty(2, 10), 1.0)
    was = torch.get_num_threads()
    try:  # the CPU path: rows in threads, the same integers and positions on 1 and 3 threads
        for threads in (1, 3):
            torch.set_num_threads(threads)
            c = rngs()
            host = _rows_tensor(mu, sigma, c, host=True)
            assert all(np.array_equal(want[r], host[r].numpy()) for r in range(4)), threads
            assert [g.position for g in a] == [g.position for g in c]
    finally:
        torch.set_num_threads(was)
    # the exact path was taken (its 96 extra bits seldom decide an atom at these sizes: what this
    # checks of them is how many each row reads, through the stream positions above)
    if sigma > 100:
        w = torch.from_numpy(Seeds(1).crypto("dg", 0).uint32(200_000).astype(np.int64))
        assert int(_gaussian_table(sigma).lookup(w, torch)[1].sum()) > 0


def test_bench_noise_refuses_a_device_it_cannot_use_in_one_line():
    from typer.testing import CliRunner

    from dpfl.cli.main import app

    r = CliRunner().invoke(app, ["bench", "noise", "--device", "nosuch", "--no-rounds"])
    assert r.exit_code != 0 and "--device must be 'cuda' or 'cuda:N'" in r.output and "Traceback" not in r.output
    if not CUDA:
        r = CliRunner().invoke(app, ["bench", "noise", "--device", "cuda", "--no-rounds"])
        assert r.exit_code != 0 and "torch sees no CUDA device" in r.output


def test_bench_noise_names_the_kernel_path_and_times_each_narrower_one():
    """`dpfl bench noise` says which C kernel path drew the Gaussians and times every narrower path
    this CPU has (the same values), and leaves the kernel uncapped."""
    from typer.testing import CliRunner

    from dpfl.cli.main import app

    r = CliRunner().invoke(app, ["bench", "noise", "--values", "8192", "--no-rounds", "--json"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    import json

    rates = json.loads(r.output[r.output.index("\n{") :])["rates"]  # the JSON, printed last
    isa = gauss._gk.isa() if gauss._gk else None
    assert rates["c_kernel"] == isa
    assert list(rates["gaussian_per_s_by_kernel"]) == ["plain", "avx2", "avx512"][: max(len(_levels()) - 1, 0)]
    assert all(v > 0 for v in rates["gaussian_per_s_by_kernel"].values())
    assert ("C kernel, " in r.output) == (isa is not None) and (gauss._gk is None or gauss._gk.isa() == isa)
