"""What travels in Flower messages: the round plan, model vectors, codec payloads and the
secure-aggregation messages of `dpfl.secagg.protocol`, as Flower records.

Only plain types cross the wire (ints, bytes, lists, numpy arrays in `ArrayRecord`s); nothing
is unpickled. Every reader checks types and lengths and raises `ProtocolError` naming the field.
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from dpfl.compression.base import Payload
from dpfl.compression.bits import packed_nbytes, unpack_uint
from dpfl.errors import ConfigError, ProtocolError
from dpfl.flower.certs import BINDING_MAX_BYTES
from dpfl.secagg.keys import KEY_BYTES, SIGNATURE_BYTES
from dpfl.secagg.protocol import (
    AdvertiseKeys,
    MaskedInput,
    RoundConfig,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskShares,
)
from dpfl.secagg.ring import word_dtype

PLAN = "plan"
MODEL = "model"
PAYLOAD = "payload"
STATISTIC = "statistic"  # a client's row of the round statistic, or the server's statistic it trains with
SECAGG = "secagg"
REPLY = "reply"
TIMING = "timing"  # a ClientApp's own time split (launch, import, work), in seconds
EVALUATE = "evaluate"  # in a training message: evaluate the model received first (the last round's model)
EVALUATION = "evaluation"  # in its reply: the counts of that evaluation
NEXT_PLAN, NEXT_KEYS = "next_plan", "next_keys"  # in an unmask message: the next round's phase 1
NEXT_SECAGG, NEXT_ERROR = "next_secagg", "next_error"  # in its reply: that round's shares, or why not
HELLO = "hello"  # the server's hello: the run's salt for the sites' data MACs
SALT_BYTES = 32


def _get(rec: ConfigRecord, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in rec:
        raise ProtocolError(f"{what}: field {key!r} is missing")
    v = rec[key]
    if kind is int and isinstance(v, bool) or not isinstance(v, kind):
        raise ProtocolError(f"{what}: field {key!r} must be {kind}, got {type(v).__name__}")
    return v


def _blobs(xs: list, what: str, size: int | None = None, most: int = 0) -> list[bytes]:
    """A list of byte strings, each exactly `size` bytes or 1..`most` bytes, else ProtocolError."""
    if not all(isinstance(x, bytes) and (len(x) == size if size is not None else 1 <= len(x) <= most) for x in xs):
        raise ProtocolError(f"{what}: must be a list of " + (f"{size}-byte strings" if size is not None else
                                                              f"byte strings of 1..{most} bytes"))
    return list(xs)


def _record(content: RecordDict, name: str, what: str) -> Any:
    if name not in content:
        raise ProtocolError(f"{what}: record {name!r} is missing")
    return content[name]


@dataclass
class RoundPlan:
    """What the server tells one client about a round.

    cohort/sizes: ids and data sizes of the clients asked this round (the sizes let a client
    in seeded mode draw its local batches exactly as the simulator does); index: this client's
    position in `cohort`; answering: k, the clients whose rows make up the sum (DP shares are
    calibrated on it); steps/batch: local iterations and batch size (full-batch schemes use the
    cohort's largest dataset); secagg: the round configuration of the secure sum, if any, and
    in a signed round each cohort member's Ed25519 key and its binding to the member's
    registered node key (`signing_keys`, `bindings`: lists in cohort order); values: the scheme's
    `Step.round_values` ("<step index>/<name>" → a finite float: the adaptive clip's bound C_t).
    """

    round: int
    cohort: list[int]
    sizes: list[int]
    index: int
    answering: int
    n_selected: int
    steps: int
    batch: int
    describe: str  # the scheme as the server built it (clients check theirs is the same)
    secagg: dict[str, Any] = field(default_factory=dict)  # bits, d, threshold, min_survivors, graph[, signing]
    values: dict[str, float] = field(default_factory=dict)  # the steps' round values (Step.round_values)

    def to_record(self) -> ConfigRecord:
        d = asdict(self)
        sec = d.pop("secagg")
        values = d.pop("values")
        rec = ConfigRecord({k: v for k, v in d.items()})
        if values:
            rec["step_names"], rec["step_values"] = list(values), [float(v) for v in values.values()]
        if sec:
            rec["sa_bits"], rec["sa_d"] = int(sec["bits"]), int(sec["d"])
            rec["sa_threshold"], rec["sa_min_survivors"] = int(sec["threshold"]), int(sec["min_survivors"])
            graph = sec["graph"]
            rec["sa_degree"] = [len(graph[u]) for u in range(len(graph))]
            rec["sa_edges"] = [int(v) for u in range(len(graph)) for v in graph[u]]
            if "signing_keys" in sec:
                rec["sa_vk"], rec["sa_binding"] = list(sec["signing_keys"]), list(sec["bindings"])
        return rec

    @classmethod
    def from_record(cls, rec: ConfigRecord) -> RoundPlan:
        w = "round plan"
        ints = {k: _get(rec, k, int, w) for k in ("round", "index", "answering", "n_selected", "steps", "batch")}
        cohort = _ints(_get(rec, "cohort", list, w), f"{w}: cohort")
        sizes = _ints(_get(rec, "sizes", list, w), f"{w}: sizes")
        if len(cohort) != len(sizes) or not 0 <= ints["index"] < len(cohort):
            raise ProtocolError(f"{w}: cohort, sizes and index disagree ({len(cohort)}, {len(sizes)}, "
                                f"{ints['index']})")
        sec: dict[str, Any] = {}
        if "sa_bits" in rec:
            degree = _ints(_get(rec, "sa_degree", list, w), f"{w}: sa_degree")
            edges = _ints(_get(rec, "sa_edges", list, w), f"{w}: sa_edges")
            if len(degree) != len(cohort) or sum(degree) != len(edges):
                raise ProtocolError(f"{w}: the neighbour graph does not match the cohort")
            graph, pos = {}, 0
            for u, n in enumerate(degree):
                graph[u] = tuple(edges[pos : pos + n])
                pos += n
            sec = {"bits": _get(rec, "sa_bits", int, w), "d": _get(rec, "sa_d", int, w),
                   "threshold": _get(rec, "sa_threshold", int, w),
                   "min_survivors": _get(rec, "sa_min_survivors", int, w), "graph": graph}
        if "sa_vk" in rec or "sa_binding" in rec:
            if not sec:
                raise ProtocolError(f"{w}: signing keys in a plan without a secure sum")
            vks = _blobs(_get(rec, "sa_vk", list, w), f"{w}: sa_vk", KEY_BYTES)
            bindings = _blobs(_get(rec, "sa_binding", list, w), f"{w}: sa_binding", most=BINDING_MAX_BYTES)
            if not len(vks) == len(bindings) == len(cohort):
                raise ProtocolError(f"{w}: {len(vks)} signing keys and {len(bindings)} bindings for a cohort of "
                                    f"{len(cohort)}")
            sec.update(signing_keys=vks, bindings=bindings)
        values: dict[str, float] = {}
        if "step_names" in rec or "step_values" in rec:
            names, vals = _get(rec, "step_names", list, w), _get(rec, "step_values", list, w)
            if (len(names) != len(vals) or len(set(names)) != len(names) or not all(isinstance(x, str) for x in names)
                    or not all(isinstance(v, float) and math.isfinite(v) for v in vals)):
                raise ProtocolError(f"{w}: step_names and step_values must be distinct names and as many finite "
                                    "floats")
            values = dict(zip(names, vals))
        return cls(cohort=cohort, sizes=sizes, describe=_get(rec, "describe", str, w), secagg=sec, values=values,
                   **ints)

    @property
    def signed(self) -> bool:
        return "signing_keys" in self.secagg

    def round_config(self, d: int | None = None, bits: int | None = None,
                     signing_keys: dict[int, bytes] | None = None) -> RoundConfig:
        """The secure-sum configuration (validated by `RoundConfig`). In the first phase the
        server does not know d and b yet (they follow from the clients' rows): pass them.
        `signing_keys` (checked ones, `party.plan_signing_keys`): a signed round, whose statements
        name the cohort's client ids."""
        s = self.secagg
        if not s:
            raise ProtocolError(f"round {self.round}: the plan has no secure-aggregation configuration")
        ids = None if signing_keys is None else dict(enumerate(self.cohort))
        try:
            return RoundConfig(self.round, len(self.cohort), s["d"] if d is None else d,
                               s["bits"] if bits is None else bits, s["graph"], s["threshold"], s["min_survivors"],
                               signing_keys, ids)
        except ConfigError as e:
            raise ProtocolError(f"round {self.round}: the plan's secure-sum configuration is invalid: {e}") from None


def hello_request(salt: bytes) -> RecordDict:
    """The server's hello: the run's salt for the sites' data MACs (public; one per run, kept on resume)."""
    return RecordDict({HELLO: ConfigRecord({"mac_salt": salt})})


def read_hello_request(content: RecordDict) -> bytes:
    """The salt of the server's hello: exactly `SALT_BYTES` bytes, else ProtocolError."""
    if HELLO not in content:
        raise ProtocolError("hello request: record 'hello' is missing (a server from before 2026-11-28, whose hello "
                            "carries no data MAC salt?)")
    salt = _get(content[HELLO], "mac_salt", bytes, "hello request")
    if len(salt) != SALT_BYTES:
        raise ProtocolError(f"hello request: field 'mac_salt' must be {SALT_BYTES} bytes, got {len(salt)}")
    return salt


SIGNING_FIELDS = ("sign_pk", "binding", "keys_sig")  # a signing node's hello: Ed25519 key, binding, round key sigs


def read_hello(content: RecordDict, rounds: int, secure: bool) -> dict[str, Any]:
    """A client's hello: id, data size, scheme description, seeded flag, `data` (the HMAC-SHA256 of its
    training and held-out arrays under its site key, 64 lowercase hex digits), round public keys, and for a signing
    node (secure schemes only) `signing` = (Ed25519 key, binding, signatures of the round keys),
    else None; for secure schemes `fresh`: the node had no state (keys, shares) before this hello (None
    where an older site does not say)."""
    w = "hello"
    rec = _record(content, REPLY, w)
    out = {"cid": _get(rec, "cid", int, w), "size": _get(rec, "size", int, w),
           "describe": _get(rec, "describe", str, w), "seeded": _get(rec, "seeded", bool, w),
           "data": _get(rec, "data_mac", str, w), "keys": [], "signing": None}
    if len(out["data"]) != 64 or not set(out["data"]) <= set("0123456789abcdef"):
        raise ProtocolError(f"{w}: field 'data_mac' must be an HMAC-SHA256 in 64 lowercase hex digits")
    if rec.get("data_mac_salted") is not True:
        raise ProtocolError(f"{w}: the site's data MAC is not salted with the run's salt (a dpfl from before "
                            "2026-11-28 on the site?): update the site")
    if secure:
        enc, mask = _get(rec, "enc_pk", list, w), _get(rec, "mask_pk", list, w)
        if not len(enc) == len(mask) == rounds:
            raise ProtocolError(f"{w}: {len(enc)} and {len(mask)} public keys for {rounds} rounds")
        if any(not isinstance(x, bytes) or len(x) != 32 for x in (*enc, *mask)):
            raise ProtocolError(f"{w}: public keys must be 32-byte X25519 keys")
        out["keys"] = list(zip(enc, mask))
        out["fresh"] = _get(rec, "fresh", bool, w) if "fresh" in rec else None  # None: a site before 2026-11-29
        if any(f in rec for f in SIGNING_FIELDS):
            vk = _get(rec, "sign_pk", bytes, w)
            binding = _get(rec, "binding", bytes, w)
            sigs = _blobs(_get(rec, "keys_sig", list, w), f"{w}: keys_sig", SIGNATURE_BYTES)
            if len(vk) != KEY_BYTES or not 1 <= len(binding) <= BINDING_MAX_BYTES or len(sigs) != rounds:
                raise ProtocolError(f"{w}: a {KEY_BYTES}-byte signing key, a binding of 1..{BINDING_MAX_BYTES} "
                                    f"bytes and {rounds} round key signatures expected")
            out["signing"] = (vk, binding, sigs)
    return out


def wants_evaluation(content: RecordDict) -> bool:
    return EVALUATE in content


def evaluate_flag(r: int) -> ConfigRecord:
    """The flag asking a site to evaluate the model it receives: the model after round `r`."""
    return ConfigRecord({"round": int(r)})


def with_evaluation(reply: RecordDict, counts: dict[str, float | int] | None) -> RecordDict:
    if counts is not None:
        reply[EVALUATION] = ConfigRecord(dict(counts))
    return reply


def read_evaluation(content: RecordDict, name: str = REPLY) -> dict[str, float | int]:
    """A site's evaluation counts: n ≥ 0 examples, 0 ≤ correct ≤ n, a finite loss sum ≥ 0."""
    rec = _record(content, name, "evaluation")
    n, correct = _get(rec, "n", int, "evaluation"), _get(rec, "correct", int, "evaluation")
    loss = _get(rec, "loss_sum", float, "evaluation")
    if not 0 <= correct <= n or not (math.isfinite(loss) and loss >= 0):
        raise ProtocolError(f"evaluation: n = {n}, correct = {correct}, loss_sum = {loss} are not counts of one set")
    return {"n": n, "correct": correct, "loss_sum": loss}


def read_timing(content: RecordDict | None) -> dict[str, float]:
    """A reply's `TIMING` record (launch, import, work: finite seconds ≥ 0), or {} without one.
    Informative only: a malformed record is ignored, never trusted for anything else."""
    rec = None if content is None else content.get(TIMING)
    if not isinstance(rec, ConfigRecord):
        return {}
    out = {}
    for part in ("launch", "import", "work"):
        v = rec.get(part)
        if isinstance(v, float) and 0.0 <= v < 1e6:
            out[part] = v
    return out


def read_shape(content: RecordDict, secure: bool) -> tuple[int, int]:
    """The length d of a client's row and, for a secure sum, its modulus bits b (else 0)."""
    rec = _record(content, REPLY, "reply")
    d = _get(rec, "d", int, "reply")
    return d, _get(rec, "bits", int, "reply") if secure else 0


# ---------------------------------------------------------------- vectors and payloads


def vector_record(w: np.ndarray) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.ascontiguousarray(w))})


