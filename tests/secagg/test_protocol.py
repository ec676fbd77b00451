import numpy as np
import pytest
from scipy import stats

from dpfl.compression.bits import unpack_uint
from dpfl.errors import ProtocolError
from dpfl.rng import Seeds
from dpfl.secagg import prg, shamir
from dpfl.secagg.protocol import Client, MaskedInput, RoundAborted, Server, UnmaskRequest, UnmaskShares
from dpfl.secagg.simulate import exchange_keys, make_config, secure_sum


def _words(k, d, bits, seed=0):
    return np.random.default_rng(seed).integers(0, 2**bits, size=(k, d), dtype=np.uint64)


def _plain(rows, keep, bits):
    return (rows[sorted(keep)].astype(object).sum(axis=0) % 2**bits).astype(np.uint64)


@pytest.mark.parametrize("bits", [5, 22, 32, 64])
def test_masks_cancel_exactly(bits):
    k, d = 5, 1000
    rows = _words(k, d, bits)
    srv = Server(make_config(k, d, bits, rng_seed=7), keep_view=True)
    total, st = secure_sum(rows, bits, rng_seed=7, server=srv)
    assert np.array_equal(total.astype(np.uint64), _plain(rows, range(k), bits))
    masked = [m for m in srv.view if isinstance(m, MaskedInput)]
    assert len(masked) == k
    for m in masked:  # what the server received is not the input
        assert np.mean(m.values.astype(np.uint64) == rows[m.sender]) < 0.05 + 2.0**-bits
    assert st["survivors"] == list(range(k)) and st["rejected"] == []


def test_hundred_clients_thirty_percent_drop_after_masking():
    k, d, bits = 100, 64, 22
    rows = _words(k, d, bits, seed=1)
    rng = np.random.default_rng(2)
    drop = rng.choice(k, size=30, replace=False)
    silent = rng.choice(
        np.setdiff1d(np.arange(k), drop), size=10, replace=False
    )  # survivors that send no shares
    total, st = secure_sum(rows, bits, drop_after_masking=drop, drop_before_unmasking=silent, rng_seed=3)
    keep = set(range(k)) - set(drop.tolist())
    assert st["survivors"] == sorted(keep)
    assert np.array_equal(total.astype(np.uint64), _plain(rows, keep, bits))
    assert (st["masked_input_bytes"][drop] == 0).all()


def test_sparse_graph_with_dropouts():
    k, d, bits = 40, 300, 32
    rows = _words(k, d, bits, seed=4)
    total, st = secure_sum(rows, bits, neighbours=8, drop_after_masking=[3, 17], rng_seed=5)
    assert st["degree"] == 8 and st["threshold"] == 5
    assert np.array_equal(total.astype(np.uint64), _plain(rows, set(range(k)) - {3, 17}, bits))


def test_same_seed_same_view_different_seed_different_masks():
    k, d, bits = 4, 200, 22
    rows = _words(k, d, bits)
    views = []
    for seed in (9, 9, 10):
        srv = Server(make_config(k, d, bits, rng_seed=seed), keep_view=True)
        secure_sum(rows, bits, rng_seed=seed, server=srv)
        views.append(np.stack([m.values for m in srv.view if isinstance(m, MaskedInput)]))
    assert np.array_equal(views[0], views[1])
    assert not np.array_equal(views[0], views[2])


def test_abort_when_too_many_drop():
    k, d, bits = 20, 16, 22
    rows = _words(k, d, bits)
    srv = Server(make_config(k, d, bits, rng_seed=1))  # degree 19: t = 11 = min_survivors
    with pytest.raises(RoundAborted, match="10 clients sent masked inputs, at least 11"):
        secure_sum(rows, bits, drop_after_masking=range(10), rng_seed=1, server=srv)
    assert srv.phase == "aborted" and srv._acc is None
    with pytest.raises(ProtocolError):
        srv.finish()
    # the noise covers l = 3 failures: 3 drops complete, 4 abort
    total, _ = secure_sum(rows, bits, drop_after_masking=range(3), min_survivors=k - 3, rng_seed=1)
    assert np.array_equal(total.astype(np.uint64), _plain(rows, range(3, k), bits))
    with pytest.raises(RoundAborted):
        secure_sum(rows, bits, drop_after_masking=range(4), min_survivors=k - 3, rng_seed=1)


def test_abort_when_shares_are_missing():
    k, d, bits = 10, 8, 22  # degree 9: t = 6; 4 answer, 4 shares per seed even with the owner's own
    rows = _words(k, d, bits)
    with pytest.raises(RoundAborted, match="4 shares of client 2's self-mask seed, threshold 6"):
        secure_sum(rows, bits, drop_after_masking=[0, 1], drop_before_unmasking=[2, 3, 4, 5], rng_seed=2)


def _setup(k=6, d=50, bits=22, seed=0):
    cfg = make_config(k, d, bits, rng_seed=seed)
    seeds = Seeds(seed)
    clients = [Client(u, cfg, seeds.crypto("client", u)) for u in range(k)]
    srv = Server(cfg, keep_view=True)
    for c in clients:
        srv.receive(c.advertise())
    pub = srv.close_advertise()
    for c in clients:
        srv.receive(c.share_keys(pub[c.id]))
    return cfg, clients, srv, srv.close_shares()


