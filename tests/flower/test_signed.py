"""Signed secure rounds over the deployment's messages (issue 38), in process (`Loopback`).

Each site's registered Flower node key (EC P-384, `dpfl flower certs`) binds a per-run Ed25519
signing key; clients check every cohort member's binding against their own peers file, sign
their round keys and, in an exchange of its own (`train.sa_consistency`), the survivor list. A
malicious server is a Loopback that tampers with what each node receives."""

from __future__ import annotations

import numpy as np
import pytest
import tomli_w
import torch
from flower_helpers import SIGN_DP, config, recording_words, require_row_contract, simulate
from flwr.app import ConfigRecord

from dpfl.config import load_config
from dpfl.errors import ConfigError, ProtocolError
from dpfl.flower import certs, wire
from dpfl.flower import client as fclient
from dpfl.flower.coordinator import Coordinator
from dpfl.flower.loopback import Loopback
from dpfl.secagg import keys as kx
from dpfl.secagg import shamir
from dpfl.secagg.prg import apply_masks
from dpfl.secagg.protocol import UnmaskRequest


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Node keys node-0 .. node-7 and the operator's peers.toml, as `dpfl flower certs --nodes 8` writes them."""
    d = tmp_path_factory.mktemp("certs")
    certs.make_node_keys(d, 8)
    return d


def nodes(pki, n: int, signing=range(99), key_of=None, seeded=True) -> dict[int, dict]:
    """Node configs of n sites; those in `signing` with signing-key and peers (site i's key
    file: `key_of[i]`, default its own)."""
    key_of = key_of or {}
    return {100 + i: {"partition-id": i, "num-partitions": n, "dpfl-seeded": seeded,
                      **({"signing-key": str(pki / f"node-{key_of.get(i, i)}"), "peers": str(pki / certs.PEERS)}
                         if i in signing else {})}
            for i in range(n)}


def federation(data: dict, node_configs: dict, cls=Loopback) -> tuple[Coordinator, Loopback]:
    lb = cls({"dpfl-config": tomli_w.dumps(data)}, node_configs)
    lines: list[str] = []
    co = Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lines.append)
    co.lines = lines
    return co, lb


def kinds(lb: Loopback) -> list[str]:
    return [k for k, _ in lb.calls]


def plans(contents) -> dict[int, wire.RoundPlan]:
    return {n: wire.RoundPlan.from_record(c[wire.PLAN]) for n, c in contents.items()}


# ---------------------------------------------------------------- an honest signed run


def test_a_signed_round_equals_the_unsigned_one_and_the_simulator(pki):
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 2})
    signed, lb = federation(data, nodes(pki, 3))
    signed.run()
    unsigned, lb0 = federation(data, nodes(pki, 3, signing=()))
    unsigned.run()
    sim, _ = simulate(data)
    assert signed.signed and not unsigned.signed
    # round 2's keys are shared with round 1's unmasking, round 1's model evaluated with round 2's training
    assert kinds(lb) == ["query", "train.sa_keys"] + ["train.sa_train", "train.sa_consistency",
                                                     "train.sa_unmask"] * 2 + ["evaluate"]
    assert "train.sa_consistency" not in kinds(lb0)
    assert torch.equal(signed.state.w, unsigned.state.w) and torch.equal(signed.state.w, sim.w)
    assert [m["answered"] for m in signed.history] == [3, 3] and signed.aborted == 0


def test_plain_schemes_ignore_signing(pki):
    co, lb = federation(config(federation={"rounds": 1}), nodes(pki, 3))
    co.run()
    assert co.signed is False and kinds(lb) == ["query", "train", "evaluate"]


# ---------------------------------------------------------------- setup errors, one line each


def test_a_signing_key_that_is_not_the_sites_peers_entry_fails_at_hello(pki):
    data = config(SIGN_DP, federation={"rounds": 1})
    co, _ = federation(data, nodes(pki, 3, key_of={0: 1}))  # site 0 given site 1's key file
    with pytest.raises(ProtocolError) as e:
        co.run()
    msg = str(e.value)
    assert "\n" not in msg and "for clients [0] (node 100 did not answer the hello: ConfigError" in msg
    assert f"signing-key {pki / 'node-1'} is not the key peers file {pki / certs.PEERS} lists for client 0" in msg


