"""Flower records ↔ dpfl messages: exact round trips, and malformed input rejected by name."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.compression.bits import packed_nbytes
from dpfl.errors import ConfigError, ProtocolError
from dpfl.flower import wire
from dpfl.flower.node import NodeSettings, OsSeeds, check_round_config
from dpfl.flower.party import round_public_keys
from dpfl.rng import Seeds
from dpfl.schemes.secure_sum import SecAggTransport
from dpfl.secagg.protocol import (
    HEADER_BYTES,
    MaskedInput,
    RoundConfig,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskShares,
)
from dpfl.secagg.ring import word_dtype


@pytest.mark.parametrize("bits", [1, 10, 22, 32, 33, 64])
def test_masked_input_survives_the_wire_exactly(bits):
    d = 37
    rng = np.random.default_rng(bits)
    values = (rng.integers(0, 2**63, d, dtype=np.uint64) >> np.uint64(64 - bits)).astype(word_dtype(bits))
    msg = MaskedInput(4, 9, bits, values)
    back = wire.read_masked(wire.masked_record(msg), d)
    assert (back.sender, back.round_id, back.bits) == (4, 9, bits)
    assert back.values.dtype == values.dtype and np.array_equal(back.values, values)
    # what the server counts is the message's size on the wire: header, modulus byte, packed values
    assert len(wire.masked_record(msg)["masked"]) == msg.wire_nbytes == HEADER_BYTES + 1 + packed_nbytes(d, bits)


def test_malformed_masked_inputs_are_rejected_by_name():
    msg = MaskedInput(0, 1, 10, np.zeros(8, dtype=np.uint32))
    blob = wire.masked_record(msg)["masked"]
    with pytest.raises(ProtocolError, match="value bytes"):
        wire.read_masked(ConfigRecord({"masked": blob[:-1]}), 8)
    with pytest.raises(ProtocolError, match="value bytes"):
        wire.read_masked(ConfigRecord({"masked": blob}), 9)
    with pytest.raises(ProtocolError, match="shorter than its header"):
        wire.read_masked(ConfigRecord({"masked": blob[:5]}), 8)
    with pytest.raises(ProtocolError, match="'masked' is missing"):
        wire.read_masked(ConfigRecord({}), 8)


def test_share_and_unmask_messages_round_trip():
    share = ShareKeys(2, 7, {0: b"a" * 60, 5: b"b" * 60})
    back = wire.read_share(wire.share_record(share))
    assert back == share
    un = UnmaskShares(1, 7, {0: b"x" * 40}, {3: b"y" * 40, 4: b"z" * 40})
    assert wire.read_unmask(wire.unmask_record(un)) == un
    with pytest.raises(ProtocolError, match="differ in length or repeat"):
        wire.read_share(ConfigRecord({"sender": 1, "round": 7, "to": [0, 0], "ct": [b"a", b"b"]}))
    with pytest.raises(ProtocolError, match="must be <class 'int'>"):
        wire.read_share(ConfigRecord({"sender": "1", "round": 7, "to": [], "ct": []}))


def test_round_plan_round_trips_with_its_graph():
    graph = {0: (1, 2), 1: (0, 2), 2: (0, 1)}
    plan = wire.RoundPlan(round=3, cohort=[7, 2, 9], sizes=[10, 20, 30], index=1, answering=3, n_selected=3,
                          steps=2, batch=8, describe="x", secagg={"bits": 22, "d": 100, "threshold": 2,
                                                                 "min_survivors": 3, "graph": graph})
    back = wire.RoundPlan.from_record(plan.to_record())
    assert back == plan
    assert back.round_config() == RoundConfig(3, 3, 100, 22, graph, 2, 3)
    bad = plan.to_record()
    bad["index"] = 3
    with pytest.raises(ProtocolError, match="disagree"):
        wire.RoundPlan.from_record(bad)


def test_a_round_plan_carries_the_steps_round_values():
    """The adaptive clip's C_t travels in the plan: distinct names, finite floats, else ProtocolError."""
    plan = wire.RoundPlan(round=3, cohort=[7, 2, 9], sizes=[10, 20, 30], index=1, answering=3, n_selected=3,
                          steps=2, batch=8, describe="x", values={"0/bound": 0.125})
    back = wire.RoundPlan.from_record(plan.to_record())
    assert back == plan and back.values == {"0/bound": 0.125}
    assert "step_names" not in wire.RoundPlan(**{**vars(plan), "values": {}}).to_record()
    for names, values in ((["0/bound"], []), (["0/bound"], [float("nan")]), (["0/bound"], [1]),
                          (["a", "a"], [1.0, 2.0]), ([3], [1.0])):
        bad = plan.to_record()
        bad["step_names"], bad["step_values"] = names, values
        with pytest.raises(ProtocolError, match="step_names and step_values"):
            wire.RoundPlan.from_record(bad)


