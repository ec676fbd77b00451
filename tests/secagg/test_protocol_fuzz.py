"""Property-based tests (Hypothesis): random, malformed, duplicated, replayed, late and early messages
from hostile clients (server side), and random or inconsistent requests from a dishonest server
(client side). A round gives the exact sum of its honest survivors or aborts with `RoundAborted`;
a message is accepted or rejected with `ProtocolError`; nothing else ever escapes.

Senders are authenticated by the transport (TLS and node authentication, and the coordinator's
check that a node signs as its own position), so hostile clients here never send well-formed
messages under an honest client's id."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dpfl.errors import ProtocolError
from dpfl.rng import Seeds
from dpfl.secagg import shamir
from dpfl.secagg.graph import default_threshold
from dpfl.secagg.protocol import (
    AdvertiseKeys,
    Client,
    MaskedInput,
    RoundAborted,
    Server,
    ShareKeys,
    UnmaskRequest,
    UnmaskShares,
)
from dpfl.secagg.simulate import exchange_keys, make_config

BITS, D = 16, 6
PHASES = ("advertise", "share", "masked", "unmask")
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**66),
    st.floats(allow_nan=True, width=32),
    st.text(max_size=3),
    st.binary(max_size=110),
    st.lists(st.integers(-1, 9), max_size=3),
    st.frozensets(st.integers(-1, 9), max_size=4),
    st.dictionaries(st.integers(-1, 9), st.binary(min_size=0, max_size=110), max_size=3),
    st.builds(
        lambda n, v, dt: np.full(n, v).astype(dt),
        st.integers(0, D + 1),
        st.integers(0, 2**20),
        st.sampled_from([np.uint16, np.uint32, np.uint64, np.int64, np.float64]),
    ),
)
# one hostile act: (kind, client pick, field pick, value, position in the phase's deliveries)
ACT = st.tuples(
    st.sampled_from(["mutate", "nudge", "replay", "dup", "early", "foreign"]),
    st.integers(0, 99),
    st.integers(0, 99),
    WEIRD,
    st.integers(0, 99),
)


@st.composite
def scenarios(draw):
    sparse = draw(st.booleans())
    k = 8 if sparse else draw(st.integers(3, 7))
    return {
        "k": k,
        "neighbours": 4 if sparse else None,
        "tolerate": draw(st.integers(0, 3)),
        "corrupt": draw(st.sets(st.integers(0, k - 1), max_size=2)),
        "order": {p: draw(st.permutations(range(k))) for p in PHASES},
        "late": {p: draw(st.sets(st.integers(0, k - 1), max_size=1)) for p in PHASES},
        "acts": {p: draw(st.lists(ACT, max_size=4)) for p in PHASES},
        "seed": draw(st.integers(0, 3)),
    }


_NEXT = {"advertise": ShareKeys, "share": MaskedInput, "masked": UnmaskShares, "unmask": AdvertiseKeys}


def _hostile(act, phase, sc, own, delivered, foreign):
    """The message a hostile client sends for one act (None: nothing to send)."""
    kind, pick, field_pick, value, _ = act
    corrupt = sorted(sc["corrupt"])
    if kind == "replay":
        return delivered[pick % len(delivered)] if delivered else None  # late or duplicate
    if kind == "foreign":
        return foreign[pick % len(foreign)]  # another round's message
    if kind == "dup":
        return own.get(corrupt[pick % len(corrupt)]) if corrupt else None
    if not corrupt:
        return None
    c = corrupt[pick % len(corrupt)]
    if kind == "early":  # a later phase's message, now
        cls = _NEXT[phase]
        fields = [f.name for f in dataclasses.fields(cls)]
        return cls(**{f: c if f == "sender" else 0 if f == "round_id" else value for f in fields})
    msg = own.get(c)
    if msg is None:
        return None
    if kind == "nudge" and isinstance(msg, UnmaskShares):  # well-formed but wrong shares
        which = "self_mask_shares" if field_pick % 2 else "key_shares"
        shares = dict(getattr(msg, which))
        for v in list(shares)[: 1 + field_pick % 3]:
            y = shamir.share_values(shares[v]).copy()
            y[field_pick % shamir.LIMBS] = (y[field_pick % shamir.LIMBS] + 1 + pick) % shamir.PRIME
            shares[v] = y.astype("<u4").tobytes()
        return dataclasses.replace(msg, **{which: shares})
    fields = [f.name for f in dataclasses.fields(msg)]
    name = fields[field_pick % len(fields)]
    if name == "sender" and isinstance(value, int) and 0 <= value < sc["k"] and value not in sc["corrupt"]:
        value = sc["k"]  # never a well-formed message under an honest client's id (see the module doc)
    return dataclasses.replace(msg, **{name: value})


def _run(sc, rows, foreign=()):
    """One round under the scenario; ('aborted', reason) or ('sum', total, survivors)."""
    k = sc["k"]
    t = default_threshold(sc["neighbours"] or k - 1)  # min_survivors < t is refused (never unmaskable)
    cfg = make_config(
        k, D, BITS, neighbours=sc["neighbours"], min_survivors=max(t, k - sc["tolerate"]), rng_seed=sc["seed"]
    )
    clients = [Client(u, cfg, Seeds(sc["seed"]).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    delivered: list = []
    state: dict = {}

    def honest(phase):
        out = {}
        for c in clients:
            try:
                if phase == "advertise":
                    out[c.id] = c.advertise()
                elif phase == "share" and c.id in state["pub"]:
                    out[c.id] = c.share_keys(state["pub"][c.id])
                elif phase == "masked" and c.id in state["inbox"]:
                    out[c.id] = c.masked_input(rows[c.id], state["inbox"][c.id])
                elif phase == "unmask" and c.id in state["request"].survivors:
                    out[c.id] = c.unmask(state["request"])
            except RoundAborted:
                pass  # an honest client declines (too few neighbours or survivors): it sends nothing
        return out

    def offer(msg):
        try:
            srv.receive(msg)
        except ProtocolError:
            return
        delivered.append(msg)

    closes = {
        "advertise": lambda: state.update(pub=srv.close_advertise()),
        "share": lambda: state.update(inbox=srv.close_shares()),
        "masked": lambda: state.update(request=srv.close_masked()),
    }
    try:
        for phase in PHASES:
            own = honest(phase)
            acts = sorted(sc["acts"][phase], key=lambda a: a[4])
            queue = [own[u] for u in sc["order"][phase] if u in own and u not in sc["late"][phase]]
            for act in acts:
                msg = _hostile(act, phase, sc, own, delivered, foreign)
                if msg is not None:
                    queue.insert(act[4] % (len(queue) + 1), msg)
            for msg in queue:
                offer(msg)
            if phase in closes:
                closes[phase]()
            for u in sc["late"][phase]:  # arrives after the phase closed: rejected
                if u in own:
                    offer(own[u])
        total = srv.finish()
        if srv.cheaters:
            event("wrong shares corrected")
        return ("sum", total, srv.survivors)
    except RoundAborted as e:
        assert srv.phase == "aborted" and srv._acc is None
        return ("aborted", str(e))


def _foreign(k):
    """Messages of round 1 of another run (replayed into round 0)."""
    cfg = make_config(k, D, BITS, rng_seed=9, round_id=1)
    clients = [Client(u, cfg, Seeds(9).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    out = [c.advertise() for c in clients]
    for m in out:
        srv.receive(m)
    pub = srv.close_advertise()
    out += [c.share_keys(pub[c.id]) for c in clients]
    return out


@FUZZ
@given(scenarios())
def test_hostile_clients_get_an_exact_sum_of_honest_survivors_or_a_clean_abort(sc):
    k = sc["k"]
    rng = np.random.default_rng(sc["seed"])
    x1 = rng.integers(0, 2**BITS, size=(k, D), dtype=np.uint64)
    x2 = x1.copy()
    honest = [u for u in range(k) if u not in sc["corrupt"]]
    x2[honest] = rng.integers(0, 2**BITS, size=(len(honest), D), dtype=np.uint64)
    foreign = _foreign(k)
    a, b = _run(sc, x1, foreign), _run(sc, x2, foreign)
    assert a[0] == b[0]
    event(a[0] if a[0] == "sum" else f"aborted: {a[1].split(':', 1)[1][:60]}")
    if a[0] == "aborted":
        return
    survivors = a[2]
    assert survivors == b[2]
    hs = sorted(survivors - sc["corrupt"])
    mod = np.uint64(1 << BITS)
    if not sc["corrupt"]:
        assert np.array_equal(a[1], x1[sorted(survivors)].sum(axis=0) % mod)
    # whatever the hostile clients did, the honest survivors' inputs enter the sum exactly once
    diff = (a[1].astype(np.int64) - b[1].astype(np.int64)) % (1 << BITS)
    want = (x1[hs].astype(np.int64).sum(axis=0) - x2[hs].astype(np.int64).sum(axis=0)) % (1 << BITS)
    assert np.array_equal(diff, want)


# ---------------------------------------------------------------- a dishonest server


IDS = st.one_of(st.integers(-2, 9), st.booleans(), st.text(max_size=1), st.floats(width=32))
SURVIVORS = st.one_of(
    st.frozensets(st.integers(0, 6), max_size=7),
    st.frozensets(IDS, max_size=4),
    st.lists(st.integers(0, 6), max_size=4),
    WEIRD,
)
PLAUSIBLE = st.frozensets(st.integers(1, 6), min_size=2, max_size=6).map(
    lambda s: s | {0}
)  # lists a server might send
REQUEST = st.one_of(
    st.builds(UnmaskRequest, st.just(0), PLAUSIBLE),
    st.builds(UnmaskRequest, st.just(0), PLAUSIBLE),
    st.builds(UnmaskRequest, st.sampled_from([0, 1, -1, True]), SURVIVORS),
    WEIRD,
)
TAMPER = st.one_of(st.just([]), st.lists(st.tuples(st.integers(1, 6), WEIRD), max_size=2))


@FUZZ
@given(
    st.integers(0, 3),
    TAMPER,
    TAMPER,
    st.lists(REQUEST, max_size=3),
    st.frozensets(st.integers(1, 6), min_size=3).map(lambda s: UnmaskRequest(0, s | {0})),
)
def test_a_client_facing_a_dishonest_server_reveals_only_what_is_safe(
    seed, bad_keys, bad_cts, requests, last
):
    requests = [*requests, last]  # after random ones, a list an honest server could send
    k = 7
    cfg = make_config(k, D, BITS, rng_seed=seed, min_survivors=5)  # t = 4
    clients = [Client(u, cfg, Seeds(seed).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    for c in clients:
        srv.receive(c.advertise())
    pub = srv.close_advertise()
    keys = dict(pub[0])
    for v, value in bad_keys:
        keys[v] = value
    me = clients[0]
    try:
        share = me.share_keys(keys)
    except (ProtocolError, RoundAborted):
        return  # refused the key set: nothing revealed
    srv.receive(share)
    for c in clients[1:]:
        srv.receive(c.share_keys(pub[c.id]))
    inbox = dict(srv.close_shares()[0])
    for v, value in bad_cts:
        inbox[v] = value
    try:
        me.masked_input(np.zeros(D, np.uint32), inbox)
    except ProtocolError:
        return
    usable = set(me._shares) | {0}  # with its own share of b_0
    answers = []
    for req in requests:
        try:
            answers.append((req, me.unmask(req)))
        except (ProtocolError, RoundAborted):
            pass
    assert len(answers) <= 1  # one answer per round, whatever is asked
    event(f"answered {len(answers)} of {len(requests)}")
    for req, a in answers:
        survivors = set(req.survivors)
        assert 0 in survivors and len(survivors) >= cfg.min_survivors
        assert survivors <= set(range(k)) and survivors - {0} <= set(me._shares) | set(me.bad_senders)
        assert len(survivors & (set(me._shares) | set(me.bad_senders) | {0})) >= cfg.threshold
        assert len(set(me._shares) | set(me.bad_senders)) + 1 >= cfg.threshold  # |U2 ∩ N(0)| + 1 ≥ t
        assert not set(a.self_mask_shares) & set(a.key_shares)  # never both kinds for one client
        assert set(a.self_mask_shares) | set(a.key_shares) <= usable and 0 in a.self_mask_shares


@FUZZ
@given(st.integers(5, 9), st.data())
def test_wrong_shares_are_corrected_up_to_the_decoding_bound_else_the_round_aborts(k, data):
    cfg = make_config(k, D, BITS, rng_seed=k)
    t, m = cfg.threshold, k  # complete graph: each self-mask seed has k holders (its owner's own share too)
    cheaters = data.draw(st.sets(st.integers(0, k - 1), max_size=3))
    silent = data.draw(st.sets(st.integers(0, k - 1), max_size=1)) - cheaters
    clients = [Client(u, cfg, Seeds(k).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    inbox = exchange_keys(srv, clients)
    x = np.random.default_rng(k).integers(0, 2**BITS, size=(k, D), dtype=np.uint64)
    for c in clients:
        srv.receive(c.masked_input(x[c.id], inbox[c.id]))
    request = srv.close_masked()
    for c in clients:
        a = c.unmask(request)
        if c.id in cheaters:
            limb, by = (
                data.draw(st.integers(0, shamir.LIMBS - 1)),
                data.draw(st.integers(1, shamir.PRIME - 1)),
            )
            bad = {}
            for v, s in a.self_mask_shares.items():
                y = shamir.share_values(s).copy()
                y[limb] = (y[limb] + by) % shamir.PRIME
                bad[v] = y.astype("<u4").tobytes()
            a = dataclasses.replace(a, self_mask_shares=bad)
        if c.id not in silent:
            srv.receive(a)
    try:
        total = srv.finish()
    except RoundAborted:
        assert len(cheaters) > (m - len(silent) - t) // 2  # only beyond what can be corrected
        return
    assert np.array_equal(total, x.sum(axis=0) % np.uint64(1 << BITS))
    assert srv.cheaters == cheaters