def test_some_nodes_signing_and_others_not_is_a_config_error_at_start(pki):
    co, lb = federation(config(SIGN_DP, federation={"rounds": 1}), nodes(pki, 3, signing=(1, 2)))
    with pytest.raises(ConfigError, match=r"clients \[1, 2\] sign their secure rounds .* clients \[0\] do not"):
        co.run()
    assert kinds(lb) == ["query"]


def test_half_a_signing_configuration_is_refused(pki):
    half = {100: {"partition-id": 0, "num-partitions": 3, "signing-key": str(pki / "node-0")}}
    with pytest.raises(ConfigError, match="signing-key and peers go together"):
        fclient.hello(wire.hello_request(b"s" * 32), {}, half[100], {"dpfl-config": tomli_w.dumps(config(SIGN_DP))})


def test_the_peers_file_is_the_registered_keys_and_bad_ones_are_one_line(pki, tmp_path):
    peers = certs.read_peers(pki / certs.PEERS)
    for i in range(8):
        pub = certs.load_node_key(pki / f"node-{i}").public_key()
        assert certs.same_key(peers[i], pub)
        assert certs.ssh_line(pub) == (pki / f"node-{i}.pub").read_text().strip()  # what `flwr supernode register` takes
    cases = {'"x" = "ecdsa-sha2-nistp384 AAAA"': "entries must be", '"0" = "ssh-rsa AAAA"': "not an OpenSSH public key",
             "": "lists no keys", "[": "not valid TOML",
             '"0" = "{k}"\n"1" = "{k}"': "clients 0 and 1 have the same key"}
    line = (pki / "node-0.pub").read_text().strip()
    for text, why in cases.items():
        (tmp_path / "p.toml").write_text(text.replace("{k}", line))
        with pytest.raises(ConfigError, match=why) as e:
            certs.read_peers(tmp_path / "p.toml")
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------- a malicious server