def test_a_signed_round_plan_carries_keys_and_bindings_of_the_cohort():
    graph = {0: (1, 2), 1: (0, 2), 2: (0, 1)}
    vks, bindings = [bytes([i]) * 32 for i in range(3)], [b"b" * 103, b"c" * 102, b"d" * 104]
    plan = wire.RoundPlan(round=3, cohort=[7, 2, 9], sizes=[10, 20, 30], index=1, answering=3, n_selected=3,
                          steps=2, batch=8, describe="x", secagg={"bits": 22, "d": 100, "threshold": 2,
                                                                 "min_survivors": 3, "graph": graph,
                                                                 "signing_keys": vks, "bindings": bindings})
    back = wire.RoundPlan.from_record(plan.to_record())
    assert back == plan and back.signed
    rc = back.round_config(signing_keys=dict(enumerate(vks)))
    assert rc.identities == {0: 7, 1: 2, 2: 9} and rc.identity(2) == 9
    for field_, value, why in (("sa_vk", vks[:2], "2 signing keys"), ("sa_vk", [b"a" * 31] * 3, "32-byte"),
                               ("sa_binding", [b""] * 3, "1..120 bytes"), ("sa_binding", [b"x" * 121] * 3, "1..120")):
        bad = plan.to_record()
        bad[field_] = value
        with pytest.raises(ProtocolError, match=why):
            wire.RoundPlan.from_record(bad)
    plain = wire.RoundPlan(**{**vars(plan), "secagg": {}}).to_record()
    plain["sa_vk"], plain["sa_binding"] = vks, bindings
    with pytest.raises(ProtocolError, match="without a secure sum"):
        wire.RoundPlan.from_record(plain)


def test_signed_messages_round_trip_and_are_size_checked():
    sig = SurvivorSignature(2, 5, b"s" * 64)
    assert wire.read_signature(wire.signature_record(sig)) == sig
    with pytest.raises(ProtocolError, match="64 bytes"):
        wire.read_signature(ConfigRecord({"sender": 2, "round": 5, "signature": b"s" * 63}))
    req = UnmaskRequest(5, frozenset({0, 2}), {0: b"a" * 64, 2: b"b" * 64})
    assert wire.read_request(wire.request_record(req)) == req
    assert "signers" not in wire.request_record(UnmaskRequest(5, frozenset({0})))
    with pytest.raises(ProtocolError, match="64-byte"):
        wire.read_request(ConfigRecord({"round": 5, "survivors": [0], "signers": [0], "signatures": [b"a"]}))
    with pytest.raises(ProtocolError, match="'signatures' is missing"):
        wire.read_request(ConfigRecord({"round": 5, "survivors": [0], "signers": [0]}))
    keys = {1: (b"e" * 32, b"m" * 32, b"s" * 64)}
    assert wire.read_keys(wire.keys_record(keys)) == keys
    with pytest.raises(ProtocolError, match="signatures"):
        wire.read_keys(ConfigRecord({**wire.keys_record(keys), "sig": [b"s" * 63]}))


