"""The attack contract: hooks the simulator calls at fixed points of a round.

Order in a round: `select` (which answering clients are malicious) → local training
(`train` may replace it for malicious rows, e.g. colluding gradient ascent) → `tamper`
(replace/boost raw updates) → scheme client chain (noise steps read `ctx.malicious`, e.g. to
omit an attacker's noise share) → `after_chain` (e.g. boosted signs) → transport.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dpfl.schemes.base import RoundContext


class Attack:
    name = "none"

    def prepare(self, fed: Any, seeds: Any) -> Any:
        """Modify the federation's data once (backdoors); return the federation."""
        return fed

    def select(self, ctx: RoundContext) -> np.ndarray:
        """bool [k]: which answering clients of this round are malicious."""
        return np.zeros(len(ctx.cohort), dtype=bool)

    def train(self, run: Any, ctx: RoundContext, honest_updates: torch.Tensor) -> torch.Tensor:
        """Updates after local training; malicious rows may be recomputed here."""
        return honest_updates

    def tamper(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return u

    def after_chain(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return u

    def evaluate(self, run: Any) -> dict[str, float]:
        """Extra metrics at evaluation rounds (e.g. backdoor success)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
