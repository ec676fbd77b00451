"""Trust boundaries of the secure sum (issue 19): hostile clients and a dishonest server. Each
test names the boundary; a round must give the exact sum of its survivors or abort with
`RoundAborted` (what the drivers treat as an aborted round), never anything else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import Seeds
from dpfl.secagg import keys as kx
from dpfl.secagg import shamir
from dpfl.secagg.protocol import (
    AdvertiseKeys,
    Client,
    MaskedInput,
    RoundAborted,
    RoundConfig,
    Server,
    UnmaskRequest,
    UnmaskShares,
    keys_statement,
    survivors_statement,
)
from dpfl.secagg.simulate import exchange_keys, make_config, secure_sum

LOW_ORDER = bytes(32)  # the identity point: every exchange with it is all-zero


def _rows(k, d, bits, seed=0):
    return np.random.default_rng(seed).integers(0, 2**bits, size=(k, d), dtype=np.uint64).astype(np.uint32)


def _plain(rows, keep, bits):
    return rows[sorted(keep)].astype(np.uint64).sum(axis=0) % (1 << bits)


def _offer(srv, msg):
    """Deliver one message; a rejected one is dropped, as the drivers do."""
    try:
        srv.receive(msg)
        return True
    except ProtocolError:
        return False


def _round(
    rows,
    bits,
    *,
    threshold=None,
    neighbours=None,
    seed=0,
    drop=(),
    advertise=None,
    share=None,
    inbox_of=None,
    unmask=None,
):
    """One honest-driver round in process; hooks replace a client's outgoing message (or None: not sent)."""
    k, d = rows.shape
    cfg = make_config(k, d, bits, threshold=threshold, neighbours=neighbours, rng_seed=seed)
    clients = [Client(u, cfg, Seeds(seed).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    for c in clients:
        msg = c.advertise()
        msg = advertise(c.id, msg) if advertise else msg
        if msg is not None:
            _offer(srv, msg)
    pub = srv.close_advertise()
    for c in clients:
        if c.id in pub:
            msg = c.share_keys(pub[c.id])
            msg = share(c.id, msg) if share else msg
            if msg is not None:
                _offer(srv, msg)
    inbox = srv.close_shares()
    if inbox_of:
        inbox = inbox_of(inbox)
    for c in clients:
        if c.id in inbox and c.id not in drop:
            _offer(srv, c.masked_input(rows[c.id], inbox[c.id]))
    request = srv.close_masked()
    for c in clients:
        if c.id in request.survivors:
            msg = c.unmask(request)
            msg = unmask(c.id, msg) if unmask else msg
            if msg is not None:
                _offer(srv, msg)
    return srv.finish(), srv, clients


def _nudge(share: bytes, limb: int = 0, by: int = 1) -> bytes:
    y = shamir.share_values(share).copy()
    y[limb] = (y[limb] + by) % shamir.PRIME
    return y.astype("<u4").tobytes()


# ---------------------------------------------------------------- wrong Shamir shares


def test_a_wrong_share_is_corrected_and_its_sender_named():
    k, d, bits = 7, 40, 22  # complete graph: degree 6, t = 4, six shares per secret
    rows = _rows(k, d, bits)

    def cheat(u, msg):
        if u != 2:
            return msg
        return dataclasses.replace(
            msg, self_mask_shares={v: _nudge(s) for v, s in msg.self_mask_shares.items()}
        )

    total, srv, _ = _round(rows, bits, unmask=cheat)
    assert np.array_equal(total, _plain(rows, range(k), bits))
    assert srv.cheaters == {2} and any("client 2: wrong share" in r for _, r in srv.rejected)


def _lagrange_shift(shares: dict[int, bytes], x_cheat: int, t: int) -> bytes:
    """A share for holder x_cheat that moves the t-smallest-holder reconstruction's first limb by +1:
    1 / λ_x added, with λ_x the public Lagrange weight of x at zero."""
    xs = tuple(sorted(shares)[:t])
    lam = int(shamir._lagrange_at_zero(xs)[xs.index(x_cheat)])
    return _nudge(shares[x_cheat], 0, pow(lam, -1, shamir.PRIME))


def test_a_share_crafted_with_the_lagrange_weight_gives_no_silently_wrong_sum():
    k, d, bits, t = 7, 40, 22, 4
    rows = _rows(k, d, bits, seed=1)
    answers = {}

    def craft(u, msg):
        if u != 1:
            return msg
        shares = {w + 1: a.self_mask_shares[0] for w, a in answers.items() if 0 in a.self_mask_shares}
        shares[2] = msg.self_mask_shares[0]
        return dataclasses.replace(
            msg, self_mask_shares={**msg.self_mask_shares, 0: _lagrange_shift(shares, 2, t)}
        )

    # run once to learn the other holders' shares of b_0 (same seed: the same shares), then cheat
    _round(rows, bits, unmask=lambda u, m: answers.setdefault(u, m))
    total, srv, _ = _round(rows, bits, unmask=craft)
    assert np.array_equal(total, _plain(rows, range(k), bits)) and srv.cheaters == {1}
    # with only t shares of b_0 there is no redundancy: the seed commitment catches the shift
    keep = {1, 2, 3}  # holders x = 1..4 of client 0's seed (its own and 1–3): client 0's other neighbours stay silent
    with pytest.raises(RoundAborted, match="does not match its commitment"):
        _round(rows, bits, unmask=lambda u, m: craft(u, m) if u in keep | {0} else None)


def test_too_many_wrong_shares_abort_the_round_cleanly():
    k, d, bits = 7, 40, 22

    def cheat(u, msg):
        if u not in (1, 2):  # two wrong of six shares; only one can be corrected
            return msg
        return dataclasses.replace(
            msg, self_mask_shares={v: _nudge(s, 3) for v, s in msg.self_mask_shares.items()}
        )

    with pytest.raises(RoundAborted, match="inconsistent shares"):
        _round(_rows(k, d, bits), bits, unmask=cheat)


def test_secure_sum_with_a_cheating_client_completes_or_aborts(monkeypatch):
    """The simulator's driver: one client's wrong shares are corrected; the sum stays exact."""
    k, d, bits = 8, 30, 22
    rows = _rows(k, d, bits, seed=3)
    honest = Client.unmask

    def unmask(self, request):
        msg = honest(self, request)
        if self.id == 5:
            msg = dataclasses.replace(
                msg, self_mask_shares={v: _nudge(s) for v, s in msg.self_mask_shares.items()}
            )
        return msg

    monkeypatch.setattr(Client, "unmask", unmask)
    total, st = secure_sum(rows, bits, rng_seed=4, drop_after_masking=[0])
    assert np.array_equal(total, _plain(rows, range(1, k), bits))
    assert any(u == 5 and "wrong share" in r for u, r in st["rejected"])


# ---------------------------------------------------------------- the survivor list


def test_clients_refuse_a_survivor_list_padded_with_ids_that_never_took_part():
    k, d, bits = 6, 20, 22  # degree 5: t = 4 = min_survivors
    cfg = make_config(k, d, bits, rng_seed=0)
    clients = [Client(u, cfg, Seeds(0).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    for c in clients:
        srv.receive(c.advertise())
    pub = srv.close_advertise()
    for c in clients[:4]:  # clients 4 and 5 never share keys
        srv.receive(c.share_keys(pub[c.id]))
    inbox = srv.close_shares()
    for c in clients[:2]:
        c.masked_input(np.zeros(d, np.uint32), inbox[c.id])
    padded = UnmaskRequest(cfg.round_id, frozenset({0, 1, 4, 5}))  # 2 real survivors, 4 listed ≥ 4
    with pytest.raises(ProtocolError, match=r"survivors \[4, 5\] never exchanged keys and shares"):
        clients[0].unmask(padded)
    with pytest.raises(RoundAborted, match="only 1 of its neighbours survive"):  # the honest list: too short
        clients[1].unmask(UnmaskRequest(cfg.round_id, frozenset({0, 1})))


# ---------------------------------------------------------------- the threshold


def test_thresholds_at_most_half_the_degree_are_refused():
    graph = {u: tuple(v for v in range(5) if v != u) for u in range(5)}  # degree 4
    with pytest.raises(ConfigError, match="more than half"):
        RoundConfig(0, 5, 8, 22, graph, 2, 2)
    with pytest.raises(ConfigError, match="more than half"):
        secure_sum(_rows(5, 8, 22), 22, threshold=2, rng_seed=0)
    RoundConfig(0, 5, 8, 22, graph, 3, 3)


def test_different_survivor_lists_cannot_give_both_shares_of_one_client():
    """The attack t ≤ degree/2 allowed: tell half the clients that client 0 survived (they reveal
    shares of b_0), the other half that it dropped (shares of s_0). With t > degree/2 one of the
    halves is always short of t shares."""
    k, d, bits = 5, 8, 22
    cfg = make_config(k, d, bits, rng_seed=2)  # degree 4, t = 3
    clients = [Client(u, cfg, Seeds(2).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    inbox = exchange_keys(srv, clients)
    for c in clients:
        c.masked_input(np.zeros(d, np.uint32), inbox[c.id])
    got_b, got_s = {}, {}
    for u, survivors in ((1, {0, 1, 2, 3, 4}), (2, {0, 1, 2, 3, 4}), (3, {1, 2, 3, 4}), (4, {1, 2, 3, 4})):
        a = clients[u].unmask(UnmaskRequest(cfg.round_id, frozenset(survivors)))
        got_b.update({u + 1: a.self_mask_shares[0]} if 0 in a.self_mask_shares else {})
        got_s.update({u + 1: a.key_shares[0]} if 0 in a.key_shares else {})
    assert len(got_b) == len(got_s) == 2 < cfg.threshold
    with pytest.raises(ProtocolError):
        shamir.reconstruct(got_s, cfg.threshold)


# ---------------------------------------------------------------- keys and ciphertexts


def _one_bad_advertiser(k, d, bits, seed, bad_u, **fields):
    """A round where client `bad_u` advertises with `fields` replaced: the others' exact sum comes
    out; returns the server's rejections."""
    rows = _rows(k, d, bits, seed=seed)
    bad = lambda u, m: dataclasses.replace(m, **fields) if u == bad_u else m
    total, srv, _ = _round(rows, bits, advertise=bad)
    assert np.array_equal(total, _plain(rows, set(range(k)) - {bad_u}, bits))
    return srv.rejected


def test_low_order_public_keys_are_rejected_at_receipt_and_the_round_goes_on():
    k, d, bits = 6, 20, 22
    rejected = _one_bad_advertiser(k, d, bits, 5, 3, mask_pk=LOW_ORDER)
    assert any(u == 3 and "small order" in r for u, r in rejected)
    # a server forwarding such a key: the client names the key's owner and shares nothing
    cfg = make_config(k, d, bits, rng_seed=0)
    c = Client(0, cfg, Seeds(0).crypto("client", 0))
    keys = {v: (Client(v, cfg).advertise().enc_pk, Client(v, cfg).advertise().mask_pk) for v in range(1, k)}
    keys[4] = (LOW_ORDER, keys[4][1])
    with pytest.raises(ProtocolError, match="client 4's encryption key"):
        c.share_keys(keys)
    with pytest.raises(ProtocolError, match="small order"):
        kx.check_public((1).to_bytes(32, "little"), "x")


@pytest.mark.parametrize("signature", [np.array([], dtype=np.uint16), np.zeros(64, np.uint8), "", 0, None])
def test_a_signature_that_is_not_bytes_is_rejected_and_the_round_goes_on(signature):
    """Found by the protocol fuzzer: a hostile client's empty array as its signature made the
    server's `signature != b""` raise NumPy's ValueError instead of rejecting the message."""
    rejected = _one_bad_advertiser(5, 10, 22, 7, 2, signature=signature)
    assert any(u == 2 and "signature must be bytes" in r for u, r in rejected)


def test_a_garbage_ciphertext_costs_only_its_own_share():
    k, d, bits = 7, 20, 22
    rows = _rows(k, d, bits, seed=6)

    def garble(u, msg):
        if u != 2:
            return msg
        ct = dict(msg.ciphertexts)
        ct[5] = bytes(len(ct[5]))  # right size, not a valid AES-GCM ciphertext
        return dataclasses.replace(msg, ciphertexts=ct)

    total, _srv, clients = _round(rows, bits, share=garble)
    assert np.array_equal(total, _plain(rows, range(k), bits))
    assert set(clients[5].bad_senders) == {2} and "authentication" in clients[5].bad_senders[2]


# ---------------------------------------------------------------- inputs and views


@pytest.mark.parametrize(
    "x",
    [
        np.full(4, 1.7),
        np.array([-1, 0, 1, 2]),
        np.array([np.nan, 0, 0, 0]),
        np.array([1 << 22, 0, 0, 0]),
        np.array([True, False, True, False]),
    ],
)
def test_masked_input_casts_nothing(x):
    cfg = make_config(3, 4, 22, rng_seed=0)
    clients = [Client(u, cfg, Seeds(0).crypto("client", u)) for u in range(3)]
    srv = Server(cfg)
    inbox = exchange_keys(srv, clients)
    with pytest.raises(ConfigError, match="input"):
        clients[0].masked_input(x, inbox[0])
    clients[1].masked_input(np.array([0, 1, 2, (1 << 22) - 1]), inbox[1])  # words of any integer type


@pytest.mark.parametrize("overwrite", [False, True])
def test_no_server_side_message_reaches_a_clients_plaintext(overwrite):
    """Messages are views (no copy of k rows), of a matrix holding only masked rows and zeros."""
    k, d, bits = 5, 64, 22
    rows = _rows(k, d, bits, seed=7)
    rows[3, 0] = 1  # the row of a client that drops: not all zero
    mine = rows.copy()
    srv = Server(make_config(k, d, bits, rng_seed=1), keep_view=True)
    secure_sum(mine, bits, rng_seed=1, server=srv, drop_after_masking=[3], overwrite=overwrite)
    masked = {m.sender: m.values for m in srv.view if isinstance(m, MaskedInput)}
    assert sorted(masked) == [0, 1, 2, 4]
    sent = [v.tobytes() for v in masked.values()]
    for v in masked.values():
        reach = v if v.base is None else v.base
        for row in np.asarray(reach).reshape(-1, d):  # all the memory behind the message
            assert row.tobytes() in sent or not row.any(), "a message reaches a client's plaintext"
        assert not v.flags.writeable
    if overwrite:
        assert not mine[3].any()


# ---------------------------------------------------------------- the active-server option: signatures


def _signed_setup(k=5, d=10, bits=22, seed=3):
    signers = {u: kx.new_signing_key() for u in range(k)}
    base = make_config(k, d, bits, rng_seed=seed)
    cfg = dataclasses.replace(base, signing_keys={u: kx.verification_bytes(s) for u, s in signers.items()})
    clients = [Client(u, cfg, Seeds(seed).crypto("client", u), signer=signers[u]) for u in range(k)]
    return cfg, clients, Server(cfg)


def test_signed_round_completes_with_the_consistency_check():
    k, d, bits = 5, 10, 22
    rows = _rows(k, d, bits, seed=8)
    _cfg, clients, srv = _signed_setup(k, d, bits)
    inbox = exchange_keys(srv, clients)
    for c in clients[:4]:  # client 4 drops after sharing
        srv.receive(c.masked_input(rows[c.id], inbox[c.id]))
    check = srv.close_masked()
    with pytest.raises(ProtocolError, match="differs from the one it signed"):
        clients[0].unmask(check)  # no unmasking before the consistency check
    for c in clients[:4]:
        srv.receive(c.sign_survivors(check))
    request = srv.close_consistency()
    for c in clients[:4]:
        srv.receive(c.unmask(request))
    assert np.array_equal(srv.finish(), _plain(rows, range(4), bits))


def test_signatures_stop_key_substitution_and_split_survivor_lists():
    k, d = 5, 10
    cfg, clients, srv = _signed_setup(k, d)
    with pytest.raises(ProtocolError, match="valid signature"):
        srv.receive(dataclasses.replace(clients[0].advertise(), signature=bytes(64)))
    for c in clients:
        srv.receive(c.advertise())
    pub = srv.close_advertise()
    evil = Client(1, make_config(k, d, 22, rng_seed=9)).advertise()  # the server's own key pair for client 1
    forged = dict(pub[0])
    forged[1] = (evil.enc_pk, evil.mask_pk, pub[0][1][2])
    with pytest.raises(ProtocolError, match="not signed by client 1"):
        Client(0, cfg, Seeds(3).crypto("client", 0), signer=clients[0]._signer).share_keys(forged)
    for c in clients:
        srv.receive(c.share_keys(pub[c.id]))
    inbox = srv.close_shares()
    for c in clients:
        srv.receive(c.masked_input(np.zeros(d, np.uint32), inbox[c.id]))
    check = srv.close_masked()
    sig = clients[0].sign_survivors(check)
    other = UnmaskRequest(cfg.round_id, frozenset({0, 1, 2, 3}))
    with pytest.raises(ProtocolError, match="different survivor list"):
        clients[0].sign_survivors(other)
    # a request whose signatures are too few, or not of this list, is refused
    with pytest.raises(RoundAborted, match="1 survivors signed"):
        clients[0].unmask(UnmaskRequest(cfg.round_id, check.survivors, {0: sig.signature}))
    with pytest.raises(ProtocolError, match="invalid or foreign signatures"):
        clients[0].unmask(UnmaskRequest(cfg.round_id, check.survivors, {0: sig.signature, 1: sig.signature}))
    assert not clients[0]._unmasked


def test_identities_make_signed_statements_name_client_ids_and_leave_positional_ones_unchanged():
    """A deployment signs its round keys before it knows its position: with `identities`,
    statements name client ids (a signature naming the position, or a list of other ids, is
    refused); without, they are byte for byte the positional ones the simulator signs."""
    k, d, bits = 4, 6, 16
    cfg, clients, _ = _signed_setup(k, d, bits)
    e, m = clients[0].advertise().enc_pk, clients[0].advertise().mask_pk
    assert cfg.keys_statement(2, e, m) == keys_statement(cfg.round_id, 2, e, m)
    assert cfg.survivors_statement(frozenset({0, 3})) == survivors_statement(cfg.round_id, frozenset({0, 3}))
    ids = {0: 17, 1: 4, 2: 9, 3: 250}
    named = dataclasses.replace(cfg, identities=ids)
    assert named.keys_statement(2, e, m) == keys_statement(cfg.round_id, 9, e, m)
    assert named.survivors_statement(frozenset({0, 3})) == survivors_statement(cfg.round_id, frozenset({17, 250}))
    signers = {u: c._signer for u, c in enumerate(clients)}
    rows = _rows(k, d, bits, seed=4)
    named_clients = [Client(u, named, Seeds(5).crypto("client", u), signer=signers[u]) for u in range(k)]
    srv = Server(named)
    with pytest.raises(ProtocolError, match="valid signature"):  # signed naming its position 1, not client 4
        srv.receive(Client(1, cfg, Seeds(5).crypto("client", 1), signer=signers[1]).advertise())
    inbox = exchange_keys(srv, named_clients)
    for c in named_clients:
        srv.receive(c.masked_input(rows[c.id], inbox[c.id]))
    check = srv.close_masked()
    for c in named_clients:
        srv.receive(c.sign_survivors(check))
    request = srv.close_consistency()
    for c in named_clients:
        srv.receive(c.unmask(request))
    assert np.array_equal(srv.finish(), _plain(rows, range(k), bits))
    for bad in ({0: 1, 1: 1, 2: 2, 3: 3}, {0: 0, 1: 1, 2: 2}, {0: -1, 1: 1, 2: 2, 3: 3}, {0: True, 1: 1, 2: 2, 3: 3}):
        with pytest.raises(ConfigError, match="identities must give a distinct client id"):
            dataclasses.replace(cfg, identities=bad)


def test_unmask_shares_for_unknown_clients_are_rejected():
    k, d, bits = 5, 10, 22
    fresh = Server(make_config(k, d, bits, rng_seed=0))
    with pytest.raises(ProtocolError, match="early|not a survivor"):
        fresh.receive(UnmaskShares(0, 0, {"x": b""}, {}))
    with pytest.raises(ProtocolError, match="unknown sender"):
        fresh.receive(AdvertiseKeys(True, 0, bytes(32), bytes(32)))
