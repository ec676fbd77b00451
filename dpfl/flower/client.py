"""The ClientApp: a SuperNode's client answers the server's messages.

Message types (content records in `wire`):

    query              hello (the server sends the run's salt): client id, data size, the MAC of the salt and
                       its training and held-out arrays (keyed by its site key),
                       the scheme it built; for secure schemes also
                       its two X25519 public keys of every round (advertised ahead of time) and,
                       on a signing node, its Ed25519 key of the run, that key's binding to the
                       registered node key, and its signatures of the round keys; and whether it
                       had no state before this hello (`fresh`: a first hello, or a restarted node)
    train.statistic    schemes whose step needs a round statistic first (FSVRG): the client's row
                       of it (its full local gradient); the server's combination of the rows
                       then comes with the training message, checked (finite float32 [n])
    train              a plain round: train, client chain, codec payload
    train.sa_keys      secure sum, phase 1 on its own (before the first round, or when the last
                       unmask message did not carry it): Shamir shares of the round's mask key and
                       self-mask seed, encrypted to its neighbours
    train.sa_train     phase 2: [evaluate the model it receives, when asked: the last round's
                       federated evaluation], train, client chain, encode in Z_(2^b), and the
                       masked input y = x + masks mod 2^b over the neighbours in its inbox, once
                       the round's secure-sum configuration is checked against its own config
    train.sa_consistency  signed rounds only: its signature of the survivor list (kept on the
                       node: it unmasks for that list only)
    train.sa_unmask    phase 3: the shares the server needs to remove the masks of the survivors
                       (signed: with at least max(t, min_survivors) survivors' signatures of the
                       list); and, when it carries the next round's plan and keys, that round's
                       phase 1. A round thus costs two exchanges (three signed), not four
    evaluate           federated evaluation: the global model on the site's held-out data (its
                       test-path file, or its part of the built-in test set), as counts

The secrets stay in the node's `context.state` (never sent): a 32-byte node secret from which
each round's key (`party.round_key`) and thus `party.Party` are rebuilt, and the messages of
earlier phases (the encoded row is masked in the message that encodes it, never stored). Phases come in order and once each; a round key is never used for
two rounds, and the round's state is deleted after unmasking, so a client never answers two
unmask requests.

Signed rounds (node config `signing-key` and `peers`, docs/threat-model.md): every binding in
the plan is checked against this node's own peers file in every phase, and a node with `peers`
refuses an unsigned secure round (no downgrade).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dpfl.errors import ConfigError, ProtocolError
from dpfl.flower import STARTED, certs, wire
from dpfl.flower.party import (
    Party,
    plan_digest,
    plan_signing_keys,
    round_key,
    round_public_keys,
    sign_round_keys,
    signing_key,
)
from dpfl.secagg import keys as kx

_IMPORTED = time.time()

# The training code (torch, training, the schemes) is imported only by the handlers that
# train: a ClientApp process serves one message, and the masking and unmasking phases need
# none of it.

log = logging.getLogger("dpfl.flower")

CONFIG_KEY = "dpfl-config"  # run config key holding the dpfl TOML text
NODE = "dpfl_node"  # context.state: the node secret and the last round it took part in
STATE = "dpfl_secagg"  # context.state: the current secure-sum round
RECORD = "dpfl_record"  # context.state: local DP-SGD steps taken, per sampling rate (train.dpsgd)
CLIENT_STATE = "dpfl_client_state"  # context.state: the scheme's per-client state (FedDyn's memory)


def run_config_text(run_config: Mapping[str, Any]) -> str:
    text = run_config.get(CONFIG_KEY)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"the Flower run config needs {CONFIG_KEY!r}: the dpfl TOML text (see `dpfl flower app`)")
    return text


def parse_run_config(text: str):
    """The dpfl `RunConfig` in the run config's TOML text."""
    from dpfl.config import load_config

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"run config {CONFIG_KEY!r} is not valid TOML: {e}") from None
    return load_config(data=data)


