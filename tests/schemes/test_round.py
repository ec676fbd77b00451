"""The round written once (dpfl.schemes.round): budget, abort and ledger rules, declared step facts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpfl.errors import BudgetExceededError
from dpfl.rng import Seeds
from dpfl.schemes.aggregators import MeanAggregator
from dpfl.schemes.base import ClientPlan, RoundContext, Step
from dpfl.schemes.registry import Scheme
from dpfl.schemes.round import Accounting, empty_totals, local_plan, run_round
from dpfl.schemes.transport import PlainTransport
from dpfl.secagg import RoundAborted

N = 6


class Ledger:
    def __init__(self, limit: int = 10):
        self.events, self.limit = [], limit

    def would_exceed(self, e) -> bool:
        return len(self.events) >= self.limit

    def add(self, e) -> None:
        self.events.append(e)

    def epsilon(self, delta: float) -> float:
        return float(len(self.events))


class Noise(Step):
    name, private = "noise", True

    def privacy_events(self, ctx):
        return ["event"]


class Undeclared(Noise):
    private = False


def _ctx(k: int = 3) -> RoundContext:
    return RoundContext(round=1, n_params=N, cohort=np.arange(k), n_selected=k + 1, weights=torch.ones(k),
                        seeds=Seeds(0), device=torch.device("cpu"), global_params=torch.zeros(N), n_clients=10)


def _round(steps, ledger, send=None, train=None):
    scheme = Scheme("t", steps, PlainTransport(), MeanAggregator())
    totals = empty_totals()
    out = run_round(scheme, _ctx(), Accounting(ledger, 1.0, 1e-5, "poisson"),
                    train=train or (lambda ctx: torch.ones(len(ctx.cohort), N)),
                    send=send or scheme.transport.transmit, totals=totals, n_clients=10, sampling_rate=0.3)
    return out, totals


def test_a_released_round_charges_the_ledger_and_returns_the_delta():
    ledger = Ledger()
    out, totals = _round([Noise()], ledger)
    assert torch.equal(out.delta, torch.ones(N)) and ledger.events == ["event"]
    assert out.metrics["up_bytes"] == totals["up_bytes"] == 3 * N * 4
    assert out.metrics["epsilon"] == 1.0 and out.metrics["epsilon_sampling"] == "poisson"


def test_an_aborted_round_releases_nothing_and_reports_the_same_keys():
    def abort(u, ctx):
        raise RoundAborted("too few survivors")

    ledger = Ledger()
    out, _ = _round([Noise()], ledger, send=abort)
    released, _ = _round([Noise()], Ledger())
    assert out.delta is None and not ledger.events
    assert out.metrics["aborted"] == "too few survivors" and out.metrics["up_bytes"] == 0
    assert set(out.metrics) - {"aborted"} == set(released.metrics)
    assert out.metrics["down_bytes"] == released.metrics["down_bytes"] > 0  # the model went out


def test_a_round_past_the_budget_is_refused_before_anyone_trains():
    def train(ctx):
        raise AssertionError("trained")

    with pytest.raises(BudgetExceededError, match="round 1"):
        _round([Noise()], Ledger(limit=0), train=train)


def test_steps_must_declare_privacy_events_and_local_training():
    with pytest.raises(RuntimeError, match="private = True"):
        _round([Undeclared()], Ledger())

    class Plans(Step):
        name = "plans"

        def local_training(self, ctx):
            return ClientPlan()

    with pytest.raises(RuntimeError, match="changes_local_training"):
        local_plan(Scheme("t", [Plans()], PlainTransport(), MeanAggregator()), _ctx())
    Plans.changes_local_training = True
    assert local_plan(Scheme("t", [Plans()], PlainTransport(), MeanAggregator()), _ctx())[1] is not None


class Mean(Step):
    """Needs the mean of the clients' rows before they train."""

    name, round_statistic = "mean", True

    def combine_statistic(self, rows, ctx):
        return rows.mean(0)


def _statistic_round(rows, gather=True):
    seen = []

    def train(ctx):
        seen.append((ctx.cohort.tolist(), ctx.statistic.clone()))
        return torch.ones(len(ctx.cohort), N)

    scheme = Scheme("t", [Mean()], PlainTransport(), MeanAggregator())
    out = run_round(scheme, _ctx(), Accounting(), train=train, send=scheme.transport.transmit,
                    gather=(lambda step, ctx: rows[ctx.cohort]) if gather else None, totals=empty_totals(),
                    n_clients=10, sampling_rate=0.3)
    return out, seen


def test_a_round_statistic_is_combined_before_training_and_its_bytes_counted():
    rows = torch.arange(3 * N, dtype=torch.float32).view(3, N)
    rows[1, 2] = float("nan")  # client 1's row: it leaves the round before anyone trains
    out, seen = _statistic_round(rows)
    assert seen[0][0] == [0, 2] and torch.equal(seen[0][1], (rows[0] + rows[2]) / 2)
    assert out.metrics["diverged"] == 1 and out.metrics["answered"] == 2
    assert out.metrics["up_bytes"] == 2 * N * 4 + 3 * N * 4  # the updates, and every statistic row sent
    assert out.metrics["down_bytes"] == 4 * 2 * N * 4  # model and statistic, to each of the 4 selected
    assert out.metrics["formula_up_bytes_per_client"] == pytest.approx(0.3 * 2 * N * 4)

    out, seen = _statistic_round(torch.full((3, N), float("nan")))
    assert not seen and out.delta is None and "non-finite mean statistic" in out.metrics["aborted"]
    with pytest.raises(RuntimeError, match="must pass gather"):
        _statistic_round(rows, gather=False)
