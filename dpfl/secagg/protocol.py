"""The secure-aggregation protocol of Bonawitz et al. (CCS 2017), with the sparse neighbour graph
of SecAgg+ (Bell et al., CCS 2020) as an option, hardened against a dishonest server and hostile
clients (threat model: docs/threat-model.md).

One round, over Z_(2^b), for clients 0..n−1 with neighbour sets N(u) (all others, or a
k-regular graph, see `graph.py`) and Shamir threshold t with 2t > max degree + 1
(`graph.min_threshold`):

0. AdvertiseKeys: u sends two X25519 public keys (share encryption, masking), signed when the
   round uses signatures. Server: U1 (keys of small order are rejected).
1. ShareKeys: u draws a self-mask seed b_u and Shamir-shares b_u and its masking private key
   s_u at threshold t, at x = v + 1 for each holder v: b_u among N(u) ∩ U1 and u itself (u keeps
   its own share, never sent), s_u among N(u) ∩ U1 only (the polynomial is also evaluated at
   u's own x, and that share discarded: it could never be revealed, since u's mask key is
   needed only when u is lost). Each share is encrypted to its holder with AES-GCM under the
   HKDF'd X25519 key of the pair; u commits to b_u (SHA-256). u needs |N(u) ∩ U1| + 1 ≥ t.
   Server: U2.
2. MaskedInput: u checks that |(N(u) ∩ U2) ∪ {u}| ≥ t (Bonawitz et al.'s |U2| ≥ t: with fewer
   pairwise masks, a server that hid the other senders from u would unmask x_u with b_u alone),
   then sends y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) ∩ U2} ±PRG(s_uv) mod 2^b
   (+ if u < v, − otherwise; s_uv = HKDF(X25519(s_u, S_v))). The server adds y_u to its
   accumulator as it arrives. Server: U3 (the survivors).
   (Optional, signatures: ConsistencyCheck — each survivor signs U3; the server collects the
   signatures and forwards them with the unmask request. Signed statements name positions, or
   client ids with `RoundConfig.identities`, as the Flower deployment does.)
3. Unmasking: the server announces U3; each survivor checks the list (every listed neighbour
   exchanged keys and shares with it; it and its listed neighbours number ≥ t; valid
   signatures if used) and reveals its own share of b_u and, for each neighbour v, its share of
   b_v if v ∈ U3 or of s_v if v ∈ U2 \\ U3 — never both for one v, and once per round. A server
   can thus get at most degree + 1 shares about one client, fewer than 2t: never t of both of its
   own secrets, whatever survivor lists it shows (getting x_u through the mask keys of u's
   partners instead is what the signed consistency check stops: docs/threat-model.md). The
   server reconstructs from all the shares it got, correcting and naming wrong ones
   (`shamir.reconstruct`), checks each seed against its commitment and each key against its
   public key, removes the masks, and obtains Σ_{u ∈ U3} x_u mod 2^b.

Every message is type- and range-checked on arrival; a malformed one raises `ProtocolError`
with the reason and is recorded in `Server.rejected`; its sender is then treated as dropped.
Share senders whose shares were wrong are listed in `Server.cheaters`. The round aborts
(`RoundAborted`, no sum released, the accumulator discarded) when fewer than `min_survivors`
clients remain at any step or some secret cannot be reconstructed and verified: `RoundAborted`
is the one exception drivers treat as an aborted round (nothing released, nothing charged).
The server object holds only public keys, ciphertexts it cannot read, masked vectors and the
shares it is entitled to.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dpfl.compression.bits import pack_uint, packed_nbytes
from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import CryptoRNG
from dpfl.secagg import keys as kx
from dpfl.secagg import shamir
from dpfl.secagg.graph import min_threshold
from dpfl.secagg.prg import apply_masks
from dpfl.secagg.ring import check_bits, reduce, word_dtype

NONCE_BYTES = 12
ID_BYTES = 4  # client ids on the wire
HEADER_BYTES = ID_BYTES + 8  # sender id + round id, in front of every message
COMMIT_BYTES = 32
CIPHERTEXT_BYTES = NONCE_BYTES + 2 * shamir.SHARE_BYTES + 16  # nonce ‖ AES-GCM(two shares) ‖ tag


class RoundAborted(ProtocolError):
    """The round stopped without releasing a sum (too few survivors or shares, or shares that
    cannot be reconstructed and verified). Drivers treat it as an aborted round: no model update,
    nothing charged to the privacy ledger."""


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class RoundConfig:
    """What every party knows before the round starts. `signing_keys` (optional, the active-server
    model): each client's Ed25519 verification key, from a PKI outside the protocol; with them,
    advertised keys are signed and clients unmask only after the signed consistency check.
    `identities` (optional): each position's stable client id, which signed statements name
    instead of the position (a deployment signs its round keys before it knows its position);
    without it statements name positions, as in simulation."""

    round_id: int
    n_clients: int
    d: int  # vector length
    bits: int  # modulus 2^bits
    neighbours: Mapping[int, tuple[int, ...]]
    threshold: int  # Shamir t: shares needed per secret
    min_survivors: int  # fewer inputs than this → abort
    signing_keys: Mapping[int, bytes] | None = None
    identities: Mapping[int, int] | None = None

    def __post_init__(self) -> None:
        check_bits(self.bits)
        n = self.n_clients
        if not all(_is_int(v) for v in (self.round_id, n, self.d, self.threshold, self.min_survivors)):
            raise ConfigError("round id, n_clients, d, threshold and min_survivors must be integers")
        if n < 2 or self.d < 1:
            raise ConfigError(f"need n_clients ≥ 2 and d ≥ 1, got {n} and {self.d}")
        if set(self.neighbours) != set(range(n)):
            raise ConfigError(f"neighbours must list clients 0..{n - 1}")
        for u, nb in self.neighbours.items():
            if u in nb or any(not 0 <= v < n or u not in self.neighbours[v] for v in nb):
                raise ConfigError(f"neighbour graph must be symmetric without self-loops (client {u})")
        degrees = [len(nb) for nb in self.neighbours.values()]
        lo, hi = min(degrees), max(degrees)
        if not min_threshold(hi) <= self.threshold <= lo + 1:
            raise ConfigError(
                f"threshold t must be in [{min_threshold(hi)}, {lo + 1}] (more than half of the largest "
                f"neighbour count + 1, at most the smallest + 1), got {self.threshold}: with 2t ≤ degree + 1 "
                "a server sending different survivor lists could collect both kinds of share for one client"
            )
        if not 1 <= self.min_survivors <= n:
            raise ConfigError(f"min_survivors must be in [1, {n}], got {self.min_survivors}")
        if self.min_survivors < self.threshold:  # each survivor's seed needs t shares of survivors
            raise ConfigError(
                f"n = {n} clients with min_survivors = {self.min_survivors} tolerate l = {n - self.min_survivors} "
                f"lost clients, but at threshold t = {self.threshold} at most l = {n - self.threshold} can be "
                "survived (fewer than t survivors never unmask a sum)"
            )
        if self.signing_keys is not None and (
            set(self.signing_keys) != set(range(n))
            or any(not isinstance(k, bytes) or len(k) != kx.KEY_BYTES for k in self.signing_keys.values())
        ):
            raise ConfigError(f"signing_keys must give a 32-byte Ed25519 key for each client 0..{n - 1}")
        ids = self.identities
        if ids is not None and (
            set(ids) != set(range(n))
            or not all(_is_int(v) and 0 <= v < 2**32 for v in ids.values())
            or len(set(ids.values())) != n
        ):
            raise ConfigError(f"identities must give a distinct client id in [0, 2^32) for each position 0..{n - 1}")

    def identity(self, u: int) -> int:
        """The id signed statements name for position u: its client id, or u itself."""
        return u if self.identities is None else int(self.identities[u])

    def survivors_statement(self, survivors: frozenset[int]) -> bytes:
        """What a survivor signs in the consistency check, naming the survivors by identity."""
        return survivors_statement(self.round_id, frozenset(self.identity(v) for v in survivors))

    def keys_statement(self, sender: int, enc_pk: bytes, mask_pk: bytes) -> bytes:
        """What `sender` signs when it advertises its keys, naming itself by identity."""
        return keys_statement(self.round_id, self.identity(sender), enc_pk, mask_pk)

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
    signature: bytes = b""  # Ed25519 over (round, sender, keys), when the round uses signatures

    @property
    def wire_nbytes(self) -> int:
        return HEADER_BYTES + len(self.enc_pk) + len(self.mask_pk) + len(self.signature)


@dataclass(frozen=True)
class ShareKeys:
    sender: int
    round_id: int
    ciphertexts: Mapping[int, bytes]  # recipient → nonce ‖ AES-GCM(share of s_u ‖ share of b_u)
    commitment: bytes = b""  # SHA-256 commitment to the self-mask seed b_u (`seed_commitment`)

    @property
    def wire_nbytes(self) -> int:
        return HEADER_BYTES + len(self.commitment) + sum(ID_BYTES + len(c) for c in self.ciphertexts.values())


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
class SurvivorSignature:
    """Consistency check (signatures only): a survivor's signature of the survivor list U3."""

    sender: int
    round_id: int
    signature: bytes

    @property
    def wire_nbytes(self) -> int:
        return HEADER_BYTES + len(self.signature)