def local_client(node_config: Mapping[str, Any], run_config: Mapping[str, Any]):
    """This node's `node.LocalClient`, built afresh for every message as a deployed ClientApp
    process is: what a step keeps per client between rounds (`Step.client_state`) is kept in the
    node's state (`CLIENT_STATE`); the server holds the rest of the scheme's state."""
    from dpfl.flower.node import LocalClient, NodeSettings

    cfg = parse_run_config(run_config_text(run_config))
    return LocalClient(cfg, NodeSettings.parse(node_config, cfg.data.n_clients))


# ---------------------------------------------------------------- handlers (plain functions)


def hello(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    salt = wire.read_hello_request(content)
    c = local_client(node_config, run_config)
    if c.node.seeded:
        log.warning("client %d: dpfl-seeded = true: its randomness comes from the config seed, reproducible "
                    "and NOT private (tests only)", c.cid)
    reply = ConfigRecord({"cid": c.cid, "size": c.size, "describe": c.scheme.describe(), "seeded": c.node.seeded,
                          "data_mac": c.data_mac(salt),
                          "data_mac_salted": True})
    if c.scheme.transport.secure:
        reply["fresh"] = NODE not in state  # a first hello, or a restarted node's: it holds no keys or shares
        if reply["fresh"]:
            state[NODE] = ConfigRecord({"secret": c.node_secret(), "last_round": 0, "first_round": 0})
        keys = round_public_keys(state[NODE]["secret"], c.cfg.federation.rounds)
        reply["enc_pk"], reply["mask_pk"] = [k[0] for k in keys], [k[1] for k in keys]
        files = certs.signing_files(node_config)
        if files is not None:
            signing = _signing_hello(files, state[NODE]["secret"], c.cid, run_config_text(run_config), keys)
            reply.update(dict(zip(wire.SIGNING_FIELDS, signing)))
    return RecordDict({wire.REPLY: reply})


def _signing_hello(files: tuple[str, str], secret: bytes, cid: int, config_text: str,
                   keys: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes, list[bytes]]:
    """A signing node's hello: its run's Ed25519 key, the key's binding by the node key (which
    must be the one its peers file lists for it), and its signatures of the round keys."""
    key_path, peers_path = files
    node_key = certs.load_node_key(key_path)
    peers = certs.read_peers(peers_path)
    if cid not in peers or not certs.same_key(peers[cid], node_key.public_key()):
        raise ConfigError(f"node config signing-key {key_path} is not the key peers file {peers_path} lists for "
                          f"client {cid}")
    signer = signing_key(secret)
    vk = kx.verification_bytes(signer)
    return vk, certs.bind(node_key, config_text, cid, vk), sign_round_keys(signer, cid, keys)


def _train(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping):
    import torch

    from dpfl.flower.node import record_spend
    from dpfl.schemes.round import statistic_step

    c = local_client(node_config, run_config)
    plan = wire.RoundPlan.from_record(content[wire.PLAN])
    _redrawn_noise(c, state, plan.round, run_config)  # before anything is spent
    w = torch.from_numpy(wire.read_vector(content, c.n).copy()).to(c.device)
    c.evaluated = c.evaluate(w) if wire.wants_evaluation(content) else None  # the last round's model, first
    stat = None
    if statistic_step(c.scheme) is not None:  # before anything is spent or changed on the node
        stat = torch.from_numpy(wire.read_statistic(content, c.n).copy()).to(c.device)
    elif wire.STATISTIC in content:
        raise ProtocolError(f"round {plan.round}: the server sent a round statistic, scheme {c.scheme.name!r} "
                            "uses none")
    if c.cfg.train.dpsgd is not None:  # the client's own record-level budget, spent before it trains
        steps = {float(q): int(s) for q, s in state[RECORD].items()} if RECORD in state else {}
        steps, eps = record_spend(c.cfg, steps, min(1.0, plan.batch / c.size), plan.steps)
        state[RECORD] = ConfigRecord({repr(q): s for q, s in steps.items()})
        log.info("client %d: record-level ε = %.4g after round %d", c.cid, eps, plan.round)
    if c.scheme.client_state and CLIENT_STATE in state:
        c.load_client_state({k: a.numpy() for k, a in state[CLIENT_STATE].items()})
    u, ctx = c.update(plan, w, stat)
    if c.scheme.client_state:
        state[CLIENT_STATE] = ArrayRecord({k: Array(np.ascontiguousarray(a)) for k, a in c.client_state().items()})
    return c, plan, u, ctx


def _redrawn_noise(c, state: RecordDict, r: int, run_config: Mapping) -> None:
    """Distributed correlated noise draws some of a client's noise again in later rounds (DP-FTRL's
    tree nodes): those streams are keyed from the node secret and the run's config (Flower keeps a
    node's state across the runs of a series), and the secret must be the one it had in round 1 (a
    restarted site made a new one: its share cannot continue the run's noise, so it is refused)."""
    from dpfl.flower.node import OsSeeds, distributed_correlated
    from dpfl.rng import derive_key

    if c.node.seeded or not distributed_correlated(c.scheme):
        return
    node = state.get(NODE)
    if node is None or node.get("first_round", 0) != 1:
        raise ProtocolError(f"round {r}: this site's secret did not serve round 1 (it was restarted, or missed "
                            "round 1): its share of the correlated noise cannot continue the run's, which draws "
                            "round 1's noise again; it takes no further part")
    run = hashlib.sha256(run_config_text(run_config).encode()).hexdigest()
    c.seeds = OsSeeds(derive_key(node["secret"], "correlated-noise", run))


def statistic(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    import torch

    c = local_client(node_config, run_config)
    plan = wire.RoundPlan.from_record(content[wire.PLAN])
    w = torch.from_numpy(wire.read_vector(content, c.n).copy()).to(c.device)
    row = c.statistic(plan, w)
    return RecordDict({wire.STATISTIC: wire.vector_record(row.detach().cpu().numpy())})


def train_plain(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    from dpfl.schemes.transport import PlainTransport

    c, _, u, ctx = _train(content, state, node_config, run_config)
    transport = c.scheme.transport
    if not isinstance(transport, PlainTransport):
        raise ConfigError(f"transport {transport.name!r} is not a plain codec transport")
    payload = transport.codec.encode(u, ctx.numpy_rng("encode"))
    reply = RecordDict({wire.PAYLOAD: wire.payload_record(payload), wire.REPLY: ConfigRecord({"d": int(u.shape[1])})})
    report = c.report(ctx)
    if report:
        reply[wire.REPORT] = wire.report_record(report)
    return wire.with_evaluation(reply, c.evaluated)


def _phase_state(state: RecordDict, plan: wire.RoundPlan, expect: str) -> ConfigRecord:
    if STATE not in state:
        raise ProtocolError(f"round {plan.round}: no secure-sum state on this node (phase after {expect!r} out of "
                            "order or repeated)")
    st = state[STATE]
    if st["round"] != plan.round or st["digest"] != plan_digest(plan):
        raise ProtocolError(f"round {plan.round}: the plan differs from the one this client trained on")
    if st["phase"] != expect:
        raise ProtocolError(f"round {plan.round}: phase after {expect!r} requested, this client is after {st['phase']!r}")
    if (plan.secagg["d"], plan.secagg["bits"]) != (st["d"], st["bits"]):
        raise ProtocolError(f"round {plan.round}: the server's d, b = {plan.secagg['d']}, {plan.secagg['bits']} differ "
                            f"from this client's {st['d']}, {st['bits']}")
    return st


def _secret(state: RecordDict, r: int) -> bytes:
    if NODE not in state:
        raise ProtocolError(f"round {r}: this node has not advertised keys (no hello this run)")
    return state[NODE]["secret"]


Signing = tuple[Any, dict[int, bytes]]  # (this node's Ed25519 signer, position → checked Ed25519 key)


def _signing(state: RecordDict, plan: wire.RoundPlan, node_config: Mapping, run_config: Mapping) -> Signing | None:
    """The signing of a secure round, None if it is unsigned. A node with `peers` takes signed
    rounds only, with every binding checked against its peers file; a node without cannot check
    a signed plan."""
    files = certs.signing_files(node_config)
    if files is None:
        if plan.signed:
            raise ProtocolError(f"round {plan.round}: a signed plan, but this node has no peers file to check its "
                                "keys (node config signing-key, peers)")
        return None
    if not plan.signed:
        raise ProtocolError(f"round {plan.round}: an unsigned secure round, but this node signs its rounds (node "
                            "config peers): refused")
    keys = plan_signing_keys(plan, certs.read_peers(files[1]), run_config_text(run_config))
    signer = signing_key(_secret(state, plan.round))
    if keys[plan.index] != kx.verification_bytes(signer):
        raise ProtocolError(f"round {plan.round}: the plan gives this client (client {plan.cohort[plan.index]}) a "
                            "signing key that is not its own")
    return signer, keys


def _round_key(state: RecordDict, r: int) -> bytes:
    _secret(state, r)
    node = state[NODE]
    if r <= node["last_round"]:
        raise ProtocolError(f"round {r}: this client already took part in round {node['last_round']}; "
                            "a round's keys are used once")
    if node["last_round"] == 0:
        node["first_round"] = r  # the first round this secret served (`_redrawn_noise`)
    node["last_round"] = r
    return round_key(node["secret"], r)


def _share(plan: wire.RoundPlan, keys_rec: ConfigRecord, state: RecordDict, node_config: Mapping,
           run_config: Mapping) -> RecordDict:
    """Phase 1 of round `plan.round`, before it trains: Shamir-share the round's mask key and
    self-mask seed with the neighbours, encrypted to each. `RoundConfig` refuses a threshold of
    half the neighbours or fewer; that the configuration is the one this node's config implies
    (t, the graph's degree, min_survivors) is checked with the masked input, before anything
    that the shares protect leaves the node. d and b are fixed there too."""
    signing = _signing(state, plan, node_config, run_config)
    if plan.cohort[plan.index] != node_config.get("partition-id"):
        raise ProtocolError(f"round {plan.round}: the plan puts client {plan.cohort[plan.index]} at this node's "
                            f"position, this node holds partition-id {node_config.get('partition-id')!r}")
    k = len(plan.cohort)
    if plan.answering != k:
        raise ProtocolError(f"round {plan.round}: a secure sum over {k} clients must calibrate on k = {k}, the plan "
                            f"says {plan.answering}")
    if plan.secagg.get("d") or plan.secagg.get("bits"):
        raise ProtocolError(f"round {plan.round}: d and b are fixed with the masked input, not when keys are shared")
    rc = plan.round_config(*SHARE_SHAPE, None if signing is None else signing[1])
    keys = wire.read_keys(keys_rec)
    share = Party(rc, plan.index, _round_key(state, plan.round), None if signing is None else signing[0]).share(keys)
    st = ConfigRecord({"round": plan.round, "digest": plan_digest(plan), "phase": "shared", "d": 0, "bits": 0})
    for name, value in wire.keys_record(keys).items():
        st["keys_" + name] = value
    state[STATE] = st
    return RecordDict({wire.SECAGG: wire.share_record(share)})


SHARE_SHAPE = (1, 8)  # (d, b) of the RoundConfig a share is made under: sharing depends on neither


def sa_keys(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    """A round's key sharing on its own: before the first round, and whenever the previous
    round's unmask message did not carry it (after an aborted round, a resume, a rejoin)."""
    return _share(wire.RoundPlan.from_record(content[wire.PLAN]), content["keys"], state, node_config, run_config)


def sa_train(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    """Phase 2: train, run the client chain, encode in Z_(2^b), and send the masked input
    y = x + masks mod 2^b over the neighbours whose shares reached this client (the inbox)."""
    from dpfl.flower.node import check_round_config, encode_words, round_secagg

    plan = wire.RoundPlan.from_record(content[wire.PLAN])
    signing = _signing(state, plan, node_config, run_config)
    st = _phase_state(state, plan, "shared")  # before anything is spent or changed on the node
    inbox = wire.read_inbox(content["inbox"])
    c, plan, u, ctx = _train(content, state, node_config, run_config)
    k, d = plan.answering, int(u.shape[1])
    if c.report(ctx):
        raise ConfigError(f"scheme {c.scheme.name!r} reports per-client values to the server, which a secure sum "
                          "would hide; use the plain transport")
    sa = round_secagg(c.scheme.transport, k, d)
    words, bits = encode_words(sa, u, k, ctx.numpy_rng("secagg-round"), plan.index if c.node.seeded else None)
    rc = plan.round_config(d, bits, None if signing is None else signing[1])
    check_round_config(sa, rc)
    party = Party(rc, plan.index, round_key(state[NODE]["secret"], plan.round), None if signing is None else signing[0])
    msg = party.masked(_stored_keys(st), inbox, words[0])
    st["phase"], st["d"], st["bits"] = "masked", d, bits
    rec = wire.inbox_record(inbox)
    st["inbox_ids"], st["inbox_ct"] = rec["ids"], rec["ct"]
    reply = RecordDict({wire.SECAGG: wire.masked_record(msg), wire.REPLY: ConfigRecord({"d": d, "bits": bits})})
    return wire.with_evaluation(reply, c.evaluated)


def _stored_keys(st: ConfigRecord) -> dict[int, tuple[bytes, ...]]:
    return wire.read_keys(ConfigRecord({n: st["keys_" + n] for n in ("ids", "enc_pk", "mask_pk", "sig")
                                        if "keys_" + n in st}))


def _stored_inbox(st: ConfigRecord) -> dict[int, bytes]:
    return wire.read_inbox(ConfigRecord({"ids": st["inbox_ids"], "ct": st["inbox_ct"]}))


def _party(state: RecordDict, plan: wire.RoundPlan, signing: Signing | None) -> Party:
    if signing is None:
        return Party(plan.round_config(), plan.index, round_key(state[NODE]["secret"], plan.round))
    return Party(plan.round_config(signing_keys=signing[1]), plan.index, round_key(state[NODE]["secret"], plan.round),
                 signing[0])


def sa_consistency(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    """A signed round's consistency check: sign the survivor list, once; the list is kept."""
    plan = wire.RoundPlan.from_record(content[wire.PLAN])
    signing = _signing(state, plan, node_config, run_config)
    if signing is None:
        raise ProtocolError(f"round {plan.round}: a consistency check in a round without signatures")
    st = _phase_state(state, plan, "masked")
    request = wire.read_request(content["request"])
    try:
        msg = _party(state, plan, signing).sign(_stored_keys(st), _stored_inbox(st), request)
    except ProtocolError:
        del state[STATE]  # a list it refuses to sign: it leaves the round
        raise
    st["phase"], st["signed"] = "signed", sorted(request.survivors)
    return RecordDict({wire.SECAGG: wire.signature_record(msg)})


def sa_unmask(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    """Phase 3: the shares that remove the survivors' masks, once per round; and, when the
    message carries the next round's plan and keys (`wire.NEXT_PLAN`), that round's phase 1.
    The unmask part comes first and stands on its own: a next round it cannot join is reported in
    the reply (`wire.NEXT_ERROR`), never at the cost of the shares."""
    reply = RecordDict()
    if wire.PLAN in content:
        plan = wire.RoundPlan.from_record(content[wire.PLAN])
        signing = _signing(state, plan, node_config, run_config)
        st = _phase_state(state, plan, "masked" if signing is None else "signed")
        request = wire.read_request(content["request"])
        del state[STATE]  # answer at most once, whatever happens next
        signed = None if signing is None else frozenset(st["signed"])  # the list it signed, the only one it unmasks
        msg = _party(state, plan, signing).unmask(_stored_keys(st), _stored_inbox(st), request, signed)
        reply[wire.SECAGG] = wire.unmask_record(msg)
    if wire.NEXT_PLAN in content:
        try:
            if wire.NEXT_KEYS not in content:
                raise ProtocolError("an unmask message with the next round's plan but not its keys")
            nxt = _share(wire.RoundPlan.from_record(content[wire.NEXT_PLAN]), content[wire.NEXT_KEYS], state,
                         node_config, run_config)
        except Exception as e:  # whatever fails, the unmask shares already made are sent
            if wire.SECAGG not in reply:
                raise
            reply[wire.NEXT_ERROR] = ConfigRecord({"error": f"{type(e).__name__}: {e}"})
        else:
            reply[wire.NEXT_SECAGG] = nxt[wire.SECAGG]
    if not reply:
        raise ProtocolError("an unmask message with neither a round to unmask nor a next round to join")
    return reply


def evaluate(content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping) -> RecordDict:
    """Federated evaluation: the global model on this site's held-out data, as counts."""
    import torch

    c = local_client(node_config, run_config)
    w = torch.from_numpy(wire.read_vector(content, c.n).copy()).to(c.device)
    return RecordDict({wire.REPLY: ConfigRecord(c.evaluate(w))})


Handler = Callable[[RecordDict, RecordDict, Mapping, Mapping], RecordDict]
HANDLERS: dict[str, Handler] = {
    "query": hello,
    "train.statistic": statistic,
    "train": train_plain,
    "train.sa_keys": sa_keys,
    "train.sa_train": sa_train,
    "train.sa_consistency": sa_consistency,
    "train.sa_unmask": sa_unmask,
    "evaluate": evaluate,
}

# ---------------------------------------------------------------- the Flower ClientApp

# the messages that train run in the site's worker (`dpfl.flower.worker`), which keeps torch and the
# site's data loaded between messages; DPFL_SITE_WORKER=0 runs them in the ClientApp process instead
SITE_WORKER_KINDS = ("query", "train", "train.statistic", "train.sa_train", "evaluate")

app = ClientApp()


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime, in clock ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return 0.0


def _answer(kind: str, msg: Message, context: Context) -> Message:
    t0, age = time.time(), process_age()
    if kind in SITE_WORKER_KINDS and os.environ.get("DPFL_SITE_WORKER", "1") != "0":
        from dpfl.flower import worker  # this site's training process, kept alive between messages

        content = worker.call(kind, msg.content, context.state, context.node_config, context.run_config,
                              context.run_id, context.node_id)
    else:
        content = HANDLERS[kind](msg.content, context.state, context.node_config, context.run_config)
    work = time.time() - t0
    # where this process's time went: Flower's launch (process start to this module), importing
    # this module, the handler's work (lazy imports of training code included)
    content[wire.TIMING] = ConfigRecord({"launch": max(0.0, age - (t0 - STARTED)), "import": _IMPORTED - STARTED,
                                         "work": work})
    return Message(content, reply_to=msg)


@app.query()
def _hello(msg: Message, context: Context) -> Message:
    return _answer("query", msg, context)


@app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    return _answer("evaluate", msg, context)


@app.train("statistic")
def _statistic(msg: Message, context: Context) -> Message:
    return _answer("train.statistic", msg, context)


@app.train()
def _train_plain(msg: Message, context: Context) -> Message:
    return _answer("train", msg, context)


@app.train("sa_train")
def _sa_train(msg: Message, context: Context) -> Message:
    return _answer("train.sa_train", msg, context)


@app.train("sa_keys")
def _sa_keys(msg: Message, context: Context) -> Message:
    return _answer("train.sa_keys", msg, context)


@app.train("sa_consistency")
def _sa_consistency(msg: Message, context: Context) -> Message:
    return _answer("train.sa_consistency", msg, context)


@app.train("sa_unmask")
def _sa_unmask(msg: Message, context: Context) -> Message:
    return _answer("train.sa_unmask", msg, context)
