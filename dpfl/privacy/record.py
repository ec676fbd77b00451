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
    """Per-client counts of DP-SGD steps at each sampling rate, for `n_clients` clients (sparse:
    only the (client, rate) pairs that occurred are stored)."""

    def __init__(self, n_clients: int, noise_multiplier: float, orders=R.DEFAULT_ORDERS):
        if not (isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier)
                and noise_multiplier > 0):
            raise PrivacyError(f"record-level noise multiplier must be a finite number > 0, got {noise_multiplier!r}")
        if n_clients < 1:
            raise PrivacyError(f"n_clients must be >= 1, got {n_clients}")
        self.n_clients, self.sigma = int(n_clients), float(noise_multiplier)
        self.orders = R.check_orders(orders)
        self.counts: dict[int, dict[float, int]] = {}  # client -> {q: steps}
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
        if not steps:
            return
        for c, q in zip(ids.tolist(), qs.tolist()):
            own = self.counts.setdefault(c, {})
            own[q] = own.get(q, 0) + int(steps)

    def _signature(self, c: int) -> tuple:
        return tuple(sorted(self.counts.get(c, {}).items()))

    def rdp(self, clients) -> np.ndarray:
        """RDP curves [len(clients), orders] of the given clients."""
        rows = [self._rdp(self._signature(c)) for c in self._ids(clients).tolist()]
        return np.stack(rows) if rows else np.zeros((0, self.orders.size))

    def _rdp(self, sig: tuple) -> np.ndarray:
        out = np.zeros(self.orders.size)
        for q, n in sig:  # only rates with steps: 0 × inf (a diverging order) never turns into NaN
            out = out + n * self._curve(q)
        return out

    def epsilon(self, clients, delta: float) -> np.ndarray:
        """Record-level ε(δ) of each client in `clients` (0 for clients that took no step)."""
        check_delta(delta)
        ids = self._ids(clients).tolist()
        seen: dict[tuple, float] = {(): 0.0}  # clients with equal counts share ε
        out = np.zeros(len(ids))
        for i, c in enumerate(ids):
            sig = self._signature(c)
            if sig not in seen:
                seen[sig] = R.epsilon_from_rdp(self.orders, self._rdp(sig), delta)[0]
            out[i] = seen[sig]
        return out

    def epsilon_after(self, clients, rates, steps: int, delta: float) -> np.ndarray:
        """ε(δ) each of `clients` would have after `steps` more steps at `rates` (nothing is recorded)."""
        ids = self._ids(clients).tolist()
        saved = {c: dict(self.counts[c]) for c in ids if c in self.counts}
        try:
            self.add(clients, rates, steps)
            return self.epsilon(clients, delta)
        finally:
            for c in ids:
                self.counts.pop(c, None)
            self.counts.update(saved)

    def spent(self) -> np.ndarray:
        """Ids of the clients that have taken at least one step, ascending."""
        return np.array(sorted(self.counts), dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        rows = [(c, q, n) for c, own in sorted(self.counts.items()) for q, n in sorted(own.items())]
        return {"sigma": self.sigma, "client": np.array([r[0] for r in rows], dtype=np.int64),
                "rate": np.array([r[1] for r in rows], dtype=np.float64),
                "steps": np.array([r[2] for r in rows], dtype=np.int64)}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        if float(st["sigma"]) != self.sigma:
            raise PrivacyError(f"record-level σ in the state is {st['sigma']}, this run's is {self.sigma}")
        c, q, n = (np.asarray(st[k]).reshape(-1) for k in ("client", "rate", "steps"))
        if not (c.shape == q.shape == n.shape) or (n < 1).any():
            raise PrivacyError("record-level step counts must be matching (client, rate, steps >= 1) arrays")
        self.counts = {}
        self.add(c, q, 0)  # validates ids and rates
        for ci, qi, ni in zip(c.tolist(), q.tolist(), n.tolist()):
            own = self.counts.setdefault(int(ci), {})
            own[float(qi)] = own.get(float(qi), 0) + int(ni)