@dataclass(frozen=True)
class UnmaskRequest:
    round_id: int
    survivors: frozenset[int]  # U3
    signatures: Mapping[int, bytes] = field(default_factory=dict)  # signer → signature of U3


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


def seed_commitment(round_id: int, sender: int, seed: bytes) -> bytes:
    """SHA-256 commitment to a 32-byte uniformly random self-mask seed (hiding: the seed is random)."""
    return hashlib.sha256(b"dpfl-secagg/self-seed" + struct.pack("<qI", round_id, sender) + seed).digest()


def keys_statement(round_id: int, sender: int, enc_pk: bytes, mask_pk: bytes) -> bytes:
    """What a client signs when it advertises its keys (`sender`: its identity, `RoundConfig.identity`)."""
    return b"dpfl-secagg/keys" + struct.pack("<qI", round_id, sender) + enc_pk + mask_pk


def survivors_statement(round_id: int, survivors: frozenset[int]) -> bytes:
    """What a survivor signs in the consistency check: the round and the sorted list U3 (by identity)."""
    ids = sorted(int(v) for v in survivors)
    return b"dpfl-secagg/survivors" + struct.pack(f"<qI{len(ids)}I", round_id, len(ids), *ids)


def _check_ids(ids: object, n: int, what: str) -> frozenset[int]:
    """A set of client ids in [0, n) (ints, not bools), else ProtocolError."""
    if not isinstance(ids, (set, frozenset, Mapping)):
        raise ProtocolError(f"{what}: expected a set of client ids, got {type(ids).__name__}")
    if not all(_is_int(v) and 0 <= v < n for v in ids):
        raise ProtocolError(f"{what}: client ids must be integers in [0, {n})")
    return frozenset(int(v) for v in ids)