class SplitViews(Loopback):
    """A malicious server against 8 sites, complete graph, t = 5, min_survivors = 5 (tolerate 3):
    it cuts the victim's (position 0) inbox to its t − 1 = 4 partners, shows each client its own
    survivor list, each one passing that client's checks (`_split_views` of
    tests/secagg/test_malicious_server.py), and keeps everything the clients reveal. In a signed
    round it asks for unmasking itself after the consistency check, with every signature it got
    of each client's list."""

    VICTIM, PARTNERS, OTHERS = 0, (1, 2, 3, 4), (5, 6, 7)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.words, self.masked, self.answers, self.refusals = {}, {}, {}, {}

    @classmethod
    def views(cls) -> dict[int, frozenset[int]]:
        v, (p1, p2, p3, p4) = cls.VICTIM, cls.PARTNERS
        out = {v: {v, *cls.PARTNERS}, **{w: {v, w, *cls.OTHERS} for w in cls.PARTNERS}}
        for q, dropped in zip(cls.OTHERS, ({p1, p2, p3}, {p1, p2, p4}, {p1, p3, p4})):
            out[q] = {v, *cls.OTHERS, *(set(cls.PARTNERS) - dropped)}  # each partner dropped by 5 = t clients
        return {c: frozenset(s) for c, s in out.items()}

    def _ask(self, kind, contents, request):
        pos = {n: p.index for n, p in plans(contents).items()}
        for n, c in contents.items():
            c["request"] = wire.request_record(request(pos[n]))
        out = super().__call__(kind, contents, 60.0)
        return out, pos

    def __call__(self, kind, contents, timeout, quorum=None):
        views = self.views()
        if kind == "train.sa_train":
            for n, plan in plans(contents).items():
                if plan.index == self.VICTIM:
                    inbox = wire.read_inbox(contents[n]["inbox"])
                    contents[n]["inbox"] = wire.inbox_record({w: inbox[w] for w in self.PARTNERS})
        if kind in ("train.sa_unmask", "train.sa_consistency"):
            self.plan = next(iter(plans(contents).values()))  # d and b are known from here on
        if kind == "train.sa_unmask":  # unsigned: each client its own list
            r = plans(contents)[next(iter(contents))].round
            out, pos = self._ask(kind, contents, lambda i: UnmaskRequest(r, views[i]))
            self._keep(out, pos)
            return out
        if kind == "train.sa_consistency":  # signed: each client signs its own list ...
            r = plans(contents)[next(iter(contents))].round
            out, pos = self._ask(kind, contents, lambda i: UnmaskRequest(r, views[i]))
            sigs = {pos[n]: wire.read_signature(rep.content[wire.SECAGG]).signature
                    for n, rep in out.items() if rep.content is not None}
            # ... then is asked to unmask it, with every signature of that same list
            asked, _ = self._ask("train.sa_unmask", contents, lambda i: UnmaskRequest(
                r, views[i], {u: s for u, s in sigs.items() if views[u] == views[i]}))
            self._keep(asked, pos)
            return out
        if kind != "train.sa_train":
            return super().__call__(kind, contents, timeout, quorum)
        with recording_words(self.words):
            out = super().__call__(kind, contents, timeout, quorum)
        for n, plan in plans(contents).items():
            rep = out[n]
            if rep.content is not None:
                d = wire.read_shape(rep.content, True)[0]
                self.masked[plan.index] = wire.read_masked(rep.content[wire.SECAGG], d).values
        return out

    def _keep(self, out, pos):
        for n, rep in out.items():
            if rep.content is None:
                self.refusals[pos[n]] = rep.error
            else:
                self.answers[pos[n]] = wire.read_unmask(rep.content[wire.SECAGG])

    def recover(self, victim_mask_pk: bytes) -> np.ndarray | None:
        """x_victim = y − PRG(b_victim) − Σ ±PRG(s_victim,w) from t shares of its seed and of each
        partner's mask key; None when some secret has fewer than t shares."""
        rc = self.plan.round_config()
        t = rc.threshold

        def secret(kind, v):
            shares = {u + 1: getattr(a, kind)[v] for u, a in self.answers.items() if v in getattr(a, kind)}
            return shamir.reconstruct(shares, t)[0] if len(shares) >= t else None

        seed = secret("self_mask_shares", self.VICTIM)
        keys = {w: secret("key_shares", w) for w in self.PARTNERS}
        if seed is None or any(s is None for s in keys.values()):
            return None
        masks = [(seed, -1)] + [(kx.agree(kx.load_private(sk), victim_mask_pk, "mask", rc.round_id),
                                 -1 if self.VICTIM < w else 1) for w, sk in keys.items()]
        return apply_masks(np.array(self.masked[self.VICTIM], copy=True), masks, 1, rc.bits)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_split_survivor_lists_expose_an_input_unsigned_and_are_refused_signed(pki, signed):
    """Deployment-shaped: 8 sites, FL-SIGN-DP with tolerate = 3, the server tampering only with
    the messages it sends. Unsigned, every client answers its own list and the server recovers
    the victim's encoded row exactly (all its words: its clipped, noised update). Signed, each
    client signs its own list; no list carries t = 5 signatures, so every client refuses to
    unmask and the server learns no share; the honest part of the coordinator aborts the round."""
    require_row_contract()
    data = config({"name": "fl-sign-dp", "options": {"sigma": 0.5, "gamma": 0.005, "tolerate": 3}},
                  data={"n_clients": 8}, federation={"rounds": 1, "clients_per_round": 8})
    co, lb = federation(data, nodes(pki, 8, signing=range(8) if signed else ()), cls=SplitViews)
    w0 = co.state.w.clone()
    co.run()
    assert lb.plan.secagg["threshold"] == 5 and lb.plan.secagg["min_survivors"] == 5
    assert len(lb.masked) == 8  # the victim masked with its 4 partners (t − 1 + itself = t: accepted)
    victim_cid = lb.plan.cohort[SplitViews.VICTIM]
    got = lb.recover(co.round_keys[victim_cid][0][1])
    if not signed:
        assert not lb.refusals and len(lb.answers) == 8  # no client refuses its list
        assert np.array_equal(got, lb.words[SplitViews.VICTIM])  # the victim's input, every word
        return
    assert not lb.answers and len(lb.refusals) == 8 and got is None
    assert all("survivors signed the list, at least 5 required" in e for e in lb.refusals.values())
    assert "aborted" in co.history[0] and torch.equal(co.state.w, w0) and not co.state.ledger.events