def test_a_signing_hello_is_read_whole_or_refused():
    rec = ConfigRecord({"cid": 1, "size": 5, "describe": "x", "seeded": False, "data_mac": "a" * 64,
                        "data_mac_salted": True, "enc_pk": [b"e" * 32] * 2, "mask_pk": [b"m" * 32] * 2,
                        "fresh": True})
    assert wire.read_hello({wire.REPLY: rec}, 2, True)["signing"] is None
    assert wire.read_hello({wire.REPLY: rec}, 2, True)["fresh"] is True
    for bad in (1, "yes"):  # a node says whether it had state, as a bool, or is refused
        with pytest.raises(ProtocolError, match="hello: field 'fresh' must be"):
            wire.read_hello({wire.REPLY: ConfigRecord({**rec, "fresh": bad})}, 2, True)
    older = ConfigRecord({k: v for k, v in rec.items() if k != "fresh"})  # a site before the field: cannot tell
    assert wire.read_hello({wire.REPLY: older}, 2, True)["fresh"] is None
    signing = {"sign_pk": b"v" * 32, "binding": b"b" * 100, "keys_sig": [b"s" * 64] * 2}
    got = wire.read_hello({wire.REPLY: ConfigRecord({**rec, **signing})}, 2, True)
    assert got["signing"] == (b"v" * 32, b"b" * 100, [b"s" * 64] * 2)
    for field_, value in (("sign_pk", b"v" * 31), ("binding", b""), ("keys_sig", [b"s" * 64])):
        with pytest.raises(ProtocolError, match="hello"):
            wire.read_hello({wire.REPLY: ConfigRecord({**rec, **signing, field_: value})}, 2, True)
    with pytest.raises(ProtocolError, match="'binding' is missing"):
        wire.read_hello({wire.REPLY: ConfigRecord({**rec, "sign_pk": b"v" * 32})}, 2, True)


def test_a_hello_carries_the_sites_data_mac_or_is_refused():
    rec = {"cid": 1, "size": 5, "describe": "x", "seeded": False, "data_mac_salted": True}
    digest = "0123456789abcdef" * 4
    assert wire.read_hello({wire.REPLY: ConfigRecord({**rec, "data_mac": digest})}, 2, False)["data"] == digest
    for bad in (digest[:-1], digest + "0", digest.upper(), "g" * 64, digest.encode(), 7):
        with pytest.raises(ProtocolError, match="hello: field 'data_mac'"):
            wire.read_hello({wire.REPLY: ConfigRecord({**rec, "data_mac": bad})}, 2, False)
    with pytest.raises(ProtocolError, match="'data_mac' is missing"):
        wire.read_hello({wire.REPLY: ConfigRecord(rec)}, 2, False)
    unsalted = {k: v for k, v in rec.items() if k != "data_mac_salted"}  # a site from before salted MACs
    with pytest.raises(ProtocolError, match="not salted with the run's salt .*: update the site$"):
        wire.read_hello({wire.REPLY: ConfigRecord({**unsalted, "data_mac": digest})}, 2, False)


def test_the_servers_hello_carries_a_32_byte_salt_or_is_refused():
    assert wire.read_hello_request(wire.hello_request(b"s" * 32)) == b"s" * 32
    for bad in (b"s" * 31, b"s" * 33, b"", "s" * 32, 7):
        with pytest.raises(ProtocolError, match="hello request: field 'mac_salt'"):
            wire.read_hello_request({wire.HELLO: ConfigRecord({"mac_salt": bad})})
    with pytest.raises(ProtocolError, match="hello request: record 'hello' is missing \\(a server from before"):
        wire.read_hello_request({})


def test_a_client_refuses_a_weaker_secure_sum_configuration():
    sa = SecAggTransport("int", bits=12, max_dropouts=1)
    graph = {u: tuple(v for v in range(5) if v != u) for u in range(5)}
    check_round_config(sa, RoundConfig(1, 5, 5, 12, graph, 3, 4))  # 2t > degree + 1 = 5, min = 5 − 1
    with pytest.raises(ProtocolError, match="min_survivors = 3"):
        check_round_config(sa, RoundConfig(1, 5, 5, 12, graph, 3, 3))  # would unmask a smaller sum
    with pytest.raises(ProtocolError, match="t = 4"):
        check_round_config(sa, RoundConfig(1, 5, 5, 12, graph, 4, 4))