# ---------------------------------------------------------------- client


class Client:
    """One honest client. `rng=None` draws keys and seeds from the OS (deployment). `signer`: its
    Ed25519 signing key, required when the round config has `signing_keys`."""

    def __init__(self, cid: int, config: RoundConfig, rng: CryptoRNG | None = None, signer=None):
        if not _is_int(cid) or not 0 <= cid < config.n_clients:
            raise ConfigError(f"client id must be in [0, {config.n_clients}), got {cid}")
        if (config.signing_keys is not None) and (
            signer is None or kx.verification_bytes(signer) != config.signing_keys[cid]
        ):
            raise ConfigError(
                f"client {cid}: the round uses signatures; pass the signing key of its verification key"
            )
        self.id, self.cfg = int(cid), config
        self._signer = signer if config.signing_keys is not None else None
        self._rng = rng if rng is not None else CryptoRNG()
        self._enc_sk = kx.new_private_key(rng)
        self._mask_sk = kx.new_private_key(rng)
        self._self_seed: bytes | None = None
        self._own_share: bytes | None = None  # its own Shamir share of b_u (x = id + 1), never sent
        self._keys: dict[int, tuple[bytes, bytes]] = {}  # neighbour → (enc_pk, mask_pk), in U1
        self._enc_keys: dict[int, bytes] = {}  # neighbour → AES-GCM key of the pair
        self._shares: dict[int, tuple[bytes, bytes]] = {}  # neighbour in U2 → (share of s_v, of b_v) for me
        self.bad_senders: dict[int, str] = {}  # neighbour in U2 whose encrypted shares were unusable → why
        self._signed: frozenset[int] | None = None
        self._inbox_taken = self._unmasked = False

    def advertise(self) -> AdvertiseKeys:
        enc, mask = kx.public_bytes(self._enc_sk), kx.public_bytes(self._mask_sk)
        sig = (
            b""
            if self._signer is None
            else kx.sign(self._signer, self.cfg.keys_statement(self.id, enc, mask))
        )
        return AdvertiseKeys(self.id, self.cfg.round_id, enc, mask, sig)

    def _check_keys(self, keys: object) -> dict[int, tuple[bytes, bytes]]:
        me = f"client {self.id}"
        if not isinstance(keys, Mapping):
            raise ProtocolError(f"{me}: neighbour keys must be a mapping, got {type(keys).__name__}")
        ids = _check_ids(keys, self.cfg.n_clients, f"{me}: neighbour keys")
        mine = set(self.cfg.neighbours[self.id])
        if not ids <= mine:
            raise ProtocolError(f"{me}: server sent keys of non-neighbours {sorted(ids - mine)}")
        out = {}
        for v, entry in keys.items():
            n = 2 if self.cfg.signing_keys is None else 3
            if not isinstance(entry, tuple) or len(entry) != n:
                raise ProtocolError(f"{me}: keys of client {v} must be a tuple of {n} byte strings")
            enc = kx.check_public(entry[0], f"{me}: client {v}'s encryption key")
            mask = kx.check_public(entry[1], f"{me}: client {v}'s masking key")
            if n == 3 and not kx.verify(
                self.cfg.signing_keys[int(v)], entry[2], self.cfg.keys_statement(int(v), enc, mask)
            ):
                raise ProtocolError(f"{me}: the keys of client {v} are not signed by client {v}")
            out[int(v)] = (enc, mask)
        return out

    def share_keys(self, keys: Mapping[int, tuple[bytes, ...]]) -> ShareKeys:
        keys = self._check_keys(keys)
        if len(keys) + 1 < self.cfg.threshold:
            raise RoundAborted(
                f"client {self.id}: {len(keys)} neighbours left, with itself fewer than threshold {self.cfg.threshold}"
            )
        self._keys = dict(keys)
        self._self_seed = self._rng.bytes(32)
        holders = [v + 1 for v in sorted({*keys, self.id})]  # Shamir x-coordinate of client v is v + 1
        s_sh = shamir.split(kx.private_bytes(self._mask_sk), self.cfg.threshold, holders, self._rng)
        b_sh = shamir.split(self._self_seed, self.cfg.threshold, holders, self._rng)
        self._own_share = b_sh[self.id + 1]  # its own share of s_u (s_sh[id + 1]) is dropped here
        out = {}
        for v in sorted(keys):
            key = self._enc_keys[v] = kx.agree(
                self._enc_sk, keys[v][0], "share-encryption", self.cfg.round_id
            )
            nonce = self._rng.bytes(NONCE_BYTES)
            ct = AESGCM(key).encrypt(nonce, s_sh[v + 1] + b_sh[v + 1], _aad(self.cfg.round_id, self.id, v))
            out[v] = nonce + ct
        return ShareKeys(
            self.id, self.cfg.round_id, out, seed_commitment(self.cfg.round_id, self.id, self._self_seed)
        )

    def _open(self, v: int, blob: object) -> tuple[bytes, bytes]:
        """The two shares client v encrypted to me; ProtocolError if they are unusable."""
        if not isinstance(blob, bytes) or len(blob) != CIPHERTEXT_BYTES:
            raise ProtocolError(f"encrypted shares must be {CIPHERTEXT_BYTES} bytes")
        try:
            pt = AESGCM(self._enc_keys[v]).decrypt(
                blob[:NONCE_BYTES], blob[NONCE_BYTES:], _aad(self.cfg.round_id, v, self.id)
            )
        except InvalidTag:
            raise ProtocolError("encrypted shares fail authentication") from None
        s_share, b_share = pt[: shamir.SHARE_BYTES], pt[shamir.SHARE_BYTES :]
        shamir.share_values(s_share)
        shamir.share_values(b_share)
        return s_share, b_share

    def mask_seeds(
        self, inbox: Mapping[int, bytes], agreed: dict[tuple[int, int], bytes] | None = None
    ) -> list[tuple[bytes, int]]:
        """Take the ciphertexts of neighbours in U2; return this client's masks as (seed, sign):
        the self mask (+) and one pairwise mask per neighbour in U2 (+ if id < neighbour, else −).
        Each ciphertext is opened here; one that fails (garbage, wrong key) is noted in
        `bad_senders` and its shares are never revealed. `agreed` (simulation, both ends in one
        process): pair seeds the other end already derived, keyed by (smaller id, larger id); the
        agreement is symmetric, so they are the same bytes."""
        if self._self_seed is None:
            raise ProtocolError(f"client {self.id}: masked input before sharing keys")
        if self._inbox_taken:
            raise ProtocolError(f"client {self.id}: a second inbox in one round")
        if not isinstance(inbox, Mapping):
            raise ProtocolError(f"client {self.id}: the inbox must be a mapping, got {type(inbox).__name__}")
        ids = _check_ids(inbox, self.cfg.n_clients, f"client {self.id}: inbox")
        if not ids <= set(self._keys):
            raise ProtocolError(f"client {self.id}: ciphertexts from clients whose keys it never got")
        if len(ids) + 1 < self.cfg.threshold:  # |U2| ≥ t: else its few pairwise masks could be undone
            raise RoundAborted(
                f"client {self.id}: an inbox from {len(ids)} neighbours, with itself fewer than threshold "
                f"{self.cfg.threshold}: refusing to mask"
            )
        shares, bad = {}, {}
        for v in sorted(ids):
            try:
                shares[v] = self._open(v, inbox[v])
            except ProtocolError as e:
                bad[v] = str(e)
        self._shares, self.bad_senders, self._inbox_taken = shares, bad, True
        masks = [(self._self_seed, 1)]
        for v in sorted(ids):
            pair = (min(self.id, v), max(self.id, v))
            seed = agreed.get(pair) if agreed is not None else None
            if seed is None:
                seed = kx.agree(self._mask_sk, self._keys[v][1], "mask", self.cfg.round_id)
                if agreed is not None:
                    agreed[pair] = seed
            masks.append((seed, _sign(self.id, v)))
        return masks

    def masked_input(self, x: np.ndarray, inbox: Mapping[int, bytes]) -> MaskedInput:
        """y = x + Σ masks mod 2^b for `x`: integer words in Z_(2^b), length d (checked: nothing is cast)."""
        x = np.asarray(x)
        if x.shape != (self.cfg.d,):
            raise ConfigError(f"client {self.id}: input must have length {self.cfg.d}, got shape {x.shape}")
        if x.dtype.kind not in "ui":
            raise ConfigError(
                f"client {self.id}: input must be integer words in Z_2^{self.cfg.bits}, got dtype {x.dtype}"
            )
        if x.size and (int(x.min()) < 0 or int(x.max()) >> self.cfg.bits):
            raise ConfigError(f"client {self.id}: input words must lie in [0, 2^{self.cfg.bits})")
        y = np.array(x, dtype=self.cfg.dtype, copy=True, order="C")
        reduce(apply_masks(y, self.mask_seeds(inbox)), self.cfg.bits)
        return MaskedInput(self.id, self.cfg.round_id, self.cfg.bits, y)

    def _check_survivors(self, request: object) -> frozenset[int]:
        me = f"client {self.id}"
        if not isinstance(request, UnmaskRequest):
            raise ProtocolError(f"{me}: expected an UnmaskRequest, got {type(request).__name__}")
        if request.round_id != self.cfg.round_id or not _is_int(request.round_id):
            raise ProtocolError(f"{me}: request for round {request.round_id!r}, not {self.cfg.round_id}")
        if not self._inbox_taken:
            raise ProtocolError(f"{me}: request before this client sent its masked input")
        survivors = _check_ids(request.survivors, self.cfg.n_clients, f"{me}: survivor list")
        if self.id not in survivors:
            raise ProtocolError(f"{me}: not listed as a survivor, refusing to reveal shares")
        exchanged = set(self._shares) | set(self.bad_senders)  # neighbours in U2: keys and shares exchanged
        fake = (survivors & set(self.cfg.neighbours[self.id])) - exchanged
        if fake:
            raise ProtocolError(f"{me}: survivors {sorted(fake)} never exchanged keys and shares with it")
        return survivors

    def sign_survivors(self, request: UnmaskRequest) -> SurvivorSignature:
        """Consistency check (signatures only): sign the survivor list, once per round."""
        if self._signer is None:
            raise ProtocolError(f"client {self.id}: this round has no consistency check")
        survivors = self._check_survivors(request)
        if self._signed is not None and self._signed != survivors:
            raise ProtocolError(f"client {self.id}: already signed a different survivor list this round")
        self._signed = survivors
        return SurvivorSignature(
            self.id,
            self.cfg.round_id,
            kx.sign(self._signer, self.cfg.survivors_statement(survivors)),
        )

    def unmask(self, request: UnmaskRequest) -> UnmaskShares:
        """Reveal its own b_u share, b_v shares for surviving neighbours and s_v shares for dropped
        ones (once per round), only for a survivor list it can accept: it is listed, every listed
        neighbour exchanged keys and shares with it, it and its listed neighbours number at least t,
        the list has at least min_survivors ids (with signatures: as many valid signatures of this
        very list, one of them its own)."""
        if self._unmasked:
            raise ProtocolError(f"client {self.id}: already answered an unmask request this round")
        survivors = self._check_survivors(request)  # lists this client
        cfg, me = self.cfg, f"client {self.id}"
        genuine = survivors & (set(self._shares) | set(self.bad_senders) | {self.id})
        if len(genuine) < cfg.threshold:
            raise RoundAborted(
                f"{me}: only {len(genuine) - 1} of its neighbours survive, with itself fewer than threshold "
                f"{cfg.threshold}"
            )
        if len(survivors) < cfg.min_survivors:
            raise RoundAborted(
                f"{me}: only {len(survivors)} survivors, at least {cfg.min_survivors} required"
            )
        if cfg.signing_keys is not None:
            if self._signed != survivors:
                raise ProtocolError(f"{me}: the survivor list differs from the one it signed")
            sigs = request.signatures
            if not isinstance(sigs, Mapping):
                raise ProtocolError(f"{me}: signatures must be a mapping")
            statement = cfg.survivors_statement(survivors)
            signers = {
                int(v)
                for v, s in sigs.items()
                if _is_int(v) and v in survivors and kx.verify(cfg.signing_keys[int(v)], s, statement)
            }
            if len(signers) != len(sigs):
                raise ProtocolError(f"{me}: invalid or foreign signatures of the survivor list")
            if len(signers) < max(cfg.min_survivors, cfg.threshold):
                raise RoundAborted(
                    f"{me}: {len(signers)} survivors signed the list, at least "
                    f"{max(cfg.min_survivors, cfg.threshold)} required"
                )
        self._unmasked = True
        selfs, keys_ = {self.id: self._own_share}, {}
        for v, (s_share, b_share) in self._shares.items():
            if v in survivors:
                selfs[v] = b_share
            else:
                keys_[v] = s_share
        return UnmaskShares(self.id, cfg.round_id, selfs, keys_)