class Tampering(Loopback):
    """Applies `edit(kind, contents)` to what the nodes receive; keeps every reply."""

    def __init__(self, *a, edit=None, **kw):
        super().__init__(*a, **kw)
        self.edit, self.replies = edit, {}

    def __call__(self, kind, contents, timeout, quorum=None):
        if self.edit is not None:
            swap = self.edit(self, kind, contents)
            if swap is not None:  # the server sends another kind of message instead
                kind = swap
        out = super().__call__(kind, contents, timeout, quorum)
        self.replies.setdefault(kind, []).append(out)
        return out


def _errors(lb, kind) -> list[str]:
    return [rep.error for rep in lb.replies[kind][-1].values() if rep.content is None]


def _signed_run(pki, edit, scheme=SIGN_DP):
    data = config(scheme, federation={"rounds": 1})
    co, lb = federation(data, nodes(pki, 3), cls=Tampering)
    lb.edit = edit
    w0 = co.state.w.clone()
    co.run()
    return co, lb, w0


def _forge(pki, how):
    """(Ed25519 key, binding) the server substitutes for client 2: its own signing key, bound
    by a key not registered, by another site's registered key, or by client 2's own key for
    another run config."""
    vk = kx.verification_bytes(kx.new_signing_key())
    text = tomli_w.dumps(config(SIGN_DP, federation={"rounds": 1}))
    if how == "unregistered-key":
        from cryptography.hazmat.primitives.asymmetric import ec

        return vk, certs.bind(ec.generate_private_key(ec.SECP384R1()), text, 2, vk)
    if how == "another-sites-key":
        return vk, certs.bind(certs.load_node_key(pki / "node-1"), text, 2, vk)
    return vk, certs.bind(certs.load_node_key(pki / "node-2"), text + "# another run\n", 2, vk)


@pytest.mark.parametrize("how", ["unregistered-key", "another-sites-key", "another-run-config"])
def test_a_forged_binding_is_refused_naming_the_client(pki, how):
    vk, binding = _forge(pki, how)

    def edit(lb, kind, contents):
        if kind == "train.sa_keys":
            for c in contents.values():
                plan = c[wire.PLAN]
                j = plan["cohort"].index(2)
                plan["sa_vk"] = [vk if i == j else v for i, v in enumerate(plan["sa_vk"])]
                plan["sa_binding"] = [binding if i == j else b for i, b in enumerate(plan["sa_binding"])]

    co, lb, w0 = _signed_run(pki, edit)
    errors = _errors(lb, "train.sa_keys")
    assert len(errors) == 3  # every client, client 2 included, refuses before it shares keys
    assert all(e == "ProtocolError: round 1: client 2's signing key is not bound to its registered key (peers file) "
                    "for this run config: refused" for e in errors)
    assert all(fclient.STATE not in s for s in lb.states.values())
    assert "aborted" in co.history[0] and torch.equal(co.state.w, w0)


def _strip_plan(lb, kind, contents):
    if kind == "train.sa_keys":
        for c in contents.values():
            del c[wire.PLAN]["sa_vk"], c[wire.PLAN]["sa_binding"]


def _skip_consistency(lb, kind, contents):
    if kind == "train.sa_consistency":
        return "train.sa_unmask"  # the survivor list, unsigned, as an unmask request


def _strip_signatures(lb, kind, contents):
    if kind == "train.sa_unmask":
        for c in contents.values():
            c["request"] = ConfigRecord({k: v for k, v in c["request"].items() if k not in ("signers", "signatures")})


@pytest.mark.parametrize("edit,kind,why", [
    (_strip_plan, "train.sa_keys", ("round 1: an unsigned secure round, but this node signs its rounds (node config "
                                     "peers): refused")),
    (_skip_consistency, "train.sa_unmask", "round 1: phase after 'signed' requested, this client is after 'masked'"),
    (_strip_signatures, "train.sa_unmask", ": 0 survivors signed the list, at least 3 required"),
], ids=["unsigned-plan", "no-consistency-check", "no-signatures"])
def test_a_downgrade_to_an_unsigned_round_is_refused(pki, edit, kind, why):
    co, lb, w0 = _signed_run(pki, edit)
    errors = _errors(lb, kind)
    assert len(errors) == 3 and all(len(e.splitlines()) == 1 for e in errors)
    assert all(why in e for e in errors), errors
    assert "aborted" in co.history[0] and torch.equal(co.state.w, w0) and not co.state.ledger.events


