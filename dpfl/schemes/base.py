"""The scheme contract: a client update flows through a chain of small named steps.

A round (written once, in `dpfl.schemes.round.run_round`, which every driver calls):

1. select the cohort; the server *broadcasts* the model (``Scheme.downstream_bytes``);
2. every answering client trains locally (vectorized over the cohort) and produces its
   update ``Δw`` as one row of ``u: Tensor[k, n]`` (flat parameters, ``named_parameters`` order).
   A step may change local training for all clients (``train_mask``: a shared mask) or per
   client (``local_training``: a ``ClientPlan`` with per-client starting points, masks and a
   gradient hook; FedDyn, FSVRG, Sub-FedAvg). A step that needs a statistic of the round's
   clients first (``round_statistic``: FSVRG's full gradient) gets it in ``ctx.statistic``:
   each client sends its row (``client_statistic``), the server combines them
   (``combine_statistic``) and sends the result back before local training;
3. ``u`` goes through ``step.client(u, ctx)`` for every step of the chain, in order
   (compress, clip, add a noise share, ...). Shapes may change (n → m);
4. the *transport* encodes each client's row into the exact bytes it would send
   (``Payload``), counts them, and hands the server what it may see: the individual
   decoded rows, or — with secure aggregation — only their sum;
5. the *aggregator* turns that into one vector (sum, mean, data-size-weighted mean,
   or a robust rule that needs individual rows);
6. the aggregate goes through ``step.server(agg, ctx)`` for every step in *reverse* order
   (decode, reconstruct, momentum, ...), ending as a full-size model delta;
7. the engine applies ``w ← w + delta``.

Everything is batched over the cohort: a step sees all k client rows at once. Steps
keep their own state (momentum, error feedback, a Top-K set) and expose it through
``state_dict`` / ``load_state_dict`` so runs resume bit-identically.

What a step declares (typed class attributes; drivers read these, never method overrides):
``private`` (it adds privacy events: the run keeps a ledger), ``sigma`` (its noise multiplier),
``changes_local_training`` (it returns a ``ClientPlan``), ``client_state`` (it keeps per-client
state between rounds, which a deployed client keeps on its own node), ``round_statistic`` (it
needs a statistic of the round's clients before local training: a second exchange over Flower);
what its server side needs from deployed clients goes through ``client_report`` / ``server_report``. A transport declares ``secure`` and
``bits_per_value`` (bits one value takes on the wire; None: 32-bit floats). A step whose client side
follows server state that changes between rounds (the adaptive clip bound) gives it in ``round_values``;
``needs_aggregator`` names the aggregator its server side assumes (checked at setup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpfl.rng import Seeds


@dataclass
class SetupContext:
    """What a step may use once, before round 1."""

    n_params: int
    seeds: Seeds
    device: torch.device
    initial_params: torch.Tensor  # flat w_0
    model: Any = None  # nn.Module (structure only; dpfl.training evaluates)
    trainer: Any = None  # dpfl.training.Trainer, to run local training on public data
    public_data: Any = None  # (x, y) tensors the server may use, or None
    clients: Any = None  # the federation's client datasets (for non-private heuristics)
    n_clients: int = 0
    cohort_size: int = 0
    ledger: Any = None  # privacy ledger, or None


@dataclass
class RoundContext:
    """What a step sees in one round."""

    round: int  # 1-based
    n_params: int
    cohort: np.ndarray  # ids of the clients that answered, shape [k]
    n_selected: int  # clients selected (answered + dropped)
    weights: torch.Tensor  # |D_k| of the answering clients, float [k]
    seeds: Seeds
    device: torch.device
    global_params: torch.Tensor  # flat w_{t-1}
    n_clients: int = 0
    cohort_size: int = 0  # expected |K| (C·N)
    ledger: Any = None
    metrics: dict[str, float] = field(default_factory=dict)  # steps add scalars here
    malicious: np.ndarray | None = None  # bool [k] set by an attack; honest steps may ignore it
    omit_noise: np.ndarray | None = None  # bool [k]: attackers that drop their DP noise share (§6.3)
    dp_noise_std: float | None = None  # per-coordinate std of the DP noise in this round's mean (DP noise step)
    # the round statistic float32 [n] a `round_statistic` step asked for (FSVRG: ∇f(w_t)), set before
    # local training from the answering clients' rows; None when no step asks for one
    statistic: torch.Tensor | None = None

    # k: the clients whose rows make up this round's sum; 0 = len(cohort). A deployed client
    # (dpfl.flower) runs the chain on its own row only: cohort = [its id], answering = k.
    answering: int = 0

    def k(self) -> int:
        """The number of clients in this round's sum (noise shares are calibrated on it)."""
        return self.answering or len(self.cohort)

    def numpy_rng(self, *purpose: object) -> np.random.Generator:
        return self.seeds.numpy("round", self.round, *purpose)

    def torch_rng(self, *purpose: object) -> torch.Generator:
        return self.seeds.torch("round", self.round, *purpose, device="cpu")