def read_vector(content: RecordDict, n: int, name: str = MODEL) -> np.ndarray:
    """The float32 [n] vector in record `name` (the model, or a round statistic)."""
    rec = _record(content, name, name)
    if "w" not in rec:
        raise ProtocolError(f"{name}: array 'w' is missing")
    w = rec["w"].numpy()
    if w.dtype != np.float32 or w.shape != (n,):
        raise ProtocolError(f"{name}: expected float32 [{n}], got {w.dtype} {list(w.shape)}")
    return w


def read_statistic(content: RecordDict, n: int) -> np.ndarray:
    """The round statistic a client trains with (`Step.round_statistic`): finite float32 [n]."""
    w = read_vector(content, n, STATISTIC)
    bad = int((~np.isfinite(w)).sum())
    if bad:
        raise ProtocolError(f"{STATISTIC}: {bad} of its {n} values are NaN or infinite")
    return w


def payload_record(p: Payload) -> ArrayRecord:
    """One client's payload (its row of each array, exact dtype)."""
    if p.k != 1:
        raise ProtocolError(f"a client sends one payload row, got {p.k}")
    if p.meta:
        raise ProtocolError(f"payload metadata {sorted(p.meta)} is not sent over Flower; codecs must put "
                            "what decoding needs in arrays")
    return ArrayRecord({name: Array(np.ascontiguousarray(a)) for name, a in p.arrays.items()})


