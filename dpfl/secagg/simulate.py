"""Run one whole secure-aggregation round in process, with real keys, shares and masks."""

from __future__ import annotations

import time
from collections.abc import Collection

import numpy as np

from dpfl.errors import ConfigError
from dpfl.rng import CryptoRNG, Seeds
from dpfl.secagg.graph import (
    check_sparse_degree,
    check_tolerance,
    complete_graph,
    default_threshold,
    harary_graph,
)
from dpfl.secagg.prg import default_workers, mask_rows
from dpfl.secagg.protocol import Client, MaskedInput, RoundConfig, Server
from dpfl.secagg.ring import check_bits, check_int_range, client_bound, int_range, reduce, word_dtype
from dpfl.secagg.rounds import ServerRound


def _check_rows(rows: np.ndarray, bits: int) -> np.ndarray:
    """Words in Z_(2^bits), or signed integer rows encoded here (two's complement, checked first)."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[0] < 2 or rows.shape[1] < 1:
        raise ConfigError(f"rows must have shape [k ≥ 2, d ≥ 1], got {rows.shape}")
    if not np.issubdtype(rows.dtype, np.integer):
        raise ConfigError(f"rows must be integers (words in Z_2^{bits} or signed values), got dtype {rows.dtype}")
    wd = word_dtype(bits)
    if rows.dtype.kind == "i":
        check_int_range(rows, bits, client_bound(bits, rows.shape[0]))
        if rows.dtype.itemsize == wd.itemsize:  # the same bits are x mod 2^(word bits); masking reduces them
            return rows.view(wd)
        return reduce(rows.astype(wd), bits)
    if int_range(rows)[1] >> bits:
        raise ConfigError(f"rows must hold values in [0, 2^{bits}); encode them with dpfl.secagg.ring first")
    return rows if rows.dtype == wd else rows.astype(wd)


def secure_sum(
    rows_int: np.ndarray,
    bits: int,
    *,
    drop_after_masking: Collection[int] = (),
    drop_before_unmasking: Collection[int] = (),
    threshold: int | None = None,
    neighbours: int | None = None,
    min_survivors: int | None = None,
    rng_seed: int | None = None,
    round_id: int = 0,
    workers: int | None = None,
    server: Server | None = None,
    overwrite: bool = False,
) -> tuple[np.ndarray, dict]:
    """Σ_{u survives} rows_int[u] mod 2^bits, computed by the full protocol; returns (sum, stats).

    rows_int: [k, d] words in Z_(2^bits) (see `ring`), or signed integers (e.g. discrete-Gaussian
    shares) with |x| ≤ `ring.client_bound(bits, k)`, encoded here: a word-wide type (int32 for
    b ≤ 32) is viewed as words, no copy; anything out of range raises `ProtocolError` before a
    word is written. drop_after_masking: clients that share
    their keys but whose masked input never arrives (excluded from the sum; their masks are
    removed through Shamir recovery). drop_before_unmasking: survivors that send no shares.
    neighbours: None for the complete graph, or an even k for the SecAgg+ Harary graph.
    threshold: Shamir t (default `graph.default_threshold`: a majority of a client and its
    neighbours). min_survivors: fewer inputs than this abort the round with `RoundAborted`
    (default t, the least allowed). rng_seed: None draws every
    key and seed from the OS; an int makes the run reproducible. workers: threads for the mask
    keystreams (default `prg.default_workers()`; results do not depend on it). `server` lets a
    test keep the server's view (pass a `Server` built for the same config via `make_config`).
    overwrite: mask `rows_int` in place when it holds words of the ring's dtype or word-wide signed
    integers (as each deployed client masks its own buffer), saving a copy of all k inputs; its
    contents are then lost (the senders' rows masked, the dropped clients' rows zeroed). The
    messages the server receives are read-only views of a matrix that holds masked rows and
    zeros only, never a client's plaintext.
    stats: ids of survivors and dropped clients, per-client bytes of the masked input
    (`masked_input_bytes`, 0 when it never arrived) and of the other messages (`protocol_bytes`),
    and wall seconds per phase (`keys_s`, `mask_s` for all clients, `server_sum_s`, `unmask_s`).
    """
    bits = check_bits(bits)
    rows = _check_rows(rows_int, bits)
    k, d = rows.shape
    cfg = make_config(
        k,
        d,
        bits,
        threshold=threshold,
        neighbours=neighbours,
        min_survivors=min_survivors,
        rng_seed=rng_seed,
        round_id=round_id,
    )
    dropped, silent = set(map(int, drop_after_masking)), set(map(int, drop_before_unmasking))
    if not dropped | silent <= set(range(k)):
        raise ConfigError(f"dropout ids must be client indices in [0, {k})")
    seeds = Seeds(rng_seed) if rng_seed is not None else None
    clients = [
        Client(u, cfg, seeds.crypto("secagg", round_id, "client", u) if seeds else None) for u in range(k)
    ]
    workers = default_workers() if workers is None else int(workers)
    srv = server if server is not None else Server(cfg, workers=workers)
    if srv.cfg != cfg:
        raise ConfigError("the server passed in was built for a different round configuration")
    timing = dict.fromkeys(("keys_s", "mask_s", "server_sum_s", "unmask_s"), 0.0)

    rnd = ServerRound(cfg, server=srv)  # the server's phases, as a deployment drives them
    t0 = time.perf_counter()
    pub = rnd.keys({c.id: c.advertise() for c in clients})
    inbox = rnd.shares({c.id: c.share_keys(pub[c.id]) for c in clients})
    timing["keys_s"] = time.perf_counter() - t0

    # MaskedInput, for all senders at once: each client's own masks (its key agreements; a pair's
    # seed is derived once for both ends), applied by `mask_rows`, which expands a pair's seed once
    # too: the same words as `Client.masked_input` row by row (tested), at half the work.
    senders = [c for c in clients if c.id not in dropped]
    t1 = time.perf_counter()
    agreed: dict[tuple[int, int], bytes] = {}  # each pair's seed derived once (symmetric agreement)
    if overwrite and rows.flags.c_contiguous:  # the dropped rows are never masked: zeroed below
        y, at = rows, {c.id: c.id for c in senders}
        masks = [[] if c.id in dropped else c.mask_seeds(inbox[c.id], agreed) for c in clients]
    else:  # a copy: the caller's rows stay as they are
        y, at = rows[[c.id for c in senders]], {c.id: i for i, c in enumerate(senders)}
        masks = [c.mask_seeds(inbox[c.id], agreed) for c in senders]
    mask_rows(y, masks, workers, bits)  # every sender has at least its self mask, so all are reduced
    if y is rows and dropped:
        y[sorted(dropped)] = 0  # no plaintext left where a message's memory could reach it
    t2 = time.perf_counter()
    msgs = {}
    for c in senders:
        values = y[at[c.id]]  # a read-only view (no copy): the matrix holds only masked rows and zeros
        values.flags.writeable = False
        msgs[c.id] = MaskedInput(c.id, cfg.round_id, bits, values)
    request = rnd.masked(msgs)
    del y, msgs
    timing["mask_s"] = t2 - t1
    timing["server_sum_s"] = time.perf_counter() - t2

    t4 = time.perf_counter()
    total = rnd.unmask({c.id: c.unmask(request) for c in clients if c.id in request.survivors and c.id not in silent})
    timing["unmask_s"] = time.perf_counter() - t4
    sent, proto = rnd.masked_bytes, rnd.protocol_bytes

    stats = {
        "n_clients": k,
        "d": d,
        "bits": bits,
        "threshold": cfg.threshold,
        "min_survivors": cfg.min_survivors,
        "degree": min(len(v) for v in cfg.neighbours.values()),
        "survivors": sorted(request.survivors),
        "dropped": sorted(dropped),
        "masked_input_bytes": sent,
        "protocol_bytes": proto,
        "rejected": list(srv.rejected),
        **timing,
    }
    return total, stats


def exchange_keys(srv: Server, clients: list[Client]) -> dict:
    """The two key phases with every client honest: each advertises its keys, then shares its
    secrets with its neighbours; returns the server's inbox of encrypted shares per client."""
    rnd = ServerRound(srv.cfg, server=srv)
    pub = rnd.keys({c.id: c.advertise() for c in clients})
    return rnd.shares({c.id: c.share_keys(pub[c.id]) for c in clients})