@dataclass
class ClientPlan:
    """Per-client changes to this round's local training (rows follow ``RoundContext.cohort``).

    Every field is optional; None keeps the engine's default."""

    start: torch.Tensor | None = None  # [k, n] per-client starting points (Δw is measured from them)
    mask: torch.Tensor | None = None  # bool [k, n]: coordinates each client may change
    grad_hook: Any = None  # dpfl.training.trainer.GradHook: per-step in-place change of the loss gradients


class Step:
    """One named stage of a scheme. Override what you need; defaults pass through."""

    name = "step"
    private: bool = False  # adds privacy events (`privacy_events`): the run keeps a privacy ledger
    changes_local_training: bool = False  # returns a ClientPlan from `local_training`
    # keeps per-client state between rounds in `state_dict` (FedDyn's memory, Sub-FedAvg's masks):
    # a deployed client keeps its own part on its node
    client_state: bool = False
    # needs a statistic of the round's answering clients before local training (`client_statistic`
    # rows, combined by `combine_statistic` into ctx.statistic); over Flower a first exchange
    round_statistic: bool = False
    sigma: float | None = None  # the noise multiplier σ of a noise step (checkpoints compare it on resume)
    # the aggregator (by name) its server side reads the aggregate of (the adaptive clip's count: "dp_mean")
    needs_aggregator: str | None = None

    def setup(self, ctx: SetupContext) -> None:
        """Called once before training (e.g. pick a Top-K set, select a clip bound)."""

    def train_mask(self, ctx: RoundContext) -> torch.Tensor | None:
        """Optional bool[n]: coordinates local training may change this round (others reset)."""
        return None

    def local_training(self, ctx: RoundContext) -> ClientPlan | None:
        """Optional per-client changes to local training this round (at most one step per scheme)."""
        return None

    def client_statistic(self, ctx: RoundContext, x: torch.Tensor, y: torch.Tensor,
                         rows: Sequence[np.ndarray]) -> torch.Tensor:
        """`round_statistic` steps: each listed client's row of the statistic at ctx.global_params,
        float32 [len(rows), n], client i's samples being x[rows[i]], y[rows[i]] (computed where
        the data is: in process, or on a deployed client's node)."""
        raise NotImplementedError(f"step {self.name} declares round_statistic but has no client_statistic")

    def combine_statistic(self, rows: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """`round_statistic` steps: the server's statistic [n] from the answering clients' rows
        [k, n] (cohort order), which every client then receives in ctx.statistic."""
        raise NotImplementedError(f"step {self.name} declares round_statistic but has no combine_statistic")

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Transform the cohort's updates, ``u: [k, d] -> [k, d']``."""
        return u

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Transform the aggregate (reverse chain order), ``[d'] -> [d]``."""
        return agg

    def downstream_bytes(self, ctx: RoundContext) -> int | None:
        """Bytes one client downloads this round, if this step decides it (else None)."""
        return None

    def client_report(self, ctx: RoundContext) -> dict[str, torch.Tensor]:
        """What a deployed client sends beside its row so that this step's server side can run
        (Sub-FedAvg: its new mask), after `client`: name → rows [k, ...]. In process the step
        already holds it; over Flower the coordinator hands the stacked reports to `server_report`."""
        return {}

    def server_report(self, report: dict[str, torch.Tensor], ctx: RoundContext) -> None:
        """The answering clients' `client_report`s, stacked in cohort order (before `server`)."""

    def privacy_events(self, ctx: RoundContext) -> list[Any]:
        """Privacy events this round adds to the ledger (noise steps)."""
        return []

    def round_values(self) -> dict[str, float]:
        """Scalars of this step's server-side state that its client side needs this round (the
        adaptive clip's bound C_t). In process the step already holds them; over Flower they travel
        in the round plan and a deployed client sets them with `load_round_values`."""
        return {}

    def load_round_values(self, values: dict[str, float]) -> None:
        """A deployed client's copy of `round_values` from the server (checked by the step)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def describe(self) -> str:
        return self.name


@dataclass
class Received:
    """What the server holds after transport."""

    rows: torch.Tensor | None  # decoded individual updates [k, d], None under secure aggregation
    total: torch.Tensor  # sum over clients [d] (float64 or int64 where exact)
    count: int  # number of contributions in `total`
    upstream_bytes: np.ndarray  # bytes each client sent, int64 [k]
    width: int = 0  # values per client row as sent (d'); set where the clients ran the chain remotely


class Transport:
    """Encodes each client's row into its wire payload, counts bytes, decodes for the server."""

    name = "transport"
    secure: bool = False  # True when the server only learns the sum
    bits_per_value: int | None = None  # bits one value takes on the wire (last round sent); None: float32
    drop_after_masking: float = 0.0  # share of clients a secure sum simulates as failing (simulator only)

    def setup(self, ctx: SetupContext) -> None:
        pass

    def transmit(self, u: torch.Tensor, ctx: RoundContext) -> Received:
        raise NotImplementedError

    def round_transport(self, k: int, d: int) -> Any:
        """A secure transport's `SecAggTransport` for a round of k clients sending d values
        (what a deployed round runs); None if this transport has none."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Aggregator:
    """Turns what the server received into one vector."""

    name = "aggregator"
    needs_rows = False  # robust rules need individual updates (incompatible with secure agg)

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        raise NotImplementedError