def test_a_client_unmasks_only_the_list_it_signed(pki):
    """The list a client signed is kept in its node state between the two ClientApp processes:
    shown another list at unmasking (here one that drops client 2, with the signatures the
    server got, t = 2 and min_survivors = 2 letting it pass every other check), it refuses."""
    at = {}

    def edit(lb, kind, contents):
        if kind == "train.sa_unmask":
            p = plans(contents)
            at.update(index=p[100].index, dropped=p[102].index)
            rec = contents[100]["request"]
            contents[100]["request"] = ConfigRecord({**rec, "survivors": [i for i in rec["survivors"]
                                                                          if i != at["dropped"]]})

    _, lb, _ = _signed_run(pki, edit, {"name": "fl-sign-dp", "options": {**SIGN_DP["options"], "tolerate": 1}})
    replies = lb.replies["train.sa_unmask"][-1]
    assert replies[100].error == f"ProtocolError: client {at['index']}: the survivor list differs from the one it signed"
    assert {n for n, rep in replies.items() if rep.content is not None} == {101, 102}


@pytest.mark.parametrize("signs", [True, False], ids=["signing", "not-signing"])
def test_a_restarted_site_rejoins_with_a_fresh_signing_key_and_only_signing(pki, signs):
    """Site 2 is lost in round 1 (tolerate = 1) and restarts with an empty state: greeted again
    before round 3 (which it sits out: its keys were shared with round 2's unmasking, without it),
    it takes part in round 4 with a new run key bound by its node key. Restarted without
    signing-key and peers, it cannot rejoin a signed run. (Unseeded sites: a fresh node secret.)"""
    require_row_contract()
    data = config({"name": "fl-sign-dp", "options": {**SIGN_DP["options"], "tolerate": 1}},
                  federation={"rounds": 4, "clients_per_round": 3})
    co, lb = federation(data, nodes(pki, 3, seeded=False))
    old = {}

    def before(kind: str, calls: int) -> None:
        r = sum(k == "train.sa_train" for k, _ in lb.calls[:calls])
        if kind == "train.sa_train" and r == 1:
            old.update(vk=co.signing[2][0])
            lb.kill(102)
        if kind == "train.sa_train" and r == 2:
            if not signs:
                lb.node_configs[102] = nodes(pki, 3, signing=(), seeded=False)[102]
            lb.restart(102)

    lb.before = before
    co.run()
    if signs:
        assert [m["answered"] for m in co.history] == [2, 2, 2, 3] and co.history[2]["rejoined"] == [2]
        assert co.signing[2][0] != old["vk"]
        return
    assert [m["answered"] for m in co.history] == [2, 2, 2, 2]
    assert any("node 102 cannot rejoin: client 2 does not sign its secure rounds, this run's are signed" in ln
               for ln in co.lines)


def test_the_server_admits_only_sites_that_prove_their_approved_key(pki, tmp_path):
    """Run config peers: a node signing with a key that is not the one approved for its partition id
    (a key someone else registered) is refused at hello; the approved sites run."""
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 1, "clients_per_round": 3})
    text = tomli_w.dumps(data)
    approved = certs.read_peers(pki / certs.PEERS)

    def run(node_configs):
        lb = Loopback({"dpfl-config": text}, node_configs)
        co = Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lambda s: None,
                         peers=approved, config_text=text)
        return co.run()

    assert run(nodes(pki, 3))["rounds_run"] == 1
    rogue = tmp_path / "rogue"
    certs.make_node_keys(rogue, 3)  # its own keys and its own peers file, which the sites trust
    with pytest.raises(ProtocolError, match="claims client 2 without a binding by that site's key in the server's "
                                            "peers file: refused"):
        run({**{k: v for k, v in nodes(pki, 3).items() if k != 102},
             102: {"partition-id": 2, "num-partitions": 3, "dpfl-seeded": True,
                   "signing-key": str(rogue / "node-2"), "peers": str(rogue / certs.PEERS)}})
    with pytest.raises(ProtocolError, match="claims client 0 without a binding"):
        run(nodes(pki, 3, signing=()))  # unsigned sites cannot prove anything
