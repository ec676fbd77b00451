"""The round, written once. Every driver calls it: the simulator (vectorized and sequential),
the Flower coordinator and its nodes, the attack harness and the clip-bound analysis.

    run_round(scheme, ctx, ...)
      1. privacy events of the round; refuse the round if one would exceed the budget
      2. round statistic       a `round_statistic` step only: gather(step, ctx), driver: the
                               answering clients' rows [k, n] → combine_statistic → ctx.statistic
         train(ctx)            driver: local training → rows [k, n] (None: clients train remotely)
         (private schemes keep non-finite rows: ClipStep zeroes them; others drop those clients)
      3. downstream bytes      what each selected client was sent (the statistic included)
      4. client_chain          the scheme's client steps, in order (in-process clients only)
      5. send(u, ctx)          driver: transport → Received (RoundAborted, or a secure sum of
                               fewer than 2 clients: nothing released)
         (a scheme that `streams`, given a piece size: train, 4 and 5 piece by piece, `stream`)
      6. server_chain          aggregator, then the server steps in reverse → delta [n]
      7. ledger                the events, only for a round that released something
      8. metrics               the keys every driver reports

Drivers keep what is theirs: who is selected, where clients train, evaluation, checkpoints,
and how rows reach the server. A client that trains elsewhere (a Flower node) calls
`client_statistic`, `local_plan`, `batch_plan` and `client_chain` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpfl.errors import BudgetExceededError, ConfigError
from dpfl.schemes.base import ClientPlan, Received, RoundContext, Step
from dpfl.schemes.dp import finite_rows
from dpfl.schemes.registry import float32_nbytes
from dpfl.secagg import RoundAborted

if TYPE_CHECKING:
    from dpfl.schemes.registry import Scheme

# ---------------------------------------------------------------- the client side


def train_mask(steps: Sequence[Step], ctx: RoundContext) -> torch.Tensor | None:
    """The coordinates local training may change this round: the AND of the steps' masks."""
    mask = None
    for s in steps:
        m = s.train_mask(ctx)
        if m is not None:
            mask = m if mask is None else (mask & m)
    return mask


def local_plan(scheme: Scheme, ctx: RoundContext) -> tuple[torch.Tensor | None, ClientPlan | None]:
    """(mask, plan): the shared train mask folded with the per-client plan's mask (bool [n] or
    [k, n]), and the one `ClientPlan` of the round (at most one step may give one)."""
    mask, plan = train_mask(scheme.steps, ctx), None
    for s in scheme.steps:
        p = s.local_training(ctx)
        if p is not None:
            if not s.changes_local_training:
                raise RuntimeError(f"step {s.name} changes local training but does not declare "
                                   "changes_local_training = True")
            if plan is not None:
                raise ConfigError(f"scheme {scheme.name}: more than one step changes per-client "
                                  "local training (Step.local_training); at most one may")
            plan = p
    if plan is not None and plan.mask is not None:
        mask = plan.mask if mask is None else (mask & plan.mask)
    return mask, plan