def test_node_settings_name_the_bad_key():
    assert NodeSettings.parse({"partition-id": 2, "num-partitions": 3}, 3) == NodeSettings(2)
    with pytest.raises(ConfigError, match=r"partition-id must be an integer in \[0, 3\)"):
        NodeSettings.parse({}, 3)
    with pytest.raises(ConfigError, match="num-partitions = 4"):
        NodeSettings.parse({"partition-id": 0, "num-partitions": 4}, 3)
    with pytest.raises(ConfigError, match="dpfl-seeded must be true or false"):
        NodeSettings.parse({"partition-id": 0, "dpfl-seeded": "yes"}, 3)
    signing = NodeSettings.parse({"partition-id": 0, "signing-key": "k", "peers": "p.toml"}, 3)
    assert (signing.signing_key, signing.peers) == ("k", "p.toml")
    for half in ({"signing-key": "k"}, {"peers": "p.toml"}):
        with pytest.raises(ConfigError, match="signing-key and peers go together"):
            NodeSettings.parse({"partition-id": 0, **half}, 3)
    with pytest.raises(ConfigError, match="peers must be a non-empty path"):
        NodeSettings.parse({"partition-id": 0, "signing-key": "k", "peers": ""}, 3)


def test_deployment_randomness_is_not_the_config_seed():
    a, b = OsSeeds(), OsSeeds()
    assert a.seed("x") != b.seed("x") and a.seed("x") != Seeds(0).seed("x")
    assert a.crypto("round", 1).bytes(32) != a.crypto("round", 1).bytes(32)  # a fresh OS key each time
    # round keys: independent per round, and per node secret
    k1, k2 = round_public_keys(b"\x01" * 32, 3), round_public_keys(b"\x02" * 32, 3)
    assert len({*k1, *k2}) == 6


def test_requests_and_keys_are_type_checked_not_cast():
    assert wire.read_request(ConfigRecord({"round": 2, "survivors": [0, 3]})).survivors == {0, 3}
    for bad in ([0.0, 1.5], [False, True], ["0", "1"], [0, 0]):
        with pytest.raises(ProtocolError, match="survivor"):
            wire.read_request(ConfigRecord({"round": 2, "survivors": bad}))
    good = {"ids": [1, 2], "enc_pk": [b"a" * 32, b"b" * 32], "mask_pk": [b"c" * 32, b"d" * 32]}
    assert wire.read_keys(ConfigRecord(good))[2] == (b"b" * 32, b"d" * 32)
    for field_, value in (("enc_pk", [b"a" * 32, b"b" * 31]), ("ids", [1, 1]), ("ids", [1.0, 2.0])):
        with pytest.raises(ProtocolError, match="neighbour keys"):
            wire.read_keys(ConfigRecord({**good, field_: value}))
    share = ShareKeys(2, 7, {0: b"a" * 100}, b"c" * 32)
    assert wire.read_share(wire.share_record(share)).commitment == b"c" * 32


_SCALAR = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True), st.text(max_size=4),
                    st.binary(max_size=120), st.booleans())
_VALUE = st.one_of(_SCALAR, *(st.lists(s, max_size=4) for s in (st.integers(-3, 9), st.binary(max_size=120),
                                                                 st.booleans(), st.floats(), st.text(max_size=2))))
