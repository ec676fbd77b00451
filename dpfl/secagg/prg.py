"""Mask expansion: a 32-byte seed → a stream of words in Z_(2^32) or Z_(2^64) (AES-256 counter mode).

Word i of PRG(seed) is bytes [w·i, w·(i+1)) (little-endian, w = word size) of this keystream:
segment s (bytes [s·L, (s+1)·L), L = SEGMENT_BYTES) is the AES-256-CTR keystream under key
`seed` with counter blocks s‖2, s‖3, ... (s: 96-bit big-endian, then a 32-bit big-endian block
counter), that is AES-256-GCM's encryption of zeros under nonce s, whose VAES kernel in OpenSSL
runs about twice as fast as its CTR mode. The counter blocks of different segments never meet,
so the stream is AES in counter mode over distinct blocks (a PRF stream); every seed is used
once (seeds are derived per round and per pair). The GCM tag is never computed or used.
Reducing a uniform word mod 2^b gives a uniform element of Z_(2^b).

`mask_rows` adds/subtracts streams into the rows of a matrix one column segment at a time:
a seed used by several rows (both ends of a pair) is expanded once per segment, the seeds are
visited in a row order of small bandwidth (reverse Cuthill–McKee on the rows-share-a-seed
graph: the ring order of a SecAgg+ Harary graph), so that the few rows a stretch of seeds
touches stay in cache, and segments are handed to several threads (a segment is its own
counter range; OpenSSL and NumPy release the GIL on calls this large), with bit-identical
results (addition mod 2^w commutes).
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from dpfl.errors import ConfigError
from dpfl.threads import for_each

try:  # the optional C kernel (setup.py): same words; level 3 = VAES + AVX-512, 2 = VAES + AVX2, 1 = AES-NI
    _native = importlib.import_module("dpfl.secagg._maskkernel")  # by name: a compiled module, not a .py

    _level = _native.cpu_level()
    _choice = os.environ.get("DPFL_SECAGG_KERNEL", "")  # "0": OpenSSL + NumPy path, "aesni": level ≤ 1
    _level = 0 if _choice == "0" else min(_level, 1) if _choice == "aesni" else _level
    if not _level:
        _native = None
except ImportError:  # not compiled on this platform
    _native, _level = None, 0


def _check_choice() -> None:
    """DPFL_SECAGG_KERNEL, checked where masks are made (a ConfigError there is one line of the CLI)."""
    choice = os.environ.get("DPFL_SECAGG_KERNEL", "")
    if choice not in ("", "0", "aesni"):
        raise ConfigError(f"DPFL_SECAGG_KERNEL must be 0 (OpenSSL + NumPy) or aesni, got {choice!r}")


def kernel_in_use() -> str | None:
    """The C kernel computing the masks ("vaes-512", "vaes-256" or "aes-ni"), or None (OpenSSL via
    `cryptography` + NumPy)."""
    _check_choice()
    return {3: "vaes-512", 2: "vaes-256", 1: "aes-ni"}.get(_level) if _native is not None else None


SEED_BYTES = 32
SEGMENT_BYTES = 1 << 19  # keystream bytes under one nonce (part of the PRG's definition), one call each
_ZEROS = bytes(SEGMENT_BYTES)

Mask = tuple[bytes, int]  # (seed, sign ∈ {+1, −1})


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _stream(seed: bytes, segment: int):
    """The encryptor whose output on zeros is segment `segment` of PRG(seed)."""
    return Cipher(algorithms.AES(seed), modes.GCM(segment.to_bytes(12, "big"))).encryptor()


def expand(seed: bytes, d: int, dtype: type = np.uint32) -> np.ndarray:
    """The first d words of PRG(seed) (dtype uint32 or uint64)."""
    out = np.zeros(d, dtype=dtype)
    return apply_masks(out, [(seed, 1)])


def apply_masks(
    y: np.ndarray, masks: Sequence[Mask], workers: int = 1, bits: int | None = None
) -> np.ndarray:
    """In place: y ← y + Σ sign·PRG(seed) mod 2^(word bits), then mod 2^bits if given and masks are."""
    if y.ndim != 1:
        raise ConfigError(f"apply_masks needs a 1-D vector, got shape {y.shape}")
    mask_rows(y[None, :], [masks], workers, bits)
    return y


def _local_order(uses: dict[bytes, list[tuple[int, int]]], k: int) -> dict[bytes, list[tuple[int, int]]]:
    """The seeds reordered by the first row they touch in a low-bandwidth row order."""
    pairs = [(a, b) for rows in uses.values() for (a, _), (b, _) in itertools.pairwise(rows)]
    if not pairs:
        return uses
    from scipy.sparse import coo_matrix  # the row order of a whole cohort (simulation): not on a client
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    a, b = np.array(pairs).T
    graph = coo_matrix((np.ones(2 * a.size), (np.r_[a, b], np.r_[b, a])), shape=(k, k)).tocsr()
    rank = np.empty(k, dtype=np.int64)
    rank[reverse_cuthill_mckee(graph, symmetric_mode=True)] = np.arange(k)
    return dict(sorted(uses.items(), key=lambda kv: min(rank[r] for r, _ in kv[1])))


def _python_runner(y, plan, keep):
    item, seg = y.itemsize, SEGMENT_BYTES // y.itemsize
    zeros, local = memoryview(_ZEROS), threading.local()

    def run(s: int) -> None:
        if not hasattr(local, "raw"):  # one keystream buffer per thread, reused
            local.raw = bytearray(SEGMENT_BYTES + 16)  # spare bytes: older `update_into` wants block_size − 1 more
            local.buf = np.frombuffer(local.raw, dtype=y.dtype.newbyteorder("<"), count=seg)
        start = s * seg
        m = min(seg, y.shape[1] - start)
        ks = local.buf[:m]
        for seed, rows, done in plan:
            _stream(seed, s).update_into(zeros[: m * item], local.raw)
            for row, op in rows:
                part = y[row, start : start + m]
                op(part, ks, out=part)
            for row in done:
                part = y[row, start : start + m]
                np.bitwise_and(part, keep, out=part)

    return run


def _native_runner(y, plan, keep):
    """The C kernel on whole segments (it releases the GIL; segments share nothing)."""
    seeds = b"".join(seed for seed, _, _ in plan)
    use_ptr = np.cumsum([0] + [len(rows) for _, rows, _ in plan], dtype=np.int64)
    use_row = np.array([row for _, rows, _ in plan for row, _ in rows], dtype=np.int64)
    use_sign = np.array([1 if op is np.add else -1 for _, rows, _ in plan for _, op in rows], dtype=np.int8)
    red_ptr = np.cumsum([0] + [len(done) for _, _, done in plan], dtype=np.int64)
    red_row = np.array([row for _, _, done in plan for row in done], dtype=np.int64)
    item, total = y.itemsize, y.shape[1] * y.itemsize
    keep_word = 0 if keep is None else int(keep)

    def run(s: int) -> None:
        c0 = s * SEGMENT_BYTES
        _native.mask_segment(y, y.strides[0], item, s, c0, min(SEGMENT_BYTES, total - c0), SEGMENT_BYTES,
                             seeds, use_ptr, use_row, use_sign, red_ptr, red_row, keep_word, _level)

    return run


def mask_rows(
    y: np.ndarray,
    masks: Sequence[Sequence[Mask]],
    workers: int = 1,
    bits: int | None = None,
    use_native: bool = True,
) -> np.ndarray:
    """In place: y[i] ← y[i] + Σ_{(seed, sign) ∈ masks[i]} sign·PRG(seed), for a [k, d] word matrix.

    Equal to applying `apply_masks` row by row; a seed listed for several rows is expanded once.
    `bits`: also reduce every masked row mod 2^bits (rows without masks are left as they are),
    each segment right after its last mask, while it is still in cache. `use_native=False`
    forces the pure-Python path (the C kernel, where available, gives the same words).
    """
    _check_choice()
    if y.ndim != 2 or y.dtype not in (np.dtype(np.uint32), np.dtype(np.uint64)) or y.strides[1] != y.itemsize:
        raise ConfigError(
            f"masks apply to uint32/uint64 rows with contiguous columns, got {y.dtype} {y.shape}"
        )
    if len(masks) != y.shape[0]:
        raise ConfigError(f"need one mask list per row: {len(masks)} lists for {y.shape[0]} rows")
    uses: dict[bytes, list[tuple[int, int]]] = {}
    for row, row_masks in enumerate(masks):
        for seed, sign in row_masks:
            if sign not in (1, -1):
                raise ConfigError(f"mask signs must be +1 or -1, got {sign!r}")
            uses.setdefault(seed, []).append((row, sign))
    if any(not isinstance(seed, bytes) or len(seed) != SEED_BYTES for seed in uses):
        raise ConfigError(f"mask seeds must be {SEED_BYTES} bytes")
    uses = _local_order(uses, y.shape[0])
    item = y.itemsize
    keep = None
    if bits is not None and bits < 8 * item:
        keep = y.dtype.type((1 << bits) - 1)
    last = {row: i for i, rows in enumerate(uses.values()) for row, _ in rows}  # a row's last mask
    plan = [
        (seed, [(row, np.add if sign > 0 else np.subtract) for row, sign in rows],
         [row for row, _ in rows if keep is not None and last[row] == i])
        for i, (seed, rows) in enumerate(uses.items())
    ]
    seg = SEGMENT_BYTES // item  # words per segment
    n_seg = -(-y.shape[1] // seg)
    if not n_seg or not plan:
        return y
    if _native is not None and use_native and y.flags.c_contiguous:
        run = _native_runner(y, plan, keep)
    else:
        run = _python_runner(y, plan, keep)
    for_each(n_seg, run, threads=workers)  # segments handed out one at a time (balances the threads)
    return y
