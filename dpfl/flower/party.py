"""A client's side of the secure sum across processes, and its round keys. Light on purpose:
the ClientApp processes of the masking and unmasking phases import only this, `wire`, `certs`
and `dpfl.secagg.protocol` (no training code).

Signed rounds (node config `signing-key` and `peers`): a node derives a per-run Ed25519 signing
key from its node secret (`signing_key`), binds it to its registered node key in the hello
(`certs.bind`), and signs its round keys there under its client id (`sign_round_keys`). Each
client checks every cohort member's binding against its own peers file (`plan_signing_keys`),
never trusting the server for keys."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dpfl.errors import ProtocolError
from dpfl.flower import certs
from dpfl.rng import CryptoRNG, derive_key
from dpfl.secagg import keys as kx
from dpfl.secagg.protocol import (
    Client,
    MaskedInput,
    RoundConfig,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskShares,
    keys_statement,
)


def round_key(secret: bytes, round_id: int) -> bytes:
    """The key of one round's `Party`: independent per round, so revealing a dropped client's
    mask key in one round reveals nothing about another."""
    return derive_key(secret, "flower-secagg-round", round_id)


_KEYGEN = RoundConfig(0, 3, 1, 8, {0: (1, 2), 1: (0, 2), 2: (0, 1)}, 2, 2)  # any config: keys depend only on the key


def round_public_keys(secret: bytes, rounds: int) -> list[tuple[bytes, bytes]]:
    """(encryption, masking) public keys of rounds 1..`rounds`, advertised ahead of time."""
    out = []
    for r in range(1, rounds + 1):
        adv = Client(0, _KEYGEN, CryptoRNG(key=round_key(secret, r))).advertise()
        out.append((adv.enc_pk, adv.mask_pk))
    return out


# ---------------------------------------------------------------- signed rounds


def signing_key(secret: bytes) -> Ed25519PrivateKey:
    """This run's Ed25519 signing key, derived from the node secret (never stored or sent)."""
    return Ed25519PrivateKey.from_private_bytes(derive_key(secret, "flower-secagg-signing"))


def sign_round_keys(signer: Ed25519PrivateKey, cid: int, keys: list[tuple[bytes, bytes]]) -> list[bytes]:
    """Signatures of the round keys advertised in the hello, round r = 1.. naming client `cid`
    (the statement `RoundConfig.keys_statement` checks with identities)."""
    return [kx.sign(signer, keys_statement(r, cid, enc, mask)) for r, (enc, mask) in enumerate(keys, start=1)]


def plan_signing_keys(plan: Any, peers: Mapping[int, Any], config_text: str) -> dict[int, bytes]:
    """Position → Ed25519 key of a signed round plan, each checked against the cohort member's
    registered key in this node's peers file; ProtocolError naming the first client that fails."""
    sa = plan.secagg
    out = {}
    for i, (cid, vk, binding) in enumerate(zip(plan.cohort, sa["signing_keys"], sa["bindings"])):
        if cid not in peers:
            raise ProtocolError(f"round {plan.round}: client {cid} is not in this node's peers file")
        if not certs.check_binding(peers[cid], binding, config_text, cid, vk):
            raise ProtocolError(f"round {plan.round}: client {cid}'s signing key is not bound to its registered key "
                                "(peers file) for this run config: refused")
        out[i] = vk
    return out


# ---------------------------------------------------------------- one round


class Party:
    """A client's side of one secure-sum round, rebuilt in every phase from the round's key
    (`round_key`) and the messages of earlier phases: `Client` draws its key pairs, self-mask
    seed, shares and nonces from `CryptoRNG(key)` in a fixed order, so a replayed phase gives
    the same messages, and no private key is stored. Its public keys are those
    `round_public_keys` advertised. `signer`: its Ed25519 key in a signed round."""

    def __init__(self, cfg: RoundConfig, index: int, key: bytes, signer: Ed25519PrivateKey | None = None):
        self.client = Client(index, cfg, CryptoRNG(key=key), signer=signer)

    def share(self, keys: Mapping[int, tuple[bytes, ...]]) -> ShareKeys:
        return self.client.share_keys(keys)

    def masked(self, keys: Mapping[int, tuple[bytes, ...]], inbox: Mapping[int, bytes],
               words: np.ndarray) -> MaskedInput:
        self.client.share_keys(keys)
        return self.client.masked_input(words, inbox)

    def sign(self, keys: Mapping[int, tuple[bytes, ...]], inbox: Mapping[int, bytes],
             request: UnmaskRequest) -> SurvivorSignature:
        """The consistency check: its signature of the survivor list (remember the list: `unmask`)."""
        self.client.share_keys(keys)
        self.client.mask_seeds(inbox)
        return self.client.sign_survivors(request)

    def unmask(self, keys: Mapping[int, tuple[bytes, ...]], inbox: Mapping[int, bytes],
               request: UnmaskRequest, signed: frozenset[int] | None = None) -> UnmaskShares:
        """Its unmasking shares; in a signed round only for `signed`, the list it signed."""
        self.client.share_keys(keys)
        self.client.mask_seeds(inbox)
        if signed is not None:
            self.client.sign_survivors(UnmaskRequest(self.client.cfg.round_id, signed))
        return self.client.unmask(request)


def plan_digest(plan: Any) -> bytes:
    """Hash of what must not change between the phases of a round (cohort, position, secure-sum
    config, signing keys and their bindings)."""
    sa = plan.secagg
    items = (plan.round, tuple(plan.cohort), plan.index, plan.answering, sa.get("threshold"), sa.get("min_survivors"),
             tuple(sorted((u, tuple(v)) for u, v in sa.get("graph", {}).items())),
             tuple(sa.get("signing_keys", ())), tuple(sa.get("bindings", ())))
    return hashlib.sha256(repr(items).encode()).digest()
