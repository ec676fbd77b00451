"""The server's side of one secure-sum round, phase by phase: the one driver of
`protocol.Server` that the in-process simulation (`simulate.secure_sum`) and a deployment
(`dpfl.flower.coordinator`) both use. Only how the messages reach the clients differs; a
deployment may carry two phases of different rounds in one exchange.

Each phase takes the messages that arrived, keyed by the sender's position, and closes the
phase. A message the protocol rejects drops its sender (`on_reject` is told why); without
`on_reject` a rejection raises (simulation: every client is honest). `RoundAborted` from a
phase means the round releases nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from dpfl.errors import ProtocolError
from dpfl.secagg.protocol import RoundConfig, Server, UnmaskRequest


class ServerRound:
    """`keys` → `shares` → [`shape`] → `masked` → [`signatures`] → `unmask` (the sum)."""

    def __init__(self, cfg: RoundConfig, workers: int = 1, server: Server | None = None,
                 on_reject: Callable[[int, str], None] | None = None):
        self.server = server if server is not None else Server(cfg, workers=workers)
        self.on_reject = on_reject
        k = cfg.n_clients
        self.protocol_bytes = np.zeros(k, dtype=np.int64)  # keys, shares, signatures, unmask shares
        self.masked_bytes = np.zeros(k, dtype=np.int64)  # the masked input (0 when none was taken)
        self.request: UnmaskRequest | None = None

    @property
    def cfg(self) -> RoundConfig:
        return self.server.cfg

    def _take(self, msgs: Mapping[int, object], sizes: np.ndarray) -> set[int]:
        took = set()
        for i in sorted(msgs):
            m = msgs[i]
            try:
                if getattr(m, "sender", None) != i:
                    raise ProtocolError(f"the client at position {i} sent a message as client {getattr(m, 'sender', None)!r}")
                self.server.receive(m)
            except ProtocolError as e:
                if self.on_reject is None:
                    raise
                self.on_reject(i, str(e))
                continue
            sizes[i] += m.wire_nbytes
            took.add(i)
        return took

    def keys(self, adverts: Mapping[int, object]) -> dict[int, dict[int, tuple[bytes, ...]]]:
        """AdvertiseKeys → for each client in U1, its neighbours' public keys."""
        self._take(adverts, self.protocol_bytes)
        return self.server.close_advertise()

    def shares(self, msgs: Mapping[int, object]) -> dict[int, dict[int, bytes]]:
        """ShareKeys → each client's inbox: the ciphertexts its neighbours in U2 addressed to it."""
        self._take(msgs, self.protocol_bytes)
        return self.server.close_shares()

    def shape(self, d: int, bits: int) -> None:
        """Fix d and b when the round learns them with the masked inputs (`Server.set_shape`)."""
        self.server.set_shape(d, bits)

    def masked(self, msgs: Mapping[int, object]) -> UnmaskRequest:
        """MaskedInput → the survivor list: the unmask request, or in a signed round the list
        each survivor signs (`signatures` next)."""
        self._take(msgs, self.masked_bytes)
        self.request = self.server.close_masked()
        return self.request

    def signatures(self, msgs: Mapping[int, object]) -> UnmaskRequest:
        """SurvivorSignature → the unmask request carrying the signatures."""
        self._take(msgs, self.protocol_bytes)
        self.request = self.server.close_consistency()
        return self.request

    def unmask(self, msgs: Mapping[int, object]) -> np.ndarray:
        """UnmaskShares → Σ of the survivors' inputs mod 2^b."""
        self._take(msgs, self.protocol_bytes)
        return self.server.finish()
