"""A malicious server against the real protocol objects (issue 38): it runs the key phases as an
honest server relays them, then cuts a victim's inbox and shows each client its own survivor
list, and tries to compute the victim's input x_v from what the clients reveal:

    x_v = y_v − PRG(b_v) − Σ_{w partner of v} sign(v, w)·PRG(s_vw),

with b_v from t shares of v's self-mask seed and each pair seed s_vw from t shares of the
partner's mask key s_w (as the honest server removes a lost client's pair masks).

The helpers use only the protocol's public API of before issue 38 as well, so the same attacks
can be replayed against the old code (see each test's docstring for what they gave there)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpfl.errors import ProtocolError
from dpfl.rng import Seeds
from dpfl.secagg import keys as kx
from dpfl.secagg import shamir
from dpfl.secagg.prg import apply_masks
from dpfl.secagg.protocol import AdvertiseKeys, Client, RoundAborted, Server, UnmaskRequest
from dpfl.secagg.simulate import exchange_keys, make_config

BITS, D = 16, 64


def keys_phase(k, *, signed=False, min_survivors=None, seed=0):
    """An honest key exchange; (config, clients, advertised keys, inbox per client, inputs)."""
    cfg = make_config(k, D, BITS, rng_seed=seed, min_survivors=min_survivors)
    signers = {u: kx.new_signing_key() for u in range(k)} if signed else {}
    if signed:
        cfg = dataclasses.replace(cfg, signing_keys={u: kx.verification_bytes(s) for u, s in signers.items()})
    clients = [Client(u, cfg, Seeds(seed).crypto("client", u), signer=signers.get(u)) for u in range(k)]
    srv = Server(cfg, keep_view=True)
    inbox = exchange_keys(srv, clients)
    adverts = {m.sender: m for m in srv.view if isinstance(m, AdvertiseKeys)}
    x = np.random.default_rng(seed).integers(0, 2**BITS, size=(k, D), dtype=np.uint64).astype(np.uint32)
    return cfg, clients, adverts, inbox, x


def ask(cfg, clients, views):
    """Show client c the survivor list views[c]; with signatures, first the consistency check, then
    the list with every signature the server got of that same list. (answers, refusals)."""
    sigs = {}
    if cfg.signing_keys is not None:
        for c, listed in views.items():
            try:
                sigs[c] = clients[c].sign_survivors(UnmaskRequest(cfg.round_id, frozenset(listed))).signature
            except ProtocolError:
                pass
    answers, refusals = {}, {}
    for c, listed in views.items():
        same = {u: s for u, s in sigs.items() if views[u] == listed}
        try:
            answers[c] = clients[c].unmask(UnmaskRequest(cfg.round_id, frozenset(listed), same))
        except ProtocolError as e:  # RoundAborted included
            refusals[c] = str(e)
    return answers, refusals


def _secret(answers, kind, v, t):
    shares = {u + 1: getattr(a, kind)[v] for u, a in answers.items() if v in getattr(a, kind)}
    return shamir.reconstruct(shares, t)[0] if len(shares) >= t else None


def recover(cfg, adverts, answers, y, victim, partners):
    """x_victim from its masked input y and the revealed shares; None when some secret has < t shares."""
    seed = _secret(answers, "self_mask_shares", victim, cfg.threshold)
    keys = {w: _secret(answers, "key_shares", w, cfg.threshold) for w in partners}
    if seed is None or any(s is None for s in keys.values()):
        return None
    masks = [(seed, -1)]
    for w, sk in keys.items():
        pair = kx.agree(kx.load_private(sk), adverts[victim].mask_pk, "mask", cfg.round_id)
        masks.append((pair, -1 if victim < w else 1))  # the victim added sign(victim, w)·PRG(s_vw)
    return apply_masks(np.array(y, copy=True), masks, 1, cfg.bits)


def cut_inbox(inbox, victim, senders):
    return {**inbox, victim: {w: inbox[victim][w] for w in senders}}


# ---------------------------------------------------------------- a short inbox (Bonawitz et al.'s |U2| ≥ t)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("all_required", [False, True], ids=["min_survivors=t", "min_survivors=k"])
def test_a_victim_refuses_to_mask_with_an_empty_inbox(signed, all_required):
    """The server hands client 0 an EMPTY inbox and every other client its full one. Before issue
    38 the victim masked anyway, with its self mask only: y_0 = x_0 + PRG(b_0). The server then
    showed everyone the full survivor list: the victim itself refused it (its listed neighbours
    never exchanged shares with it), but its 7 neighbours listed it as a survivor and revealed their
    shares of b_0, t of which give b_0 and x_0 = y_0 − PRG(b_0): all 64 words, bit-exactly. Replayed on the old
    code (`recover` below): x_0 recovered unsigned with min_survivors = t and = k, and signed with
    min_survivors = t (7 signatures ≥ t; the victim does not sign). Signed with min_survivors = k
    the old code was already safe: the victim's missing signature leaves 7 < 8 and all refuse.
    Now the victim refuses to mask: it sends nothing for the server to unmask."""
    k, victim = 8, 0
    cfg, clients, _, inbox, x = keys_phase(k, signed=signed, min_survivors=k if all_required else None)
    inbox = cut_inbox(inbox, victim, ())
    with pytest.raises(RoundAborted, match=rf"client 0: an inbox from 0 neighbours, with itself fewer than "
                                           rf"threshold {cfg.threshold}: refusing to mask"):
        clients[victim].masked_input(x[victim], inbox[victim])
    for c in clients[1:]:  # the others mask and answer as the server asks
        c.masked_input(x[c.id], inbox[c.id])
    answers, _ = ask(cfg, clients, {c: frozenset(range(k)) for c in range(1, k)})
    if signed and all_required:
        assert not answers  # the victim does not sign: 7 < 8 signatures (so on the old code too)
    else:  # the rest of the old attack still goes through (b_0 is revealed); only y_0 is missing now
        assert _secret(answers, "self_mask_shares", victim, cfg.threshold) is not None


def test_a_victim_refuses_an_inbox_from_t_minus_2_senders_and_accepts_t_minus_1():
    """An inbox of t − 2 senders: the victim would mask with t − 2 pair masks only. On the old code
    (t = 4 at n = 8: 2 partners) the server recovered x_0 with split views: it showed the victim's
    neighbours lists that drop the 2 partners (revealing their mask keys s_w, t shares each) and
    keep the victim (revealing b_0): all 64 input words recovered. Now t − 2 senders and the client
    itself are fewer than t: refused; t − 1 are accepted (the attack that remains is
    `test_unsigned_split_views_recover_an_input_signed_ones_are_refused`)."""
    k, victim = 8, 0
    cfg, clients, _, inbox, x = keys_phase(k)
    t = cfg.threshold
    assert t == 5  # degree 7: 2t > degree + 1
    short = cut_inbox(inbox, victim, range(1, t - 1))
    with pytest.raises(RoundAborted, match=f"client 0: an inbox from {t - 2} neighbours"):
        clients[victim].masked_input(x[victim], short[victim])
    assert clients[victim].mask_seeds(cut_inbox(inbox, victim, range(1, t))[victim])  # t − 1: masks


# ---------------------------------------------------------------- split survivor lists


def _split_views(victim, partners, others):
    """Client v's list (its partners, all it can list), each partner's (the victim and the others,
    the 3 other partners dropped), and the others' (each drops 3 partners): every partner is
    dropped by 5 = t clients, the victim is listed by all 8."""
    views = {victim: {victim, *partners}}
    for w in partners:
        views[w] = {victim, w, *others}
    p1, p2, p3, p4 = partners
    for q, dropped in zip(others, ({p1, p2, p3}, {p1, p2, p4}, {p1, p3, p4})):
        views[q] = {victim, *others, *(set(partners) - dropped)}
    return {c: frozenset(v) for c, v in views.items()}


@pytest.mark.parametrize("signed,all_required", [(False, False), (True, False), (False, True)],
                         ids=["unsigned", "signed", "unsigned-min_survivors=k"])
def test_unsigned_split_views_recover_an_input_signed_ones_are_refused(signed, all_required):
    """n = 8, complete graph, t = 5. The strongest attack left once a client refuses an inbox of
    fewer than t − 1 senders: give the victim t − 1 = 4 partners, and show each client its own
    survivor list, each passing that client's checks (every listed neighbour exchanged shares with
    it, it and its listed neighbours number ≥ t, the list has ≥ min_survivors ids). Each partner w
    is dropped in the lists of 5 = t clients, which reveal shares of s_w; the victim is listed by
    all, which reveal shares of b_0.

    Unsigned, min_survivors = t (l = 3 dropouts tolerated): x_0 is recovered exactly: unsigned
    rounds are exposed to a malicious server. (With full inboxes the same server gets nothing at
    n = 8: it would need t "dropped" marks on each of the 7 partners, 35, while each client may
    drop at most n − t = 3 of the others, 24.)
    Signed: every client signs its own list; no list carries t = 5 signatures (two lists with 5
    would need 10 signers of 8), so every client refuses and the server learns nothing.
    Unsigned, min_survivors = k (the schemes' l = 0): a list that drops anyone is too short; no
    client answers."""
    k, victim, partners, others = 8, 0, (1, 2, 3, 4), (5, 6, 7)
    cfg, clients, adverts, inbox, x = keys_phase(k, signed=signed, min_survivors=k if all_required else None)
    assert cfg.threshold == 5  # degree 7: 2t > degree + 1
    inbox = cut_inbox(inbox, victim, partners)
    y = {c.id: c.masked_input(x[c.id], inbox[c.id]).values for c in clients}
    answers, refusals = ask(cfg, clients, _split_views(victim, partners, others))
    got = recover(cfg, adverts, answers, y[victim], victim, partners)
    if not signed and not all_required:
        assert not refusals and len(answers) == k
        assert np.array_equal(got, x[victim])
        return
    assert not answers and len(refusals) == k and got is None
    why = "survivors, at least 8 required" if all_required else "survivors signed the list, at least 5 required"
    assert all(why in r for r in refusals.values())