def read_payload(content: RecordDict, names: list[str] | None = None) -> Payload:
    rec = _record(content, PAYLOAD, "payload")
    arrays = {name: rec[name].numpy() for name in rec}
    if names is not None and sorted(arrays) != sorted(names):
        raise ProtocolError(f"payload: arrays {sorted(arrays)}, expected {sorted(names)}")
    for name, a in arrays.items():
        if a.ndim < 1 or a.shape[0] != 1:
            raise ProtocolError(f"payload: array {name!r} must have one leading row, got shape {list(a.shape)}")
    return Payload(arrays)


REPORT = "report"


def report_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """What a client's steps report beside its row (`Step.client_report`): one row per array."""
    return ArrayRecord({name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()})


def read_report(content: RecordDict) -> dict[str, np.ndarray]:
    """A client's step reports ({} if it sent none); every array has one leading row."""
    if REPORT not in content:
        return {}
    rec = content[REPORT]
    out = {name: rec[name].numpy() for name in rec}
    for name, a in out.items():
        if a.ndim < 1 or a.shape[0] != 1:
            raise ProtocolError(f"report: array {name!r} must have one leading row, got shape {list(a.shape)}")
    return out


def stack_payloads(payloads: list[Payload]) -> Payload:
    """Rows of several clients into one cohort payload (the layout `Codec.decode` takes)."""
    names = sorted(payloads[0].arrays)
    for p in payloads[1:]:
        if sorted(p.arrays) != names:
            raise ProtocolError("payloads of one round carry different arrays")
    try:
        return Payload({n: np.concatenate([p.arrays[n] for p in payloads]) for n in names})
    except ValueError as e:
        raise ProtocolError(f"payloads of one round have different shapes: {e}") from None