def test_malformed_messages_are_rejected_and_the_round_continues():
    k, d, bits = 6, 50, 22
    cfg, clients, srv, inbox = _setup(k, d, bits)
    rows = _words(k, d, bits).astype(np.uint32)
    good = {c.id: c.masked_input(rows[c.id], inbox[c.id]) for c in clients}
    srv.receive(good[0])
    bad = {
        "duplicate": good[0],
        "wrong length": MaskedInput(1, cfg.round_id, bits, good[1].values[:-1].copy()),
        "wrong modulus": MaskedInput(1, cfg.round_id, 23, good[1].values),
        "out of range": MaskedInput(1, cfg.round_id, bits, np.full(d, 2**bits, dtype=np.uint32)),
        "uint32 words": MaskedInput(1, cfg.round_id, bits, good[1].values.astype(np.uint64)),
        "unknown sender": MaskedInput(99, cfg.round_id, bits, good[1].values),
        "round 1": MaskedInput(1, cfg.round_id + 1, bits, good[1].values),
        "early": UnmaskShares(1, cfg.round_id, {}, {}),
    }
    for reason, msg in bad.items():
        with pytest.raises(ProtocolError, match=reason):
            srv.receive(msg)
    for u in (1, 2, 3):  # client 4 only ever sent garbage, client 5 nothing
        srv.receive(good[u])
    with pytest.raises(ProtocolError, match="not a survivor|early"):
        srv.receive(UnmaskShares(4, cfg.round_id, {}, {}))
    request = srv.close_masked()
    with pytest.raises(ProtocolError, match="late MaskedInput"):
        srv.receive(good[5])
    assert request.survivors == {0, 1, 2, 3}
    assert len(srv.rejected) == len(bad) + 2
    # a survivor revealing a self-mask share of a dropped client is rejected
    answers = {u: clients[u].unmask(request) for u in request.survivors}
    share = next(iter(answers[0].key_shares.values()))
    with pytest.raises(ProtocolError, match="self-mask shares for non-surviving"):
        srv.receive(UnmaskShares(0, cfg.round_id, {4: share}, {}))
    with pytest.raises(ProtocolError, match="not a survivor"):
        srv.receive(UnmaskShares(4, cfg.round_id, {}, {}))
    for a in answers.values():
        srv.receive(a)
    total = srv.finish()
    assert np.array_equal(total.astype(np.uint64), _plain(rows.astype(np.uint64), {0, 1, 2, 3}, bits))


def test_clients_refuse_unsafe_unmask_requests():
    cfg, clients, _, inbox = _setup(k=6)
    c = clients[0]
    c.masked_input(np.zeros(cfg.d, np.uint32), inbox[0])
    with pytest.raises(ProtocolError, match="not listed as a survivor"):
        c.unmask(UnmaskRequest(cfg.round_id, frozenset({1, 2, 3, 4})))
    with pytest.raises(RoundAborted, match="1 of its neighbours survive, with itself fewer than threshold 4"):
        c.unmask(UnmaskRequest(cfg.round_id, frozenset({0, 1})))
    c.unmask(UnmaskRequest(cfg.round_id, frozenset({0, 1, 2, 3})))
    with pytest.raises(ProtocolError, match="already answered"):  # never reveal the other share later
        c.unmask(UnmaskRequest(cfg.round_id, frozenset({0, 1, 2, 3, 4, 5})))