# ---------------------------------------------------------------- server


_PHASES = ("advertise", "share", "masked", "consistency", "unmask", "done")
_MESSAGE_PHASE = {
    AdvertiseKeys: "advertise",
    ShareKeys: "share",
    MaskedInput: "masked",
    SurvivorSignature: "consistency",
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
        self._sigs: dict[int, SurvivorSignature] = {}
        self._answers: dict[int, UnmaskShares] = {}
        self.survivors: frozenset[int] = frozenset()
        self.cheaters: set[int] = set()  # clients that sent wrong shares (found in `finish`)

    # -- receiving

    def receive(self, msg: object) -> None:
        """Validate and take in one message; raises ProtocolError (recorded) if it is rejected."""
        try:
            self._check(msg)
        except ProtocolError as e:
            sender = getattr(msg, "sender", -1)
            self.rejected.append((int(sender) if _is_int(sender) else -1, str(e)))
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
        elif isinstance(msg, SurvivorSignature):
            self._sigs[msg.sender] = msg
        else:
            self._answers[msg.sender] = msg

    def _check(self, msg: object) -> None:
        want = _MESSAGE_PHASE.get(type(msg))
        if want is None:
            raise ProtocolError(f"unknown message type {type(msg).__name__}")
        u = msg.sender
        if not _is_int(u) or not 0 <= u < self.cfg.n_clients:
            raise ProtocolError(f"unknown sender {u!r}: clients are 0..{self.cfg.n_clients - 1}")
        if not _is_int(msg.round_id) or msg.round_id != self.cfg.round_id:
            raise ProtocolError(
                f"message from client {u} is for round {msg.round_id!r}, this is round {self.cfg.round_id}"
            )
        if self.phase in ("aborted", "done") or _PHASES.index(want) < _PHASES.index(self.phase):
            raise ProtocolError(
                f"late {type(msg).__name__} from client {u}: that phase is closed ({self.phase})"
            )
        if _PHASES.index(want) > _PHASES.index(self.phase):
            raise ProtocolError(
                f"early {type(msg).__name__} from client {u}: the server is in phase {self.phase}"
            )
        seen = {
            "advertise": self._keys,
            "share": self._cts,
            "masked": self._masked,
            "consistency": self._sigs,
            "unmask": self._answers,
        }[want]
        if u in seen:
            raise ProtocolError(f"duplicate {type(msg).__name__} from client {u}")
        getattr(self, f"_check_{want}")(msg)

    def _check_advertise(self, m: AdvertiseKeys) -> None:
        enc = kx.check_public(m.enc_pk, f"client {m.sender}")
        mask = kx.check_public(m.mask_pk, f"client {m.sender}")
        if not isinstance(m.signature, bytes):
            raise ProtocolError(f"client {m.sender}: the signature must be bytes, got {type(m.signature).__name__}")
        if self.cfg.signing_keys is None and m.signature != b"":
            raise ProtocolError(f"client {m.sender}: a signature in a round without signatures")
        if self.cfg.signing_keys is not None and not kx.verify(
            self.cfg.signing_keys[m.sender],
            m.signature,
            self.cfg.keys_statement(m.sender, enc, mask),
        ):
            raise ProtocolError(f"client {m.sender}: advertised keys without a valid signature")

    def _check_share(self, m: ShareKeys) -> None:
        if m.sender not in self._keys:
            raise ProtocolError(f"client {m.sender} shares keys but did not advertise any")
        if not isinstance(m.ciphertexts, Mapping):
            raise ProtocolError(f"client {m.sender}: ciphertexts must be a mapping")
        to = _check_ids(m.ciphertexts, self.cfg.n_clients, f"client {m.sender}: share recipients")
        allowed = set(self.cfg.neighbours[m.sender]) & set(self._keys)
        if to != allowed:
            raise ProtocolError(
                f"client {m.sender}: shares must go to exactly its advertised neighbours {sorted(allowed)}"
            )
        if any(not isinstance(c, bytes) or len(c) != CIPHERTEXT_BYTES for c in m.ciphertexts.values()):
            raise ProtocolError(f"client {m.sender}: each encrypted share must be {CIPHERTEXT_BYTES} bytes")
        if not isinstance(m.commitment, bytes) or len(m.commitment) != COMMIT_BYTES:
            raise ProtocolError(
                f"client {m.sender}: the self-mask seed commitment must be {COMMIT_BYTES} bytes"
            )

    def _check_masked(self, m: MaskedInput) -> None:
        u, cfg = m.sender, self.cfg
        if u not in self._cts:
            raise ProtocolError(f"client {u} sent a masked input but did not share keys")
        if not _is_int(m.bits) or m.bits != cfg.bits:
            raise ProtocolError(f"client {u}: wrong modulus 2^{m.bits}, the round uses 2^{cfg.bits}")
        v = m.values
        if not isinstance(v, np.ndarray) or v.ndim != 1 or v.size != cfg.d:
            raise ProtocolError(f"client {u}: wrong length {getattr(v, 'shape', None)}, expected ({cfg.d},)")
        if v.dtype != cfg.dtype:
            raise ProtocolError(f"client {u}: values must be {cfg.dtype} words, got {v.dtype}")
        if cfg.bits < 8 * v.dtype.itemsize and v.size and int(v.max()) >> cfg.bits:
            raise ProtocolError(f"client {u}: value {int(v.max())} out of range [0, 2^{cfg.bits})")

    def _check_consistency(self, m: SurvivorSignature) -> None:
        if m.sender not in self.survivors:
            raise ProtocolError(f"client {m.sender} signed the survivor list but is not a survivor")
        if not kx.verify(
            self.cfg.signing_keys[m.sender],
            m.signature,
            self.cfg.survivors_statement(self.survivors),
        ):
            raise ProtocolError(f"client {m.sender}: invalid signature of the survivor list")

    def _check_unmask(self, m: UnmaskShares) -> None:
        u = m.sender
        if u not in self.survivors:
            raise ProtocolError(f"client {u} sent shares but is not a survivor")
        if not isinstance(m.self_mask_shares, Mapping) or not isinstance(m.key_shares, Mapping):
            raise ProtocolError(f"client {u}: shares must be mappings from client ids")
        nb = set(self.cfg.neighbours[u]) & set(self._cts)
        bad_self = set(m.self_mask_shares) - ((nb & self.survivors) | {u})  # u: its own share of b_u
        bad_key = set(m.key_shares) - (nb - self.survivors)
        if bad_self:
            raise ProtocolError(
                f"client {u}: self-mask shares for non-surviving or non-neighbour clients {sorted(bad_self, key=repr)}"
            )
        if bad_key:
            raise ProtocolError(
                f"client {u}: key shares for surviving or non-neighbour clients {sorted(bad_key, key=repr)}"
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

    def _advance(self, phase: str, to: str) -> None:
        if self.phase != phase:
            raise ProtocolError(f"cannot close phase {phase}: the server is in phase {self.phase}")
        self.phase = to

    def close_advertise(self) -> dict[int, dict[int, tuple[bytes, ...]]]:
        """U1; for each u ∈ U1 the public keys of its neighbours in U1 (and their signatures, if used)."""
        self._advance("advertise", "share")
        self._need(set(self._keys), "advertised keys")
        signed = self.cfg.signing_keys is not None

        def entry(a: AdvertiseKeys) -> tuple[bytes, ...]:
            return (a.enc_pk, a.mask_pk, a.signature) if signed else (a.enc_pk, a.mask_pk)

        return {
            u: {v: entry(self._keys[v]) for v in self.cfg.neighbours[u] if v in self._keys}
            for u in self._keys
        }

    def close_shares(self) -> dict[int, dict[int, bytes]]:
        """U2; for each v ∈ U2 the ciphertexts addressed to it by its neighbours in U2."""
        self._advance("share", "masked")
        self._need(set(self._cts), "shared keys")
        inbox: dict[int, dict[int, bytes]] = {v: {} for v in self._cts}
        for u, m in self._cts.items():
            for v, c in m.ciphertexts.items():
                if v in inbox:
                    inbox[v][int(u)] = c
        return inbox

    def set_shape(self, d: int, bits: int) -> None:
        """Fix the vector length d and modulus 2^bits after the keys were shared (a deployment
        learns them from the clients' encoding with their masked inputs); only before the first
        masked input is taken."""
        if self.phase != "masked" or self._masked:
            raise ProtocolError(f"the shape is fixed before the first masked input (server in phase {self.phase})")
        self.cfg = replace(self.cfg, d=d, bits=bits)  # validated again by RoundConfig
        self._acc = np.zeros(self.cfg.d, dtype=self.cfg.dtype)

    def close_masked(self) -> UnmaskRequest:
        """U3 (the survivors); aborts if there are too few. With signatures, the request is the
        consistency check: survivors sign it (`SurvivorSignature`), then `close_consistency`."""
        signed = self.cfg.signing_keys is not None
        self._advance("masked", "consistency" if signed else "unmask")
        self._need(self._masked, "sent masked inputs")
        self.survivors = frozenset(self._masked)
        return UnmaskRequest(self.cfg.round_id, self.survivors)

    def close_consistency(self) -> UnmaskRequest:
        """The unmask request, carrying the survivors' signatures of U3 (signatures only)."""
        self._advance("consistency", "unmask")
        need = max(self.cfg.min_survivors, self.cfg.threshold)
        if len(self._sigs) < need:
            raise self._abort(
                f"{len(self._sigs)} survivors signed the survivor list, at least {need} required"
            )
        return UnmaskRequest(
            self.cfg.round_id, self.survivors, {u: s.signature for u, s in self._sigs.items()}
        )

    def _recover(self, shares: dict[int, bytes], what: str) -> bytes:
        """A secret from every share received (x = holder id + 1); wrong shares are corrected and
        their senders added to `cheaters`; aborts if that is impossible."""
        t = self.cfg.threshold
        if len(shares) < t:
            raise self._abort(f"{len(shares)} shares of {what}, threshold {t}")
        try:
            secret, bad = shamir.reconstruct(shares, t)
        except ProtocolError as e:
            raise self._abort(f"{what}: {e}") from None
        for x in sorted(bad):
            self.cheaters.add(x - 1)
            self.rejected.append((x - 1, f"client {x - 1}: wrong share of {what}"))
        return secret

    def finish(self) -> np.ndarray:
        """Reconstruct the needed secrets, remove the masks, return Σ_{u ∈ U3} x_u mod 2^b."""
        self._advance("unmask", "done")
        cfg = self.cfg
        dropped = set(self._cts) - self.survivors
        masks = []
        for v in sorted(self.survivors):  # v's own share counts, as its neighbours' do
            shares = {
                u + 1: a.self_mask_shares[v] for u, a in self._answers.items() if v in a.self_mask_shares
            }
            seed = self._recover(shares, f"client {v}'s self-mask seed")
            if seed_commitment(cfg.round_id, v, seed) != self._cts[v].commitment:
                raise self._abort(f"client {v}'s self-mask seed does not match its commitment")
            masks.append((seed, -1))
        for v in sorted(dropped):
            shares = {u + 1: a.key_shares[v] for u, a in self._answers.items() if v in a.key_shares}
            sk = kx.load_private(self._recover(shares, f"dropped client {v}'s mask key"))
            if kx.public_bytes(sk) != self._keys[v].mask_pk:
                raise self._abort(f"shares of client {v}'s mask key are inconsistent with its public key")
            for u in cfg.neighbours[v]:
                if u in self.survivors:  # u added sign(u, v)·PRG(s_uv); take it out
                    masks.append((kx.agree(sk, self._keys[u].mask_pk, "mask", cfg.round_id), -_sign(u, v)))
        total = reduce(apply_masks(self._acc, masks, self.workers), cfg.bits)
        self._acc, self.phase = None, "done"
        return total