# ---------------------------------------------------------------- secure aggregation messages


def advertise_record(m: AdvertiseKeys) -> ConfigRecord:
    return ConfigRecord({"sender": m.sender, "round": m.round_id, "enc_pk": m.enc_pk, "mask_pk": m.mask_pk})


def read_advertise(rec: ConfigRecord) -> AdvertiseKeys:
    w = "AdvertiseKeys"
    return AdvertiseKeys(_get(rec, "sender", int, w), _get(rec, "round", int, w),
                         _get(rec, "enc_pk", bytes, w), _get(rec, "mask_pk", bytes, w))


def share_record(m: ShareKeys) -> ConfigRecord:
    to = sorted(m.ciphertexts)
    return ConfigRecord({"sender": m.sender, "round": m.round_id, "to": to, "ct": [m.ciphertexts[v] for v in to],
                         "commit": m.commitment})


def read_share(rec: ConfigRecord) -> ShareKeys:
    w = "ShareKeys"
    to, ct = _get(rec, "to", list, w), _get(rec, "ct", list, w)
    return ShareKeys(_get(rec, "sender", int, w), _get(rec, "round", int, w), _pairs(to, ct, w),
                     _get(rec, "commit", bytes, w))


def masked_record(m: MaskedInput) -> ConfigRecord:
    return ConfigRecord({"masked": m.to_bytes()})