_ID_LISTS = st.lists(st.integers(0, 4), max_size=4, unique=True)
_TYPED = {  # a well-typed value for each field (Hypothesis mixes them with anything else)
    **dict.fromkeys(["sender", "round", "index", "answering", "n_selected", "steps", "batch", "sa_bits", "sa_d",
                     "sa_threshold", "sa_min_survivors"], st.integers(0, 4)),
    **dict.fromkeys(["to", "self_ids", "key_ids", "survivors", "ids", "cohort", "sizes", "sa_degree", "sa_edges"],
                    _ID_LISTS),
    **dict.fromkeys(["ct", "self_shares", "key_shares", "enc_pk", "mask_pk", "sa_vk"],
                    st.lists(st.binary(min_size=32, max_size=32), max_size=4)),
    **dict.fromkeys(["sig", "signatures"], st.lists(st.binary(min_size=64, max_size=64), max_size=4)),
    "signers": _ID_LISTS, "sa_binding": st.lists(st.binary(min_size=1, max_size=120), max_size=4),
    "signature": st.binary(min_size=64, max_size=64),
    "commit": st.binary(min_size=32, max_size=32), "describe": st.text(max_size=3), "masked": st.binary(max_size=40),
}


def _ints(xs):
    return all(type(v) is int for v in xs)


_READERS = {  # reader, its fields, and what must hold of the record when it parses (nothing was cast)
    "share": (wire.read_share, ["sender", "round", "to", "ct", "commit"], lambda r: _ints(r["to"])),
    "unmask": (wire.read_unmask, ["sender", "round", "self_ids", "self_shares", "key_ids", "key_shares"],
               lambda r: _ints(r["self_ids"]) and _ints(r["key_ids"])),
    "request": (wire.read_request, ["round", "survivors", "signers", "signatures"],
                lambda r: _ints(r["survivors"]) and _ints(r.get("signers", []))
                and all(type(s) is bytes and len(s) == 64 for s in r.get("signatures", []))),
    "signature": (wire.read_signature, ["sender", "round", "signature"],
                  lambda r: type(r["signature"]) is bytes and len(r["signature"]) == 64),
    "keys": (wire.read_keys, ["ids", "enc_pk", "mask_pk", "sig"],
             lambda r: _ints(r["ids"]) and all(type(k) is bytes and len(k) == 32 for k in r["enc_pk"] + r["mask_pk"])
             and all(type(s) is bytes and len(s) == 64 for s in r.get("sig", []))),
    "inbox": (wire.read_inbox, ["ids", "ct"], lambda r: _ints(r["ids"])),
    "masked": (lambda r: wire.read_masked(r, 5), ["masked"], lambda r: type(r["masked"]) is bytes),
    "plan": (wire.RoundPlan.from_record, ["round", "cohort", "sizes", "index", "answering", "n_selected", "steps",
                                          "batch", "describe", "sa_bits", "sa_d", "sa_threshold",
                                          "sa_min_survivors", "sa_degree", "sa_edges", "sa_vk", "sa_binding"],
             lambda r: _ints(r["cohort"]) and _ints(r["sizes"]) and ("sa_bits" not in r or _ints(r["sa_edges"]))
             and all(type(k) is bytes and len(k) == 32 for k in r.get("sa_vk", []))
             and all(type(b) is bytes and 1 <= len(b) <= 120 for b in r.get("sa_binding", []))),
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_READERS)), st.data())
def test_wire_readers_parse_or_reject_any_record(name, data):
    """A record of any shape either parses into well-typed values or raises ProtocolError:
    nothing is cast, and no other exception escapes."""
    read, fields, ok = _READERS[name]
    present = data.draw(st.lists(st.sampled_from(fields), unique=True, min_size=len(fields) - 1))
    rec = ConfigRecord({f: data.draw(st.one_of(_TYPED.get(f, _VALUE), _VALUE)) for f in present})
    try:
        read(rec)
    except ProtocolError:
        return
    assert ok(rec), f"{name}: parsed a record with values of the wrong type"


def test_every_message_kind_is_a_flower_message_type_the_client_app_routes():
    """The coordinator sends `kind` as Flower's message_type; the ClientApp must route each one
    (a kind in HANDLERS without its decorator would only fail over a real SuperLink)."""
    from flwr.app.metadata import validate_message_type

    from dpfl.flower import client as fclient

    routed = set(fclient.app._registered_funcs)
    for kind in fclient.HANDLERS:
        assert validate_message_type(kind), kind
        assert (kind if "." in kind else f"{kind}.default") in routed, kind
    assert "train.statistic" in fclient.HANDLERS  # FSVRG's full-gradient exchange
