"""A client's side of the secure sum across processes, and its round keys. Light on purpose:
the ClientApp processes of the masking and unmasking phases import only this, `wire` and
`dpfl.secagg.protocol` (no training code)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from dpfl.rng import CryptoRNG, derive_key
from dpfl.secagg.protocol import Client, MaskedInput, RoundConfig, ShareKeys, UnmaskRequest, UnmaskShares


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


class Party:
    """A client's side of one secure-sum round, rebuilt in every phase from the round's key
    (`round_key`) and the messages of earlier phases: `Client` draws its key pairs, self-mask
    seed, shares and nonces from `CryptoRNG(key)` in a fixed order, so a replayed phase gives
    the same messages, and no private key is stored. Its public keys are those
    `round_public_keys` advertised."""

    def __init__(self, cfg: RoundConfig, index: int, key: bytes):
        self.client = Client(index, cfg, CryptoRNG(key=key))

    def share(self, keys: Mapping[int, tuple[bytes, bytes]]) -> ShareKeys:
        return self.client.share_keys(keys)

    def masked(self, keys: Mapping[int, tuple[bytes, bytes]], inbox: Mapping[int, bytes],
               words: np.ndarray) -> MaskedInput:
        self.client.share_keys(keys)
        return self.client.masked_input(words, inbox)

    def unmask(self, keys: Mapping[int, tuple[bytes, bytes]], inbox: Mapping[int, bytes],
               request: UnmaskRequest) -> UnmaskShares:
        self.client.share_keys(keys)
        self.client.mask_seeds(inbox)
        return self.client.unmask(request)


def plan_digest(plan: Any) -> bytes:
    """Hash of what must not change between the phases of a round (cohort, position, secure-sum config)."""
    sa = plan.secagg
    items = (plan.round, tuple(plan.cohort), plan.index, plan.answering, sa.get("threshold"), sa.get("min_survivors"),
             tuple(sorted((u, tuple(v)) for u, v in sa.get("graph", {}).items())))
    return hashlib.sha256(repr(items).encode()).digest()
