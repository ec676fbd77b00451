"""Record-level privacy of every client: DP-SGD steps counted per client, ε computed on demand.

Client k's local DP-SGD step is a Poisson-subsampled Gaussian on its own records (rate
q_k = expected batch / n_k, noise multiplier σ). Its record-level RDP curve is
Σ_q steps_k(q) · RDP_SG(q, σ) over the rates it trained at; ε(δ) uses the improved RDP
conversion on the `rdp` backend's order grid. Clients that took no step have spent nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpfl.errors import PrivacyError
from dpfl.privacy import rdp as R
from dpfl.privacy.events import check_delta, check_q


class RecordAccountant:
    """Per-client counts of DP-SGD steps at each sampling rate, for `n_clients` clients."""

    def __init__(self, n_clients: int, noise_multiplier: float, orders=R.DEFAULT_ORDERS):
        if not (isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier)
                and noise_multiplier > 0):
            raise PrivacyError(f"record-level noise multiplier must be a finite number > 0, got {noise_multiplier!r}")
        if n_clients < 1:
            raise PrivacyError(f"n_clients must be >= 1, got {n_clients}")
        self.n_clients, self.sigma = int(n_clients), float(noise_multiplier)
        self.orders = R.check_orders(orders)
        self.counts: dict[float, np.ndarray] = {}  # q -> steps per client [n_clients]
        self._curves: dict[float, np.ndarray] = {}

    def _curve(self, q: float) -> np.ndarray:
        c = self._curves.get(q)
        if c is None:
            c = self._curves[q] = R.sampled_gaussian_rdp(check_q(q), self.sigma, self.orders)
        return c

    def _ids(self, clients) -> np.ndarray:
        ids = np.asarray(clients, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_clients):
            raise PrivacyError(f"client ids must be in [0, {self.n_clients})")
        return ids

    def add(self, clients, rates, steps: int) -> None:
        """Each client `clients[i]` took `steps` DP-SGD steps at rate `rates[i]`."""
        ids, qs = self._ids(clients), np.asarray(rates, dtype=np.float64).reshape(-1)
        if qs.shape != ids.shape:
            raise PrivacyError(f"{ids.size} clients but {qs.size} sampling rates")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise PrivacyError(f"steps must be an integer >= 0, got {steps!r}")
        for q in np.unique(qs):
            self._curve(float(q))  # validates q
            c = self.counts.setdefault(float(q), np.zeros(self.n_clients, dtype=np.int64))
            np.add.at(c, ids[qs == q], int(steps))

    def rdp(self, clients) -> np.ndarray:
        """RDP curves [len(clients), orders] of the given clients."""
        ids = self._ids(clients)
        out = np.zeros((ids.size, self.orders.size))
        for q, c in self.counts.items():
            n = c[ids, None]
            out += np.where(n > 0, n * self._curve(q)[None, :], 0.0)
        return out

    def epsilon(self, clients, delta: float) -> np.ndarray:
        """Record-level ε(δ) of each client in `clients` (0 for clients that took no step)."""
        check_delta(delta)
        ids = self._ids(clients)
        steps = np.stack([c[ids] for c in self.counts.values()], 1) if self.counts else np.zeros((ids.size, 0))
        out = np.zeros(ids.size)
        uniq, inv = np.unique(steps, axis=0, return_inverse=True)  # clients with equal counts share ε
        inv = inv.reshape(-1)
        curves = np.stack([self._curve(q) for q in self.counts]) if self.counts else None
        for j, row in enumerate(uniq):
            if row.any():
                used = row > 0  # 0 × inf (an order where a curve diverges) must not turn into NaN
                out[inv == j] = R.epsilon_from_rdp(self.orders, row[used] @ curves[used], delta)[0]
        return out

    def epsilon_after(self, clients, rates, steps: int, delta: float) -> np.ndarray:
        """ε(δ) each of `clients` would have after `steps` more steps at `rates` (nothing is recorded)."""
        saved = {q: c.copy() for q, c in self.counts.items()}
        try:
            self.add(clients, rates, steps)
            return self.epsilon(clients, delta)
        finally:
            self.counts = saved

    def spent(self) -> np.ndarray:
        """Ids of the clients that have taken at least one step."""
        tot = sum(self.counts.values()) if self.counts else np.zeros(self.n_clients, dtype=np.int64)
        return np.flatnonzero(tot)

    def state_dict(self) -> dict[str, Any]:
        return {"sigma": self.sigma, "counts": {repr(q): c.copy() for q, c in self.counts.items()}}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        if float(st["sigma"]) != self.sigma:
            raise PrivacyError(f"record-level σ in the state is {st['sigma']}, this run's is {self.sigma}")
        counts = {}
        for q, c in st["counts"].items():
            arr = np.asarray(c, dtype=np.int64)
            if arr.shape != (self.n_clients,) or (arr < 0).any():
                raise PrivacyError(f"record-level step counts must be {self.n_clients} integers >= 0")
            counts[float(q)] = arr
            self._curve(float(q))
        self.counts = counts
