"""Mask expansion: a 32-byte seed → a stream of words in Z_(2^32) or Z_(2^64) (AES-256-CTR).

Word i of PRG(seed) is bytes [w·i, w·(i+1)) (little-endian, w = word size) of the AES-256-CTR
keystream under key `seed`, counter blocks 0, 1, 2, ... (big-endian 128-bit). Every seed is
used once (seeds are derived per round and per pair), so starting the counter at 0 is safe.
Reducing a uniform word mod 2^b gives a uniform element of Z_(2^b).

`mask_rows` adds/subtracts streams into the rows of a matrix in cache-sized column chunks:
a seed used by several rows (both ends of a pair) is expanded once per chunk, the seeds are
visited in a row order of small bandwidth (reverse Cuthill–McKee on the rows-share-a-seed
graph: the ring order of a SecAgg+ Harary graph), so that the few rows a stretch of seeds
touches stay in cache, and column ranges can run on several threads (CTR mode starts anywhere:
block j is AES(seed, j)), with bit-identical results (addition mod 2^w commutes).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import reverse_cuthill_mckee

from dpfl.errors import ConfigError

SEED_BYTES = 32
CHUNK_BYTES = 1 << 18  # 256 KiB of keystream per call (a multiple of the 16-byte AES block)
_ZEROS = bytes(CHUNK_BYTES)

Mask = tuple[bytes, int]  # (seed, sign ∈ {+1, −1})


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _stream(seed: bytes, byte_offset: int):
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        raise ConfigError(f"mask seed must be {SEED_BYTES} bytes")
    counter = (byte_offset // 16).to_bytes(16, "big")
    return Cipher(algorithms.AES(seed), modes.CTR(counter)).encryptor()


def expand(seed: bytes, d: int, dtype: type = np.uint32) -> np.ndarray:
    """The first d words of PRG(seed) (dtype uint32 or uint64)."""
    out = np.zeros(d, dtype=dtype)
    return apply_masks(out, [(seed, 1)])


def apply_masks(y: np.ndarray, masks: Sequence[Mask], workers: int = 1) -> np.ndarray:
    """In place: y ← y + Σ sign·PRG(seed) mod 2^(word bits)."""
    if y.ndim != 1:
        raise ConfigError(f"apply_masks needs a 1-D vector, got shape {y.shape}")
    mask_rows(y[None, :], [masks], workers)
    return y


def _local_order(uses: dict[bytes, list[tuple[int, int]]], k: int) -> dict[bytes, list[tuple[int, int]]]:
    """The seeds reordered by the first row they touch in a low-bandwidth row order."""
    pairs = [(a, b) for rows in uses.values() for (a, _), (b, _) in itertools.pairwise(rows)]
    if not pairs:
        return uses
    a, b = np.array(pairs).T
    graph = coo_matrix((np.ones(2 * a.size), (np.r_[a, b], np.r_[b, a])), shape=(k, k)).tocsr()
    rank = np.empty(k, dtype=np.int64)
    rank[reverse_cuthill_mckee(graph, symmetric_mode=True)] = np.arange(k)
    return dict(sorted(uses.items(), key=lambda kv: min(rank[r] for r, _ in kv[1])))


def mask_rows(y: np.ndarray, masks: Sequence[Sequence[Mask]], workers: int = 1) -> np.ndarray:
    """In place: y[i] ← y[i] + Σ_{(seed, sign) ∈ masks[i]} sign·PRG(seed), for a [k, d] word matrix.

    Equal to applying `apply_masks` row by row; a seed listed for several rows is expanded once.
    """
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
    chunk = CHUNK_BYTES // item
    starts = list(range(0, y.shape[1], chunk))
    if not starts:
        return y
    n = max(1, min(int(workers), len(starts)))
    parts = [starts[len(starts) * i // n : len(starts) * (i + 1) // n] for i in range(n)]  # contiguous ranges

    def run(my_starts: list[int]) -> None:
        raw = bytearray(CHUNK_BYTES + 16)  # update_into needs block_size − 1 spare bytes
        buf = np.frombuffer(raw, dtype=y.dtype.newbyteorder("<"), count=chunk)
        zeros = memoryview(_ZEROS)
        streams = [(_stream(seed, my_starts[0] * item), rows) for seed, rows in uses.items()]
        for start in my_starts:
            m = min(chunk, y.shape[1] - start)
            ks = buf[:m]
            for enc, rows in streams:
                enc.update_into(zeros[: m * item], raw)
                for row, sign in rows:
                    part = y[row, start : start + m]
                    (np.add if sign > 0 else np.subtract)(part, ks, out=part)

    if n == 1:
        run(parts[0])
    else:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(run, parts))
    return y
