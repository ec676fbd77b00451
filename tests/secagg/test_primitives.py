import itertools
import os
import subprocess
import sys
from collections import deque

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import CryptoRNG
from dpfl.secagg import graph, keys, prg, shamir

SEED = bytes(range(32))


def _keystream(seed: bytes, nbytes: int) -> bytes:
    """Reference: raw AES-256 (ECB) on the counter blocks s‖j+2 of each segment s (no GCM, no CTR)."""
    per = prg.SEGMENT_BYTES // 16
    blocks = b"".join(
        s.to_bytes(12, "big") + (j + 2).to_bytes(4, "big")
        for s in range(-(-nbytes // prg.SEGMENT_BYTES))
        for j in range(per)
    )
    return Cipher(algorithms.AES(seed), modes.ECB()).encryptor().update(blocks)[:nbytes]


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_expand_is_aes_in_counter_mode(dtype):
    d = prg.SEGMENT_BYTES // np.dtype(dtype).itemsize * 2 + 3  # several segments and a ragged tail
    ref = np.frombuffer(
        _keystream(SEED, d * np.dtype(dtype).itemsize), dtype=np.dtype(dtype).newbyteorder("<")
    )
    assert np.array_equal(prg.expand(SEED, d, dtype), ref)
    y = np.zeros((1, d), dtype=dtype)
    assert np.array_equal(prg.mask_rows(y, [[(SEED, 1)]], use_native=False)[0], ref)  # the pure-Python path


needs_kernel = pytest.mark.skipif(prg._native is None, reason="C mask kernel not built or CPU lacks AES-NI")
LEVELS = range(1, prg._native.cpu_level() + 1) if prg._native is not None else []  # AES-NI, VAES-256, VAES-512


@needs_kernel
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype,bits", [(np.uint32, 22), (np.uint32, None), (np.uint64, 40)])
def test_c_kernel_gives_the_python_paths_words(dtype, bits, level, monkeypatch):
    monkeypatch.setattr(prg, "_level", level)
    rng = np.random.default_rng(5)
    item = np.dtype(dtype).itemsize
    for d in (1, 3, 17, 1025, prg.SEGMENT_BYTES // item * 2 + 5):  # ragged blocks, several segments
        k = 9
        y = rng.integers(0, 1 << 20, size=(k, d)).astype(dtype)
        masks = [[] for _ in range(k)]
        for i in range(14):
            seed = rng.bytes(32)
            a, b = rng.choice(k - 1, 2, replace=False)  # row k − 1 keeps no masks
            masks[a].append((seed, 1))
            if i % 3:
                masks[b].append((seed, -1))
        fast, slow = y.copy(), y.copy()
        prg.mask_rows(fast, masks, workers=2, bits=bits)
        prg.mask_rows(slow, masks, workers=1, bits=bits, use_native=False)
        assert np.array_equal(fast, slow)
        assert np.array_equal(fast[k - 1], y[k - 1])


@needs_kernel
def test_c_kernel_rejects_plans_outside_the_matrix():
    y = np.zeros((2, 64), dtype=np.uint32)
    ptr, sign, none = np.array([0, 1], np.int64), np.ones(1, np.int8), np.zeros(0, np.int64)

    def call(row, c0=0, nbytes=256, sign=sign):
        prg._native.mask_segment(y, 256, 4, 0, c0, nbytes, prg.SEGMENT_BYTES, SEED, ptr,
                                 np.array([row], np.int64), sign, np.zeros(2, np.int64), none, 0, 1)

    call(1)
    with pytest.raises(ValueError, match="out of range"):
        call(2)
    with pytest.raises(ValueError, match="out of range"):
        call(-1)
    with pytest.raises(ValueError, match="inconsistent"):
        call(0, c0=64)  # not the start of the segment
    with pytest.raises(ValueError, match="out of range"):
        call(1, nbytes=512)  # past the end of the buffer
    with pytest.raises(ValueError, match="out of range"):
        call(1, sign=np.zeros(1, np.int8))  # a sign other than ±1
    with pytest.raises(RuntimeError, match="level 4 not available"):
        prg._native.mask_segment(y, 256, 4, 0, 0, 256, prg.SEGMENT_BYTES, SEED, ptr, np.array([0], np.int64),
                                 sign, np.zeros(2, np.int64), none, 0, 4)


def test_apply_masks_adds_and_subtracts_mod_word():
    d = 70_001
    s1, s2 = b"\x01" * 32, b"\x02" * 32
    y = np.arange(d, dtype=np.uint32)
    prg.apply_masks(y, [(s1, 1), (s2, -1)])
    ref = (
        np.arange(d, dtype=np.int64) + prg.expand(s1, d).astype(np.int64) - prg.expand(s2, d).astype(np.int64)
    ) % 2**32
    assert np.array_equal(y, ref.astype(np.uint32))
    prg.apply_masks(y, [(s2, 1), (s1, -1)])  # masks cancel
    assert np.array_equal(y, np.arange(d, dtype=np.uint32))
    with pytest.raises(ConfigError):
        prg.apply_masks(np.zeros(4, np.int64), [(s1, 1)])
    with pytest.raises(ConfigError):
        prg.apply_masks(np.zeros(4, np.uint32), [(b"short", 1)])


def test_mask_rows_reduces_masked_rows_only_and_ignores_thread_count():
    d, bits = prg.SEGMENT_BYTES // 4 * 3 + 7, 22  # several segments: threads take different ones
    s1, s2 = b"\x03" * 32, b"\x04" * 32
    x = np.random.default_rng(0).integers(0, 1 << bits, size=(3, d), dtype=np.uint32)
    masks = [[(s1, 1), (s2, 1)], [(s1, -1)], []]  # row 2 has no masks (a dropped client's row)
    ref = x.astype(np.int64)
    ref[0] += prg.expand(s1, d).astype(np.int64) + prg.expand(s2, d).astype(np.int64)
    ref[1] -= prg.expand(s1, d).astype(np.int64)
    ref[:2] %= 1 << bits
    for workers in (1, 2, 3):
        y = x.copy()
        prg.mask_rows(y, masks, workers, bits=bits)
        assert np.array_equal(y, ref)
    y = x.copy()
    prg.mask_rows(y, masks, 2)  # without bits: words mod 2^32, so the high bits are set somewhere
    assert int(y[0].max()) >> bits and np.array_equal(y[0] & np.uint32((1 << bits) - 1), ref[0])


def test_mask_words_are_uniform():
    w = prg.expand(SEED, 64_000) & np.uint32(255)
    counts = np.bincount(w, minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_key_agreement_is_symmetric_and_bound_to_purpose_and_round():
    a, b = keys.new_private_key(CryptoRNG(key=b"a" * 32)), keys.new_private_key(CryptoRNG(key=b"b" * 32))
    ka = keys.agree(a, keys.public_bytes(b), "mask", 3)
    assert ka == keys.agree(b, keys.public_bytes(a), "mask", 3)
    assert ka != keys.agree(a, keys.public_bytes(b), "mask", 4)
    assert ka != keys.agree(a, keys.public_bytes(b), "share-encryption", 3)
    assert keys.load_private(keys.private_bytes(a)).public_key().public_bytes_raw() == keys.public_bytes(a)
    with pytest.raises(ProtocolError):
        keys.agree(a, b"\x00" * 31, "mask", 3)
    with pytest.raises(ProtocolError):
        keys.agree(a, b"\x00" * 32, "mask", 3)  # low-order point → all-zero secret


def test_shamir_any_t_shares_reconstruct():
    rng = CryptoRNG(key=b"s" * 32)
    secret = bytes(reversed(range(32)))
    n, t = 7, 4
    shares = shamir.split(secret, t, range(1, n + 1), rng)
    for subset in itertools.combinations(sorted(shares), t):
        assert shamir.combine({x: shares[x] for x in subset}, t) == secret
    for subset in itertools.combinations(sorted(shares), t - 1):
        with pytest.raises(ProtocolError, match="need 4 shares"):
            shamir.combine({x: shares[x] for x in subset}, t)


def test_shamir_t_minus_one_shares_do_not_determine_the_secret():
    rng = CryptoRNG(key=b"u" * 32)
    # t − 1 = 1 share of two different secrets: the share's limbs are uniform either way
    for secret in (b"\x00" * 32, b"\xff" * 32):
        vals = np.array(
            [shamir.share_values(shamir.split(secret, 2, [1, 2], rng)[1])[0] for _ in range(1600)]
        )
        assert stats.chisquare(np.bincount(vals % 16, minlength=16)).pvalue > 1e-4
    # t − 1 real shares plus a wrong last one give some other value (or an error), not the secret
    s = b"\x11" * 32
    sh = shamir.split(s, 3, [1, 2, 3], rng)
    fake = dict(sh)
    fake[3] = shamir.split(b"\x22" * 32, 3, [1, 2, 3], rng)[3]
    try:
        assert shamir.combine(fake, 3) != s
    except ProtocolError:
        pass


def test_shamir_rejects_malformed_shares_and_parameters():
    rng = CryptoRNG(key=b"v" * 32)
    with pytest.raises(ConfigError):
        shamir.split(b"\x00" * 32, 0, [1, 2], rng)
    with pytest.raises(ConfigError):
        shamir.split(b"\x00" * 32, 3, [1, 2], rng)
    with pytest.raises(ConfigError):
        shamir.split(b"\x00" * 31, 1, [1], rng)
    with pytest.raises(ProtocolError, match="36 bytes"):
        shamir.share_values(b"\x00" * 35)
    with pytest.raises(ProtocolError, match="outside the field"):
        shamir.share_values(b"\xff" * 36)


def _connected(nodes: set[int], adj: dict[int, tuple[int, ...]]) -> bool:
    if len(nodes) <= 1:
        return True
    start = next(iter(nodes))
    seen, todo = {start}, deque([start])
    while todo:
        u = todo.popleft()
        for v in adj[u]:
            if v in nodes and v not in seen:
                seen.add(v)
                todo.append(v)
    return seen == nodes


def test_harary_graph_is_k_regular_symmetric_and_random():
    g = graph.harary_graph(30, 6, CryptoRNG(key=b"g" * 32))
    assert all(len(nb) == 6 for nb in g.values())
    assert all(u in g[v] for u in g for v in g[u])
    assert _connected(set(g), g)
    assert g != graph.harary_graph(30, 6, CryptoRNG(key=b"h" * 32))
    with pytest.raises(ConfigError, match="even"):
        graph.harary_graph(30, 5, CryptoRNG(key=b"g" * 32))


def test_disconnection_criterion_and_bound_by_brute_force():
    # On H(n, k) the survivors are disconnected iff the removed positions hold two disjoint runs of k/2;
    # the bound of failure_bound(ii) must dominate the exact probability over uniformly placed removals.
    n, k = 12, 4
    h = k // 2
    adj = {u: tuple((u + s) % n for s in range(-h, h + 1) if s) for u in range(n)}
    for r in range(n - 1):
        bad = 0
        for removed in itertools.combinations(range(n), r):
            rem = set(removed)
            disc = not _connected(set(range(n)) - rem, adj)
            runs = []
            start = next((p for p in range(n) if p not in rem), None)
            run = 0
            for step in range(1, n + 1):  # walk the cycle from a survivor
                p = (start + step) % n
                if p in rem:
                    run += 1
                else:
                    runs.append(run)
                    run = 0
            assert disc == (sum(x >= h for x in runs) >= 2)
            bad += disc
        exact = bad / len(list(itertools.combinations(range(n), r)))
        assert graph.failure_bound(n, k, k, 0, r) >= exact - 1e-12


def test_security_bits_complete_graph():
    assert graph.security_bits(100, 99, 50, 5, 30) == float("inf")
    assert graph.security_bits(100, 99, 50, 60, 0) < 1  # a corrupt majority of shareholders breaks it


@pytest.mark.parametrize("choice,expect", [("0", "None"), ("aesni", "aes-ni")])
def test_environment_chooses_the_mask_path(choice, expect):
    if expect != "None" and prg._native is None:
        pytest.skip("C mask kernel not built or CPU lacks AES-NI")
    code = "from dpfl.secagg import prg; print(prg.kernel_in_use())"
    env = {**os.environ, "DPFL_SECAGG_KERNEL": choice}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expect


def test_an_unknown_kernel_choice_is_refused_where_masks_are_made(monkeypatch):
    from dpfl.errors import ConfigError

    monkeypatch.setenv("DPFL_SECAGG_KERNEL", "vaes")
    with pytest.raises(ConfigError, match="DPFL_SECAGG_KERNEL must be 0"):
        prg.kernel_in_use()
    with pytest.raises(ConfigError, match="DPFL_SECAGG_KERNEL must be 0"):
        prg.mask_rows(np.zeros((2, 8), np.uint32), [[], []])
    from dpfl.bench import secagg as bench

    def no_round():
        raise AssertionError("the bench timed a training round before it checked the kernel choice")

    monkeypatch.setattr("dpfl.bench.engine.training_round_seconds", no_round)
    with pytest.raises(ConfigError, match="DPFL_SECAGG_KERNEL must be 0"):
        bench.run_bench(clients=2, params=8)