def test_masked_input_wire_size_is_the_packed_payload():
    k, d, bits = 3, 1001, 22
    rows = _words(k, d, bits)
    srv = Server(make_config(k, d, bits, rng_seed=1), keep_view=True)
    _, st = secure_sum(rows, bits, rng_seed=1, server=srv)
    for m in (m for m in srv.view if isinstance(m, MaskedInput)):
        wire = m.to_bytes()
        assert len(wire) == m.wire_nbytes == st["masked_input_bytes"][m.sender]
        assert len(wire) - 13 == -(-d * bits // 8)  # 22 bits per value, packed
        back = unpack_uint(np.frombuffer(wire[13:], np.uint8)[None, :], d, bits)[0]
        assert np.array_equal(back, m.values)


def _server_unmasked_views(x, seed, bits=4, d=20_000):
    """What the server can compute per client from its own view: y_u − PRG(b_u)."""
    k = x.shape[0]
    srv = Server(make_config(k, d, bits, threshold=2, rng_seed=seed), keep_view=True)
    total, _ = secure_sum(x, bits, threshold=2, rng_seed=seed, server=srv)
    assert np.array_equal(total.astype(np.uint64), _plain(x, range(k), bits))
    answers = [m for m in srv.view if isinstance(m, UnmaskShares)]
    assert all(not a.key_shares for a in answers)  # honest run: no mask key is ever revealed
    z = {}
    for m in (m for m in srv.view if isinstance(m, MaskedInput)):
        shares = {
            a.sender + 1: a.self_mask_shares[m.sender] for a in answers if m.sender in a.self_mask_shares
        }
        seed_u = shamir.combine(shares, 2)
        y = m.values.copy()
        prg.apply_masks(y, [(seed_u, -1)])
        z[m.sender] = y & np.uint32(2**bits - 1)
    return z


def test_server_view_does_not_depend_on_one_clients_input():
    k, d, bits = 3, 20_000, 4
    x_a = np.zeros((k, d), dtype=np.uint64)
    x_b = np.zeros((k, d), dtype=np.uint64)
    x_b[0], x_b[1] = 5, 11  # client 0's input changes; the sum mod 16 stays the same
    hists = []
    for x, seed in ((x_a, 21), (x_b, 22)):
        z = _server_unmasked_views(x, seed, bits, d)
        cells = (z[0].astype(np.int64) * 16 + z[1]).astype(np.int64)
        h = np.bincount(cells, minlength=256)
        assert stats.chisquare(h).pvalue > 1e-4  # (z_0, z_1) uniform on Z_16²: nothing about x_0
        assert stats.binomtest(int((z[0] == x[0]).sum()), d, 1 / 16).pvalue > 1e-4  # guessing x_0 = chance
        hists.append(h)
    assert stats.chi2_contingency(np.stack(hists)).pvalue > 1e-4  # same distribution for both inputs
    # power check: had the server seen the inputs, the same test would reject at once
    seen = np.bincount((x_b[0] * 16 + x_b[1]).astype(np.int64), minlength=256)
    assert stats.chisquare(seen).pvalue < 1e-100


def test_batch_masking_equals_each_clients_own_masking():
    k, bits, seed = 12, 22, 3
    d = 3 * (prg.SEGMENT_BYTES // 4) + 5  # several keystream segments and a ragged tail
    rows = _words(k, d, bits).astype(np.uint32)  # the ring's word type: can be masked in place
    got, sums = {}, []
    for workers, overwrite in ((1, False), (3, False), ("in place", True)):
        srv = Server(make_config(k, d, bits, neighbours=4, rng_seed=seed), keep_view=True)
        mine = rows.copy()
        total, _ = secure_sum(mine, bits, neighbours=4, drop_after_masking=[5], rng_seed=seed,
                              workers=2 if overwrite else workers, server=srv, overwrite=overwrite)
        sums.append(total)
        assert np.array_equal(mine, rows) != overwrite  # the input is masked in place only when asked
        got[workers] = {m.sender: m.values.copy() for m in srv.view if isinstance(m, MaskedInput)}
    assert not mine[5].any()  # a dropped client's row is never masked: zeroed, no plaintext left
    expect = rows[[u for u in range(k) if u != 5]].sum(axis=0, dtype=np.uint64) % (1 << bits)
    assert all(np.array_equal(s, expect) for s in sums)
    # reference: the same clients (same seeds), each masking its own row with Client.masked_input
    cfg = make_config(k, d, bits, neighbours=4, rng_seed=seed)
    clients = [Client(u, cfg, Seeds(seed).crypto("secagg", 0, "client", u)) for u in range(k)]
    srv = Server(cfg)
    inbox = exchange_keys(srv, clients)
    assert sorted(got[1]) == [u for u in range(k) if u != 5]
    for u in got[1]:
        ref = clients[u].masked_input(rows[u], inbox[u]).values
        assert all(np.array_equal(g[u], ref) for g in got.values())


@pytest.mark.parametrize("dtype,bits", [(np.int32, 22), (np.int64, 40), (np.int16, 22)])
def test_signed_rows_are_encoded_in_place_and_checked_first(dtype, bits):
    from dpfl.secagg import ring

    k, d = 6, 2 * (prg.SEGMENT_BYTES // 4) + 3
    lim = min(ring.client_bound(bits, k), np.iinfo(dtype).max)
    x = np.random.default_rng(2).integers(-lim, lim + 1, size=(k, d)).astype(dtype)
    x[0, 0], x[1, 1] = -lim, lim  # the extremes are allowed
    expect = ring.centred_lift(ring.encode_int(x, bits).sum(axis=0, dtype=np.uint64), bits)
    assert np.array_equal(expect, x.sum(axis=0, dtype=np.int64))
    for overwrite in (False, True):
        mine = x.copy()
        total, _ = secure_sum(mine, bits, neighbours=2, rng_seed=1, overwrite=overwrite)
        assert np.array_equal(ring.centred_lift(total, bits), expect)
        word_wide = np.dtype(dtype).itemsize == ring.word_dtype(bits).itemsize
        assert np.array_equal(mine, x) != (overwrite and word_wide)  # masked in its own memory only then
    bad = x.copy()
    bad[2, 7] = -lim - 1 if lim < np.iinfo(dtype).max else bad[2, 7]
    if bad[2, 7] != x[2, 7]:
        kept = bad.copy()
        with pytest.raises(ProtocolError, match="outside the allowed range"):
            secure_sum(bad, bits, neighbours=2, rng_seed=1, overwrite=True)
        assert np.array_equal(bad, kept)  # rejected before a word was written