_MASKED_HEAD = struct.Struct("<IqB")


def read_masked(rec: ConfigRecord, d: int) -> MaskedInput:
    """Parse `MaskedInput.to_bytes()`: sender, round, bits, then d values packed at `bits` bits."""
    blob = _get(rec, "masked", bytes, "MaskedInput")
    if len(blob) < _MASKED_HEAD.size:
        raise ProtocolError(f"MaskedInput: {len(blob)} bytes is shorter than its header")
    sender, round_id, bits = _MASKED_HEAD.unpack_from(blob)
    if not 1 <= bits <= 64:
        raise ProtocolError(f"MaskedInput: modulus bits {bits} outside [1, 64]")
    body = np.frombuffer(blob, dtype=np.uint8, offset=_MASKED_HEAD.size)
    if body.size != packed_nbytes(d, bits):
        raise ProtocolError(f"MaskedInput: {body.size} value bytes, expected {packed_nbytes(d, bits)} "
                            f"for {d} values at {bits} bits")
    values = unpack_uint(body[None, :], d, bits)[0].astype(word_dtype(bits))
    return MaskedInput(sender, round_id, bits, values)


def request_record(r: UnmaskRequest) -> ConfigRecord:
    rec = ConfigRecord({"round": r.round_id, "survivors": sorted(r.survivors)})
    if r.signatures:  # a signed round's unmask request: the survivors' signatures of the list
        signers = sorted(r.signatures)
        rec["signers"], rec["signatures"] = signers, [r.signatures[v] for v in signers]
    return rec


def read_request(rec: ConfigRecord) -> UnmaskRequest:
    w = "UnmaskRequest"
    ids = _ints(_get(rec, "survivors", list, w), f"{w}: survivors")
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"{w}: the survivor list repeats an id")
    sigs: dict[int, bytes] = {}
    if "signers" in rec or "signatures" in rec:
        sigs = _pairs(_get(rec, "signers", list, w), _get(rec, "signatures", list, w), f"{w}: signatures")
        _blobs(list(sigs.values()), f"{w}: signatures", SIGNATURE_BYTES)
    return UnmaskRequest(_get(rec, "round", int, w), frozenset(ids), sigs)


def signature_record(m: SurvivorSignature) -> ConfigRecord:
    return ConfigRecord({"sender": m.sender, "round": m.round_id, "signature": m.signature})


