"""The secure-aggregation protocol of Bonawitz et al. (CCS 2017), semi-honest variant, with
the sparse neighbour graph of SecAgg+ (Bell et al., CCS 2020) as an option.

One round, over Z_(2^b), for clients 0..n−1 with neighbour sets N(u) (all others, or a
k-regular graph, see `graph.py`) and Shamir threshold t:

0. AdvertiseKeys: u sends two X25519 public keys (share encryption, masking). Server: U1.
1. ShareKeys: u draws a self-mask seed b_u and Shamir-shares b_u and its masking private key
   s_u among N(u) ∩ U1 (t-of-|N(u) ∩ U1|), each share encrypted to its holder with AES-GCM
   under the HKDF'd X25519 key of the pair. Server: U2, forwards ciphertexts.
2. MaskedInput: u sends y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) ∩ U2} ±PRG(s_uv) mod 2^b
   (+ if u < v, − otherwise; s_uv = HKDF(X25519(s_u, S_v))). The server adds y_u to its
   accumulator as it arrives. Server: U3 (the survivors).
3. Unmasking: the server announces U3; each survivor reveals, for each neighbour v, its share
   of b_v if v ∈ U3 or of s_v if v ∈ U2 \\ U3 — never both for one v. The server reconstructs
   the survivors' self-mask seeds and the dropped clients' mask keys, removes those masks, and
   obtains Σ_{u ∈ U3} x_u mod 2^b.

Every message is validated on arrival; a malformed one raises `ProtocolError` with the reason
and is recorded in `Server.rejected`; its sender is then treated as dropped. The round aborts
(`RoundAborted`, no sum released, the accumulator discarded) when fewer than `min_survivors`
clients remain at any step or some secret cannot be reconstructed. Clients check the same
minimum before revealing shares, so a sum with fewer noise shares than configured is never
unmasked. The server object holds only public keys, ciphertexts it cannot read, masked vectors
and the shares it is entitled to.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dpfl.compression.bits import pack_uint, packed_nbytes
from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import CryptoRNG
from dpfl.secagg import keys as kx
from dpfl.secagg import shamir
from dpfl.secagg.prg import apply_masks
from dpfl.secagg.ring import check_bits, reduce, word_dtype

NONCE_BYTES = 12
ID_BYTES = 4  # client ids on the wire
HEADER_BYTES = ID_BYTES + 8  # sender id + round id, in front of every message


class RoundAborted(ProtocolError):
    """The round stopped without releasing a sum (too few survivors or shares)."""


@dataclass(frozen=True)
class RoundConfig:
    """What every party knows before the round starts."""

    round_id: int
    n_clients: int
    d: int  # vector length
    bits: int  # modulus 2^bits
    neighbours: Mapping[int, tuple[int, ...]]
    threshold: int  # Shamir t: shares needed per secret
    min_survivors: int  # fewer inputs than this → abort

    def __post_init__(self) -> None:
        check_bits(self.bits)
        n = self.n_clients
        if n < 2 or self.d < 1:
            raise ConfigError(f"need n_clients ≥ 2 and d ≥ 1, got {n} and {self.d}")
        if set(self.neighbours) != set(range(n)):
            raise ConfigError(f"neighbours must list clients 0..{n - 1}")
        for u, nb in self.neighbours.items():
            if u in nb or any(not 0 <= v < n or u not in self.neighbours[v] for v in nb):
                raise ConfigError(f"neighbour graph must be symmetric without self-loops (client {u})")
        degree = min(len(nb) for nb in self.neighbours.values())
        if not 1 <= self.threshold <= degree:
            raise ConfigError(
                f"threshold t must be in [1, {degree}] (smallest neighbour count), got {self.threshold}"
            )
        if not 1 <= self.min_survivors <= n:
            raise ConfigError(f"min_survivors must be in [1, {n}], got {self.min_survivors}")

    @property
    def dtype(self) -> np.dtype:
        return word_dtype(self.bits)


# ---------------------------------------------------------------- messages


@dataclass(frozen=True)
class AdvertiseKeys:
    sender: int
    round_id: int
    enc_pk: bytes  # X25519 public key for share encryption
    mask_pk: bytes  # X25519 public key for pairwise masks

    @property
    def wire_nbytes(self) -> int:
        return HEADER_BYTES + len(self.enc_pk) + len(self.mask_pk)


@dataclass(frozen=True)
class ShareKeys:
    sender: int
    round_id: int
    ciphertexts: Mapping[int, bytes]  # recipient → nonce ‖ AES-GCM(share of s_u ‖ share of b_u)

    @property
    def wire_nbytes(self) -> int:
        return HEADER_BYTES + sum(ID_BYTES + len(c) for c in self.ciphertexts.values())


@dataclass(frozen=True)
class MaskedInput:
    sender: int
    round_id: int
    bits: int
    values: np.ndarray  # [d] words in Z_(2^bits)

    @property
    def wire_nbytes(self) -> int:
        """Header, modulus byte, and the values packed at `bits` bits each (`to_bytes`)."""
        return HEADER_BYTES + 1 + packed_nbytes(int(self.values.size), self.bits)

    def to_bytes(self) -> bytes:
        head = struct.pack("<IqB", self.sender, self.round_id, self.bits)
        return head + pack_uint(self.values[None, :], self.bits).tobytes()


@dataclass(frozen=True)
class UnmaskRequest:
    round_id: int
    survivors: frozenset[int]  # U3


@dataclass(frozen=True)
class UnmaskShares:
    sender: int
    round_id: int
    self_mask_shares: Mapping[int, bytes]  # survivor v → share of b_v
    key_shares: Mapping[int, bytes]  # dropped v → share of s_v

    @property
    def wire_nbytes(self) -> int:
        n = len(self.self_mask_shares) + len(self.key_shares)
        return HEADER_BYTES + n * (ID_BYTES + shamir.SHARE_BYTES)


def _aad(round_id: int, sender: int, recipient: int) -> bytes:
    return struct.pack("<qII", round_id, sender, recipient)


def _sign(u: int, v: int) -> int:
    return 1 if u < v else -1


# ---------------------------------------------------------------- client


class Client:
    """One honest client. `rng=None` draws keys and seeds from the OS (deployment)."""

    def __init__(self, cid: int, config: RoundConfig, rng: CryptoRNG | None = None):
        if not 0 <= cid < config.n_clients:
            raise ConfigError(f"client id must be in [0, {config.n_clients}), got {cid}")
        self.id, self.cfg = cid, config
        self._rng = rng if rng is not None else CryptoRNG()
        self._enc_sk = kx.new_private_key(rng)
        self._mask_sk = kx.new_private_key(rng)
        self._self_seed: bytes | None = None
        self._keys: dict[int, tuple[bytes, bytes]] = {}  # neighbour → (enc_pk, mask_pk), in U1
        self._enc_keys: dict[int, bytes] = {}  # neighbour → AES-GCM key of the pair
        self._inbox: dict[int, bytes] = {}  # neighbour in U2 → ciphertext addressed to me
        self._unmasked = False

    def advertise(self) -> AdvertiseKeys:
        return AdvertiseKeys(
            self.id, self.cfg.round_id, kx.public_bytes(self._enc_sk), kx.public_bytes(self._mask_sk)
        )

    def share_keys(self, keys: Mapping[int, tuple[bytes, bytes]]) -> ShareKeys:
        mine = set(self.cfg.neighbours[self.id])
        if not set(keys) <= mine:
            raise ProtocolError(
                f"client {self.id}: server sent keys of non-neighbours {sorted(set(keys) - mine)}"
            )
        if len(keys) < self.cfg.threshold:
            raise RoundAborted(
                f"client {self.id}: {len(keys)} neighbours left, threshold is {self.cfg.threshold}"
            )
        self._keys = dict(keys)
        self._self_seed = self._rng.bytes(32)
        holders = [v + 1 for v in sorted(keys)]  # Shamir x-coordinate of client v is v + 1
        s_sh = shamir.split(kx.private_bytes(self._mask_sk), self.cfg.threshold, holders, self._rng)
        b_sh = shamir.split(self._self_seed, self.cfg.threshold, holders, self._rng)
        out = {}
        for v in sorted(keys):
            key = self._enc_keys[v] = kx.agree(
                self._enc_sk, keys[v][0], "share-encryption", self.cfg.round_id
            )
            nonce = self._rng.bytes(NONCE_BYTES)
            ct = AESGCM(key).encrypt(nonce, s_sh[v + 1] + b_sh[v + 1], _aad(self.cfg.round_id, self.id, v))
            out[v] = nonce + ct
        return ShareKeys(self.id, self.cfg.round_id, out)

    def mask_seeds(
        self, inbox: Mapping[int, bytes], agreed: dict[tuple[int, int], bytes] | None = None
    ) -> list[tuple[bytes, int]]:
        """Take the ciphertexts of neighbours in U2; return this client's masks as (seed, sign):
        the self mask (+) and one pairwise mask per neighbour in U2 (+ if id < neighbour, else −).
        `agreed` (simulation, both ends in one process): pair seeds the other end already derived,
        keyed by (smaller id, larger id); the agreement is symmetric, so they are the same bytes."""
        if self._self_seed is None:
            raise ProtocolError(f"client {self.id}: masked input before sharing keys")
        if not set(inbox) <= set(self._keys):
            raise ProtocolError(f"client {self.id}: ciphertexts from clients whose keys it never got")
        self._inbox = dict(inbox)
        masks = [(self._self_seed, 1)]
        for v in sorted(inbox):
            pair = (min(self.id, v), max(self.id, v))
            seed = agreed.get(pair) if agreed is not None else None
            if seed is None:
                seed = kx.agree(self._mask_sk, self._keys[v][1], "mask", self.cfg.round_id)
                if agreed is not None:
                    agreed[pair] = seed
            masks.append((seed, _sign(self.id, v)))
        return masks

    def masked_input(self, x: np.ndarray, inbox: Mapping[int, bytes]) -> MaskedInput:
        """y = x + Σ masks mod 2^b for `x` (words in Z_(2^b), length d)."""
        x = np.asarray(x)
        if x.shape != (self.cfg.d,):
            raise ConfigError(f"client {self.id}: input must have length {self.cfg.d}, got shape {x.shape}")
        y = np.array(x, dtype=self.cfg.dtype, copy=True, order="C")
        reduce(apply_masks(y, self.mask_seeds(inbox)), self.cfg.bits)
        return MaskedInput(self.id, self.cfg.round_id, self.cfg.bits, y)

    def unmask(self, request: UnmaskRequest) -> UnmaskShares:
        """Reveal b_v shares for surviving neighbours and s_v shares for dropped ones (once per round)."""
        if request.round_id != self.cfg.round_id:
            raise ProtocolError(
                f"client {self.id}: unmask request for round {request.round_id}, not {self.cfg.round_id}"
            )
        if self._unmasked:
            raise ProtocolError(f"client {self.id}: already answered an unmask request this round")
        if self.id not in request.survivors:
            raise ProtocolError(f"client {self.id}: not listed as a survivor, refusing to reveal shares")
        if len(request.survivors) < self.cfg.min_survivors:
            raise RoundAborted(
                f"client {self.id}: only {len(request.survivors)} survivors, "
                f"at least {self.cfg.min_survivors} required"
            )
        self._unmasked = True
        selfs, keys_ = {}, {}
        for v, blob in self._inbox.items():
            key = self._enc_keys[v]
            try:
                pt = AESGCM(key).decrypt(
                    blob[:NONCE_BYTES], blob[NONCE_BYTES:], _aad(self.cfg.round_id, v, self.id)
                )
            except InvalidTag:
                raise ProtocolError(f"client {self.id}: shares from client {v} fail authentication") from None
            s_share, b_share = pt[: shamir.SHARE_BYTES], pt[shamir.SHARE_BYTES :]
            if v in request.survivors:
                selfs[v] = b_share
            else:
                keys_[v] = s_share
        return UnmaskShares(self.id, self.cfg.round_id, selfs, keys_)


# ---------------------------------------------------------------- server


_PHASES = ("advertise", "share", "masked", "unmask", "done")
_MESSAGE_PHASE = {
    AdvertiseKeys: "advertise",
    ShareKeys: "share",
    MaskedInput: "masked",
    UnmaskShares: "unmask",
}


@dataclass
class Server:
    """The aggregator: validates messages, sums masked inputs, unmasks the sum."""

    cfg: RoundConfig
    keep_view: bool = False  # keep every message received (for tests of what the server sees)
    workers: int = 1  # threads for removing masks
    rejected: list[tuple[int, str]] = field(default_factory=list)
    view: list[object] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.phase = "advertise"
        self._keys: dict[int, AdvertiseKeys] = {}
        self._cts: dict[int, ShareKeys] = {}
        self._masked: set[int] = set()
        self._acc: np.ndarray | None = np.zeros(self.cfg.d, dtype=self.cfg.dtype)
        self._answers: dict[int, UnmaskShares] = {}
        self.survivors: frozenset[int] = frozenset()

    # -- receiving

    def receive(self, msg: object) -> None:
        """Validate and take in one message; raises ProtocolError (recorded) if it is rejected."""
        try:
            self._check(msg)
        except ProtocolError as e:
            self.rejected.append((getattr(msg, "sender", -1), str(e)))
            raise
        if self.keep_view:
            self.view.append(msg)
        if isinstance(msg, AdvertiseKeys):
            self._keys[msg.sender] = msg
        elif isinstance(msg, ShareKeys):
            self._cts[msg.sender] = msg
        elif isinstance(msg, MaskedInput):
            np.add(self._acc, msg.values, out=self._acc)
            self._masked.add(msg.sender)
        else:
            self._answers[msg.sender] = msg

    def _check(self, msg: object) -> None:
        want = _MESSAGE_PHASE.get(type(msg))
        if want is None:
            raise ProtocolError(f"unknown message type {type(msg).__name__}")
        u = msg.sender
        if not isinstance(u, (int, np.integer)) or not 0 <= u < self.cfg.n_clients:
            raise ProtocolError(f"unknown sender {u!r}: clients are 0..{self.cfg.n_clients - 1}")
        if msg.round_id != self.cfg.round_id:
            raise ProtocolError(
                f"message from client {u} is for round {msg.round_id}, this is round {self.cfg.round_id}"
            )
        if self.phase in ("aborted", "done") or _PHASES.index(want) < _PHASES.index(self.phase):
            raise ProtocolError(
                f"late {type(msg).__name__} from client {u}: that phase is closed ({self.phase})"
            )
        if _PHASES.index(want) > _PHASES.index(self.phase):
            raise ProtocolError(
                f"early {type(msg).__name__} from client {u}: the server is in phase {self.phase}"
            )
        seen = {"advertise": self._keys, "share": self._cts, "masked": self._masked, "unmask": self._answers}[
            want
        ]
        if u in seen:
            raise ProtocolError(f"duplicate {type(msg).__name__} from client {u}")
        getattr(self, f"_check_{want}")(msg)

    def _check_advertise(self, m: AdvertiseKeys) -> None:
        for key in (m.enc_pk, m.mask_pk):
            if not isinstance(key, bytes) or len(key) != kx.KEY_BYTES:
                raise ProtocolError(f"client {m.sender}: public keys must be {kx.KEY_BYTES} bytes")

    def _check_share(self, m: ShareKeys) -> None:
        if m.sender not in self._keys:
            raise ProtocolError(f"client {m.sender} shares keys but did not advertise any")
        allowed = set(self.cfg.neighbours[m.sender]) & set(self._keys)
        if set(m.ciphertexts) != allowed:
            raise ProtocolError(
                f"client {m.sender}: shares must go to exactly its advertised neighbours {sorted(allowed)}"
            )
        size = NONCE_BYTES + 2 * shamir.SHARE_BYTES + 16
        if any(not isinstance(c, bytes) or len(c) != size for c in m.ciphertexts.values()):
            raise ProtocolError(f"client {m.sender}: each encrypted share must be {size} bytes")

    def _check_masked(self, m: MaskedInput) -> None:
        u, cfg = m.sender, self.cfg
        if u not in self._cts:
            raise ProtocolError(f"client {u} sent a masked input but did not share keys")
        if m.bits != cfg.bits:
            raise ProtocolError(f"client {u}: wrong modulus 2^{m.bits}, the round uses 2^{cfg.bits}")
        v = m.values
        if not isinstance(v, np.ndarray) or v.ndim != 1 or v.size != cfg.d:
            raise ProtocolError(f"client {u}: wrong length {getattr(v, 'shape', None)}, expected ({cfg.d},)")
        if v.dtype != cfg.dtype:
            raise ProtocolError(f"client {u}: values must be {cfg.dtype} words, got {v.dtype}")
        if cfg.bits < 8 * v.dtype.itemsize and v.size and int(v.max()) >> cfg.bits:
            raise ProtocolError(f"client {u}: value {int(v.max())} out of range [0, 2^{cfg.bits})")

    def _check_unmask(self, m: UnmaskShares) -> None:
        u = m.sender
        if u not in self.survivors:
            raise ProtocolError(f"client {u} sent shares but is not a survivor")
        nb = set(self.cfg.neighbours[u]) & set(self._cts)
        bad_self = set(m.self_mask_shares) - (nb & self.survivors)
        bad_key = set(m.key_shares) - (nb - self.survivors)
        if bad_self:
            raise ProtocolError(
                f"client {u}: self-mask shares for non-surviving or non-neighbour clients {sorted(bad_self)}"
            )
        if bad_key:
            raise ProtocolError(
                f"client {u}: key shares for surviving or non-neighbour clients {sorted(bad_key)}"
            )
        for share in (*m.self_mask_shares.values(), *m.key_shares.values()):
            shamir.share_values(share)

    # -- closing phases

    def _abort(self, reason: str) -> RoundAborted:
        self.phase, self._acc = "aborted", None
        return RoundAborted(f"round {self.cfg.round_id} aborted: {reason}")

    def _need(self, have: set[int] | frozenset[int], what: str) -> None:
        if len(have) < self.cfg.min_survivors:
            raise self._abort(f"{len(have)} clients {what}, at least {self.cfg.min_survivors} required")

    def _advance(self, phase: str) -> None:
        if self.phase != phase:
            raise ProtocolError(f"cannot close phase {phase}: the server is in phase {self.phase}")
        self.phase = _PHASES[_PHASES.index(phase) + 1]

    def close_advertise(self) -> dict[int, dict[int, tuple[bytes, bytes]]]:
        """U1; for each u ∈ U1 the public keys of its neighbours in U1."""
        self._advance("advertise")
        self._need(set(self._keys), "advertised keys")
        return {
            u: {
                v: (self._keys[v].enc_pk, self._keys[v].mask_pk)
                for v in self.cfg.neighbours[u]
                if v in self._keys
            }
            for u in self._keys
        }

    def close_shares(self) -> dict[int, dict[int, bytes]]:
        """U2; for each v ∈ U2 the ciphertexts addressed to it by its neighbours in U2."""
        self._advance("share")
        self._need(set(self._cts), "shared keys")
        inbox: dict[int, dict[int, bytes]] = {v: {} for v in self._cts}
        for u, m in self._cts.items():
            for v, c in m.ciphertexts.items():
                if v in inbox:
                    inbox[v][u] = c
        return inbox

    def close_masked(self) -> UnmaskRequest:
        """U3 (the survivors); aborts if there are too few."""
        self._advance("masked")
        self._need(self._masked, "sent masked inputs")
        self.survivors = frozenset(self._masked)
        return UnmaskRequest(self.cfg.round_id, self.survivors)

    def finish(self) -> np.ndarray:
        """Reconstruct the needed secrets, remove the masks, return Σ_{u ∈ U3} x_u mod 2^b."""
        self._advance("unmask")
        cfg, t = self.cfg, self.cfg.threshold
        dropped = set(self._cts) - self.survivors
        masks = []
        for v in sorted(self.survivors):
            shares = {
                u + 1: a.self_mask_shares[v] for u, a in self._answers.items() if v in a.self_mask_shares
            }
            if len(shares) < t:
                raise self._abort(f"{len(shares)} shares of client {v}'s self-mask seed, threshold {t}")
            masks.append((shamir.combine(shares, t), -1))
        for v in sorted(dropped):
            shares = {u + 1: a.key_shares[v] for u, a in self._answers.items() if v in a.key_shares}
            if len(shares) < t:
                raise self._abort(f"{len(shares)} shares of dropped client {v}'s mask key, threshold {t}")
            sk = kx.load_private(shamir.combine(shares, t))
            if kx.public_bytes(sk) != self._keys[v].mask_pk:
                raise self._abort(f"shares of client {v}'s mask key are inconsistent with its public key")
            for u in cfg.neighbours[v]:
                if u in self.survivors:  # u added sign(u, v)·PRG(s_uv); take it out
                    masks.append((kx.agree(sk, self._keys[u].mask_pk, "mask", cfg.round_id), -_sign(u, v)))
        total = reduce(apply_masks(self._acc, masks, self.workers), cfg.bits)
        self._acc, self.phase = None, "done"
        return total