def make_config(
    k: int,
    d: int,
    bits: int,
    *,
    threshold: int | None = None,
    neighbours: int | None = None,
    min_survivors: int | None = None,
    rng_seed: int | None = None,
    round_id: int = 0,
) -> RoundConfig:
    """The round configuration `secure_sum` uses (graph drawn from rng_seed, or the OS when None)."""
    if _complete(k, neighbours):
        graph = complete_graph(k)
    else:
        rng = Seeds(rng_seed).crypto("secagg", round_id, "graph") if rng_seed is not None else CryptoRNG()
        graph = harary_graph(k, neighbours, rng)
    degree = min(len(v) for v in graph.values())
    t = default_threshold(degree) if threshold is None else int(threshold)
    return RoundConfig(round_id, k, d, bits, graph, t, t if min_survivors is None else int(min_survivors))


def _complete(k: int, neighbours: int | None) -> bool:
    return neighbours is None or neighbours >= k - 1


def round_shape(k: int, neighbours: int | None = None, threshold: int | None = None) -> tuple[int, int]:
    """(degree, t) of the graph and threshold `make_config` gives a round of k clients."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise ConfigError(f"secure aggregation needs at least 2 clients, got {k!r}")
    degree = int(k) - 1 if _complete(k, neighbours) else check_sparse_degree(k, neighbours)
    return degree, default_threshold(degree) if threshold is None else int(threshold)


def check_round_tolerance(k: int, tolerate: int, neighbours: int | None = None, threshold: int | None = None) -> None:
    """ConfigError (one line) unless every round of k clients survives `tolerate` lost clients
    (`graph.max_tolerated` at the degree and threshold `make_config` gives)."""
    degree, t = round_shape(k, neighbours, threshold)
    check_tolerance(int(k), degree, t, tolerate)