def read_signature(rec: ConfigRecord) -> SurvivorSignature:
    """A survivor's signature of the survivor list (the consistency check of a signed round)."""
    w = "SurvivorSignature"
    sig = _get(rec, "signature", bytes, w)
    if len(sig) != SIGNATURE_BYTES:
        raise ProtocolError(f"{w}: the signature must be {SIGNATURE_BYTES} bytes, got {len(sig)}")
    return SurvivorSignature(_get(rec, "sender", int, w), _get(rec, "round", int, w), sig)


def unmask_record(m: UnmaskShares) -> ConfigRecord:
    s, k = sorted(m.self_mask_shares), sorted(m.key_shares)
    return ConfigRecord({"sender": m.sender, "round": m.round_id,
                         "self_ids": s, "self_shares": [m.self_mask_shares[v] for v in s],
                         "key_ids": k, "key_shares": [m.key_shares[v] for v in k]})


def read_unmask(rec: ConfigRecord) -> UnmaskShares:
    w = "UnmaskShares"
    return UnmaskShares(_get(rec, "sender", int, w), _get(rec, "round", int, w),
                        _pairs(_get(rec, "self_ids", list, w), _get(rec, "self_shares", list, w), w),
                        _pairs(_get(rec, "key_ids", list, w), _get(rec, "key_shares", list, w), w))


def keys_record(keys: dict[int, tuple[bytes, ...]]) -> ConfigRecord:
    """Neighbour keys (enc, mask) or, in a signed round, (enc, mask, signature)."""
    ids = sorted(keys)
    rec = ConfigRecord({"ids": ids, "enc_pk": [keys[v][0] for v in ids], "mask_pk": [keys[v][1] for v in ids]})
    if any(len(keys[v]) == 3 for v in ids):
        rec["sig"] = [keys[v][2] for v in ids]
    return rec


def read_keys(rec: ConfigRecord) -> dict[int, tuple[bytes, ...]]:
    w = "neighbour keys"
    ids, enc, mask = _get(rec, "ids", list, w), _get(rec, "enc_pk", list, w), _get(rec, "mask_pk", list, w)
    if not len(ids) == len(enc) == len(mask) or len(set(_ints(ids, w))) != len(ids):
        raise ProtocolError(f"{w}: ids and keys have different lengths or an id repeats")
    if any(not isinstance(x, bytes) or len(x) != 32 for x in (*enc, *mask)):
        raise ProtocolError(f"{w}: public keys must be 32-byte X25519 keys")
    if "sig" not in rec:
        return {int(v): (e, m) for v, e, m in zip(ids, enc, mask)}
    sigs = _blobs(_get(rec, "sig", list, w), f"{w}: signatures", SIGNATURE_BYTES)
    if len(sigs) != len(ids):
        raise ProtocolError(f"{w}: {len(sigs)} signatures for {len(ids)} keys")
    return {int(v): (e, m, g) for v, e, m, g in zip(ids, enc, mask, sigs)}


def inbox_record(inbox: dict[int, bytes]) -> ConfigRecord:
    ids = sorted(inbox)
    return ConfigRecord({"ids": ids, "ct": [inbox[v] for v in ids]})


def read_inbox(rec: ConfigRecord) -> dict[int, bytes]:
    w = "inbox"
    return _pairs(_get(rec, "ids", list, w), _get(rec, "ct", list, w), w)


def _ints(xs: list, what: str) -> list[int]:
    """A list of plain integers (not bools, floats or strings), else ProtocolError."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in xs):
        raise ProtocolError(f"{what}: must be a list of integers")
    return [int(x) for x in xs]


def _pairs(ids: list, blobs: list, what: str) -> dict[int, bytes]:
    if len(ids) != len(blobs) or len(set(ids)) != len(ids):
        raise ProtocolError(f"{what}: ids and values differ in length or repeat an id")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ProtocolError(f"{what}: ids must be integers")
    if not all(isinstance(b, bytes) for b in blobs):
        raise ProtocolError(f"{what}: values must be bytes")
    return {int(i): b for i, b in zip(ids, blobs)}


def content_nbytes(obj: Any) -> int:
    """Bytes of a message's content as Flower serializes it (every record, array and chunk
    object, with their headers): what the message costs on the wire, before transport framing."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(o.deflate()) for o in get_all_nested_objects(obj).values())