def batch_plan(scheme: Scheme, local: Any, sizes: np.ndarray) -> tuple[int, int]:
    """(steps, batch) of local training for clients of these data sizes: one batch of the
    largest client's data for full-batch schemes, one pass over the largest client's data for
    one-pass schemes (a client with less data stops earlier: its step does that), else
    `local.steps` × `local.batch_size`."""
    if scheme.full_batch:
        return 1, int(np.max(sizes))
    if scheme.one_pass:
        return -(-int(np.max(sizes)) // local.batch_size), local.batch_size
    return local.steps, local.batch_size


def client_chain(steps: Sequence[Step], u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
    """The client steps in order: rows [k, n] → [k, d']."""
    for s in steps:
        u = s.client(u, ctx)
    return u


def server_chain(scheme: Scheme, rec: Received, ctx: RoundContext) -> torch.Tensor:
    """The aggregator, then the server steps in reverse: the model delta [n]."""
    agg = scheme.aggregator(rec, ctx)
    for s in reversed(scheme.steps):
        agg = s.server(agg, ctx)
    if agg.shape != (ctx.n_params,):
        raise RuntimeError(f"scheme {scheme.name} produced a server update of shape {tuple(agg.shape)}, "
                           f"expected ({ctx.n_params},)")
    return agg


def drop_nonfinite(u: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, RoundContext, int]:
    """A client whose update holds NaN or ±inf (diverged local training, or a malformed message)
    is treated as failed before upload: its row leaves the round, the rest go on."""
    ok = finite_rows(u)
    if bool(ok.all()):
        return u, ctx, 0
    keep = ok.cpu().numpy()
    bad, omit = ctx.malicious, ctx.omit_noise
    return u[ok], replace(ctx, cohort=ctx.cohort[keep], weights=ctx.weights[ok],
                          malicious=None if bad is None else bad[keep],
                          omit_noise=None if omit is None else omit[keep]), int((~keep).sum())


def can_stream(scheme: Scheme, after_chain: Callable | None = None, acc: Accounting | None = None) -> bool:
    """Whether a round of `scheme` may go piece by piece (`stream`): it `streams`, and nothing in the round
    needs the whole cohort at once (a secure sum, rows at the server, a round statistic, an attack after the
    chain, a private ledger that keeps non-finite rows)."""
    return (scheme.streams and not scheme.transport.secure and not scheme.aggregator.needs_rows
            and not scheme.private and statistic_step(scheme) is None and after_chain is None
            and (acc is None or acc.ledger is None))


def _piece(ctx: RoundContext, rows: slice) -> RoundContext:
    """The context of the answering clients `rows` of a streamed round (their sum is still of all k)."""
    bad, omit = ctx.malicious, ctx.omit_noise
    return replace(ctx, cohort=ctx.cohort[rows], weights=ctx.weights[rows], answering=ctx.k(),
                   malicious=None if bad is None else bad[rows], omit_noise=None if omit is None else omit[rows])


def stream(scheme: Scheme, ctx: RoundContext, piece: int, train: Callable[[RoundContext], torch.Tensor | None],
           send: Callable[[torch.Tensor | None, RoundContext], Received]
           ) -> tuple[RoundContext, Received | None, int, int]:
    """Train, run the client chain and send `piece` clients at a time (`Scheme.streams`): no [k, n] tensor
    of the whole cohort is ever held. Returns (the round's context without clients dropped for non-finite
    rows, the parts' Received merged (no rows), values per row, clients dropped)."""
    total, count, sent, kept, bad, width = None, 0, [], [], 0, 0
    for s in range(0, len(ctx.cohort), piece):
        sub = _piece(ctx, slice(s, s + piece))
        u = train(sub)
        if u is None:
            raise RuntimeError("a streamed round trains in process: train(ctx) returned no rows")
        u, sub, b = drop_nonfinite(u, sub)
        bad += b
        if len(sub.cohort):
            u = client_chain(scheme.steps, u, sub)
            width = u.shape[1]
            rec = send(u, sub)  # its rows are dropped here: only the running total is kept
            total = rec.total.clone() if total is None else total.add_(rec.total)
            count += rec.count
            sent.append(np.asarray(rec.upstream_bytes))
            kept.append(sub)
            del rec
        del u
    if not kept:
        return _piece(ctx, slice(0, 0)), None, width, bad
    cat = np.concatenate
    out = replace(ctx, cohort=cat([c.cohort for c in kept]), weights=torch.cat([c.weights for c in kept]),
                  malicious=None if ctx.malicious is None else cat([c.malicious for c in kept]),
                  omit_noise=None if ctx.omit_noise is None else cat([c.omit_noise for c in kept]))
    return out, Received(rows=None, total=total, count=count, upstream_bytes=cat(sent), width=width), width, bad


def statistic_step(scheme: Scheme) -> Step | None:
    """The step that needs a round statistic before local training (`Step.round_statistic`), if any."""
    steps = [s for s in scheme.steps if s.round_statistic]
    if len(steps) > 1:
        raise ConfigError(f"scheme {scheme.name}: more than one step needs a round statistic "
                          "(Step.round_statistic); at most one may")
    return steps[0] if steps else None


def check_dpsgd(scheme: Scheme) -> None:
    """train.dpsgd (clipped, noised gradients on sampled batches) protects nothing in a scheme that
    trains on full batches or whose clients first send a statistic of their raw data: ConfigError."""
    if scheme.full_batch:
        raise ConfigError(f"train.dpsgd does not combine with scheme {scheme.name!r}: it trains on "
                          "each client's full data in one batch, not on sampled batches")
    step = statistic_step(scheme)
    if step is not None:
        raise ConfigError(f"train.dpsgd does not combine with scheme {scheme.name!r}: its clients first send "
                          f"a statistic of their data without DP-SGD noise ({step.name}'s round statistic)")


Gather = Callable[[Step, RoundContext], torch.Tensor]
"""``gather(step, ctx)``: the answering clients' rows of `step`'s statistic, float32 [k, n] in
``ctx.cohort`` order (in process: `Step.client_statistic`; over Flower: an exchange, after which
clients that did not answer have left ``ctx.cohort`` and ``ctx.weights``). RoundAborted: none did."""


def round_statistic(step: Step, ctx: RoundContext, gather: Gather) -> tuple[RoundContext, int, int, int]:
    """Sets ``ctx.statistic`` from the answering clients' rows: (ctx, clients dropped for a row with
    NaN or ±inf, bytes the clients uploaded, values per row). RoundAborted if no usable row is left."""
    rows = gather(step, ctx)
    if rows.dtype != torch.float32 or rows.shape != (len(ctx.cohort), ctx.n_params):
        raise RuntimeError(f"step {step.name}: the clients' statistic rows are {rows.dtype} {tuple(rows.shape)}, "
                           f"expected float32 ({len(ctx.cohort)}, {ctx.n_params})")
    up = len(ctx.cohort) * float32_nbytes(rows[0]) if len(ctx.cohort) else 0
    rows, ctx, bad = drop_nonfinite(rows, ctx)
    if not len(ctx.cohort):
        raise RoundAborted(f"round {ctx.round}: all {bad} answering clients sent a non-finite {step.name} statistic")
    stat = step.combine_statistic(rows, ctx)
    if stat.dtype != torch.float32 or stat.shape != (ctx.n_params,):
        raise RuntimeError(f"step {step.name} combined its statistic into {stat.dtype} {tuple(stat.shape)}, "
                           f"expected float32 ({ctx.n_params},)")
    ctx.statistic = stat
    return ctx, bad, up, ctx.n_params


# ---------------------------------------------------------------- the round


@dataclass
class Accounting:
    """The run's privacy accounting as a round needs it (ledger None: the scheme is not private)."""

    ledger: Any = None
    target_epsilon: float | None = None
    delta: float = 1e-5
    sampling: str = "none"  # how ε accounts client selection (reported as epsilon_sampling)


@dataclass
class RoundOutcome:
    delta: torch.Tensor | None  # the model update; None when nothing was released
    ctx: RoundContext  # the round's context (without clients dropped for non-finite rows)
    metrics: dict[str, Any]
    received: Received | None = None


def empty_totals() -> dict[str, Any]:
    """The cumulative byte counters a driver keeps across rounds (and checkpoints)."""
    return {"up_bytes": 0, "down_bytes": 0, "formula_up_bytes": 0.0, "formula_down_bytes": 0.0}


def round_events(scheme: Scheme, ctx: RoundContext, acc: Accounting) -> list[Any]:
    """The round's privacy events; BudgetExceededError if one would exceed the target."""
    events = []
    for s in scheme.steps:
        mine = s.privacy_events(ctx)
        if mine and not s.private:
            raise RuntimeError(f"step {s.name} returns privacy events but does not declare private = True")
        events += mine
    if acc.ledger is not None:
        for e in events:
            if acc.ledger.would_exceed(e):
                raise BudgetExceededError(f"round {ctx.round} would exceed privacy.target_epsilon = "
                                          f"{acc.target_epsilon}")
    return events


def run_round(scheme: Scheme, ctx: RoundContext, acc: Accounting, *,
              train: Callable[[RoundContext], torch.Tensor | None],
              send: Callable[[torch.Tensor | None, RoundContext], Received],
              after_chain: Callable[[torch.Tensor, RoundContext], torch.Tensor] | None = None,
              gather: Gather | None = None,
              totals: dict[str, Any], n_clients: int, sampling_rate: float,
              extra: dict[str, Any] | None = None, piece: int = 0) -> RoundOutcome:
    """One round of `scheme` for the answering clients `ctx.cohort` (see the module docstring).

    `train(ctx)` returns the cohort's rows [k, n] for in-process clients, or None when clients
    train and run the chain themselves (then `send(None, ctx)` reaches them). `send` may raise
    RoundAborted: the round then releases nothing (no model update, no privacy event).
    `gather` (schemes with a `round_statistic` step) collects the clients' statistic rows.
    `totals` (cumulative bytes) is updated in place; `extra` (driver metrics, which the driver
    may fill while the round runs) goes into the metrics after the byte counters. `piece` > 0: a scheme
    that `streams` trains and sends at most that many clients at a time (`stream`)."""
    events = round_events(scheme, ctx, acc)
    r, n_selected = ctx.round, ctx.n_selected
    aborted, diverged, u, rec, delta = None, 0, None, None, None
    stat, stat_up, stat_width = statistic_step(scheme), 0, 0
    if len(ctx.cohort) and stat is not None:
        if gather is None:
            raise RuntimeError(f"scheme {scheme.name} needs a round statistic: the driver must pass gather")
        try:
            ctx, diverged, stat_up, stat_width = round_statistic(stat, ctx, gather)
        except RoundAborted as e:
            aborted = str(e)
    streamed = bool(piece) and len(ctx.cohort) > piece and can_stream(scheme, after_chain, acc)
    if streamed and aborted is None:
        try:
            ctx, rec, width, bad = stream(scheme, ctx, piece, train, send)
        except RoundAborted as e:
            aborted, bad = str(e), 0
        diverged += bad
        if aborted is None and not len(ctx.cohort):
            aborted = f"all {bad} answering clients sent non-finite updates"
    elif len(ctx.cohort) and aborted is None:
        u = train(ctx)
        if u is not None and acc.ledger is None:  # private schemes' ClipStep zeroes such rows, keeping the noise
            u, ctx, bad = drop_nonfinite(u, ctx)
            diverged += bad
            if not len(ctx.cohort):
                aborted = f"all {bad} answering clients sent non-finite updates"
    down_one = scheme.downstream_bytes(ctx)  # after local training: what the clients were sent
    if ctx.statistic is not None:
        down_one += float32_nbytes(ctx.statistic)
    if len(ctx.cohort) and aborted is None and not streamed:
        try:
            if u is not None:
                u = client_chain(scheme.steps, u, ctx)
                if after_chain is not None:
                    u = after_chain(u, ctx)
            if scheme.transport.secure and len(ctx.cohort) < 2:  # a sum of one row is that row
                raise RoundAborted(f"secure aggregation needs ≥ 2 clients, round {r} has {len(ctx.cohort)}: "
                                   "nothing released")
            rec = send(u, ctx)
        except RoundAborted as e:
            aborted = str(e)
    up, formula_up = 0, 0.0
    if len(ctx.cohort) and aborted is None:
        delta = server_chain(scheme, rec, ctx)
        up = int(np.asarray(rec.upstream_bytes).sum()) + stat_up
        bits = scheme.transport.bits_per_value
        if not streamed:
            width = u.shape[1] if u is not None else rec.width  # values per row on the wire (d')
        formula_up = width * (32 if bits is None else bits) / 8 + stat_width * 4
    if acc.ledger is not None and aborted is None:
        for e in events:
            acc.ledger.add(e)
    down = down_one * n_selected
    totals["up_bytes"] += up
    totals["down_bytes"] += down
    totals["formula_up_bytes"] += sampling_rate * formula_up
    totals["formula_down_bytes"] += sampling_rate * down_one
    m: dict[str, Any] = {
        "round": r, "selected": n_selected, "answered": len(ctx.cohort),
        "up_bytes": up, "down_bytes": down,
        # per client of the federation, cumulative: comparable with the thesis cost formula
        "cum_up_bytes_per_client": totals["up_bytes"] / n_clients,
        "cum_down_bytes_per_client": totals["down_bytes"] / n_clients,
        "formula_up_bytes_per_client": totals["formula_up_bytes"],
        "formula_down_bytes_per_client": totals["formula_down_bytes"],
        **(extra or {}),
    }
    if diverged:
        m["diverged"] = diverged
    if aborted is not None:
        m["aborted"] = aborted
    m.update({f"step_{k}": v for k, v in ctx.metrics.items()})
    if acc.ledger is not None:
        m["epsilon"] = acc.ledger.epsilon(acc.delta)
        m["epsilon_sampling"] = acc.sampling
    return RoundOutcome(delta, ctx, m, rec)
