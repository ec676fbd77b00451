"""Ledger behaviour: budget, composition, checkpoints, neighbouring relations, DGM, errors."""

import json
import math

import numpy as np
import pytest

from dpfl.errors import BudgetExceededError, DpflError, PrivacyError
from dpfl.privacy import (
    ApproxDPEvent,
    Budget,
    ComposedEvent,
    DiscreteGaussianEvent,
    GaussianEvent,
    LaplaceEvent,
    Ledger,
    PureDPEvent,
    SampledGaussianEvent,
    SelfComposedEvent,
    ZCDPEvent,
    epsilon_for,
    event_from_dict,
    kappa,
    zcdp_to_dp,
)
from dpfl.privacy import rdp as R

EV = SampledGaussianEvent(1.54, 1 / 60)


def test_budget_refuses_the_first_round_over_budget_and_records_nothing():
    led = Ledger("rdp", budget=Budget(0.6, 1e-5))
    first_over = next(t for t in range(1, 400) if epsilon_for(1.54, 1 / 60, t, 1e-5, "rdp") > 0.6)
    for _ in range(first_over - 1):
        led.add(EV)
    before, n_events = led.epsilon(), len(led.events)
    assert led.would_exceed(EV)
    with pytest.raises(BudgetExceededError) as err:
        led.add(EV)
    assert isinstance(err.value, PrivacyError) and isinstance(err.value, DpflError)
    assert "budget" in str(err.value)
    assert led.epsilon() == before and len(led.events) == n_events


def test_would_exceed_without_budget_is_false_and_validates():
    led = Ledger("moments")
    assert led.would_exceed(EV, 10**6) is False
    with pytest.raises(PrivacyError):
        led.would_exceed("not an event")


def test_per_round_adds_equal_self_composition_and_nested_forms():
    a, b = SampledGaussianEvent(1.1, 0.02), LaplaceEvent(10.0)
    for acc in ("moments", "rdp"):
        step = Ledger(acc)
        for _ in range(5):
            step.add(a)
        step.add(b, 2)
        nested = Ledger(acc)
        nested.add(ComposedEvent((SelfComposedEvent(a, 5), SelfComposedEvent(b, 2))))
        assert step.epsilon(1e-6) == pytest.approx(nested.epsilon(1e-6), rel=1e-12)


def test_pld_incremental_composition_matches_self_composition():
    inc = Ledger("pld", pld_discretization=1e-3)
    for _ in range(30):
        inc.add(EV)
    once = Ledger("pld", pld_discretization=1e-3)
    once.add(EV, 30)
    assert inc.epsilon(1e-5) == pytest.approx(once.epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("acc", ["moments", "rdp", "pld"])
def test_state_dict_round_trip_is_bit_identical(acc):
    led = Ledger(acc, budget=Budget(5.0, 1e-5), pld_discretization=1e-3)
    events = [(EV, 3), (GaussianEvent(20.0), 1), (PureDPEvent(0.01), 2), (ApproxDPEvent(0.01, 1e-8), 1)]
    if acc != "pld":
        events.append((DiscreteGaussianEvent(1.54, 1 / 60, 1000, 10, nu=0.01, sampler_tv=1e-20), 2))
        events.append((ZCDPEvent(0.001), 1))
    for e, k in events:
        led.add(e, k)
    state = json.loads(json.dumps(led.state_dict()))
    back = Ledger.from_state_dict(state)
    assert back.epsilon() == led.epsilon() and back.delta(1.0) == led.delta(1.0)
    assert back.events == led.events
    other = Ledger(acc, pld_discretization=1e-3)
    with pytest.raises(PrivacyError):
        Ledger("rdp" if acc != "rdp" else "moments").load_state_dict(state)
    other.load_state_dict(state)
    assert other.epsilon(1e-5) == led.epsilon(1e-5)


def test_event_dicts_round_trip():
    evs = [
        EV,
        GaussianEvent(2.0),
        DiscreteGaussianEvent(1.0, 0.1, 100, 5),
        LaplaceEvent(3.0),
        PureDPEvent(1.0),
        ApproxDPEvent(1.0, 1e-6),
        ZCDPEvent(0.1, 0.2),
        ComposedEvent((EV, SelfComposedEvent(GaussianEvent(1.0), 3))),
    ]
    for e in evs:
        assert event_from_dict(json.loads(json.dumps(e.to_dict()))) == e
    with pytest.raises(PrivacyError, match="unknown event kind"):
        event_from_dict({"kind": "nope"})


def test_approx_dp_events_compose_basically_under_rdp():
    led = Ledger("rdp")
    led.add(ApproxDPEvent(0.5, 1e-6), 3)
    assert led.epsilon(1e-5) == pytest.approx(1.5)
    assert led.delta(1.5) == pytest.approx(3e-6)
    assert led.delta(1.4) == 1.0
    assert led.epsilon(2e-6) == math.inf  # the approximate-DP deltas alone exceed it


def test_pure_dp_events_under_rdp_beat_the_zcdp_route():
    led = Ledger("rdp")
    led.add(PureDPEvent(0.1), 100)
    assert led.epsilon(1e-5) <= zcdp_to_dp(100 * 0.1**2 / 2, 1e-5)
    assert led.epsilon(1e-5) <= 10.0


def test_replace_one_doubles_the_sensitivity():
    for acc in ("rdp", "moments", "pld"):
        rep = Ledger(acc, "replace_one", pld_discretization=1e-3)
        rep.add(GaussianEvent(4.0), 10)
        add = Ledger(acc, "add_remove", pld_discretization=1e-3)
        add.add(GaussianEvent(2.0), 10)
        assert rep.epsilon(1e-6) == pytest.approx(add.epsilon(1e-6), rel=1e-6)
    for acc in ("rdp", "pld"):
        rep, add = Ledger(acc, "replace_one", pld_discretization=1e-3), Ledger(acc, pld_discretization=1e-3)
        rep.add(LaplaceEvent(2.0), 3)
        add.add(LaplaceEvent(1.0), 3)
        assert rep.epsilon(1e-6) == pytest.approx(add.epsilon(1e-6), rel=1e-9)
    assert Ledger("rdp").epsilon(1e-6) == 0


def test_replace_one_subsampled_needs_pld():
    with pytest.raises(PrivacyError, match="pld"):
        Ledger("rdp", "replace_one").add(EV)
    rep = Ledger("pld", "replace_one", pld_discretization=1e-3)
    rep.add(EV, 50)
    add = Ledger("pld", "add_remove", pld_discretization=1e-3)
    add.add(EV, 50)
    assert rep.epsilon(1e-5) > add.epsilon(1e-5)


def test_discrete_gaussian_event_thesis_correction():
    # FL-SIGN-DP setting: xi = sqrt(n) sigma ~ 2000, both corrections are numerically zero
    fl = DiscreteGaussianEvent(1.54, 1 / 60, 1_663_370, 100)
    for acc in ("moments", "rdp"):
        a, b = Ledger(acc), Ledger(acc)
        a.add(fl, 200)
        b.add(EV, 200)
        assert a.epsilon(1e-5) == pytest.approx(b.epsilon(1e-5), rel=1e-12)
    # a small lattice std: the correction is visible and equals the formula of Thm 3
    ev = DiscreteGaussianEvent(0.5, 0.1, 1, 1)
    k = 2 * math.exp(-2 * math.pi**2 * 0.25) / (1 - math.exp(-6 * math.pi**2 * 0.25))
    assert kappa(0.5) == pytest.approx(k, rel=1e-14)
    lam = R.MOMENTS_LAMBDAS
    base = R.leaf_rdp(SampledGaussianEvent(0.5, 0.1), R.MOMENTS_ORDERS, "add_remove") * lam
    corr = R.leaf_rdp(ev, R.MOMENTS_ORDERS, "add_remove") * lam - base
    assert np.allclose(corr, lam * math.log(1 + k) - (lam + 1) * math.log(1 - k), rtol=1e-9)
    # cohort > 1 adds 3 log((1+nu)/(1-nu)); nu must satisfy Lemma 3 (xi/sqrt(cohort) >= sqrt(ln(2+2/nu))/pi)
    one = R.leaf_rdp(DiscreteGaussianEvent(1.0, 0.1, 1, 1), R.MOMENTS_ORDERS, "add_remove") * lam
    two = R.leaf_rdp(DiscreteGaussianEvent(1.0, 0.1, 1, 2, nu=0.5), R.MOMENTS_ORDERS, "add_remove") * lam
    assert np.allclose(two - one, 3 * math.log(1.5 / 0.5), rtol=1e-9)
    with pytest.raises(PrivacyError, match="Lemma 3"):
        DiscreteGaussianEvent(1.0, 0.1, 1, 2, nu=1e-6)
    with pytest.raises(PrivacyError, match="no nu < 1"):
        DiscreteGaussianEvent(0.5, 0.1, 1, 2)
    auto = DiscreteGaussianEvent(1.0, 0.1, 1, 2)
    assert auto.nu_effective == pytest.approx(2 / (math.exp(math.pi**2 * 0.5) - 2), rel=1e-9)
    assert auto.xi_share >= math.sqrt(math.log(2 + 2 / auto.nu_effective)) / math.pi


def test_discrete_gaussian_and_zcdp_refused_by_pld():
    with pytest.raises(PrivacyError, match="rdp"):
        Ledger("pld").add(DiscreteGaussianEvent(1.54, 1 / 60, 1000, 10))
    with pytest.raises(PrivacyError, match="zCDP"):
        Ledger("pld").add(ZCDPEvent(0.1))


def test_sampler_tv_enters_delta():
    led = Ledger("rdp")
    led.add(DiscreteGaussianEvent(1.54, 1 / 60, 1_663_370, 100, sampler_tv=1e-7), 200)
    clean = Ledger("rdp")
    clean.add(EV, 200)
    assert led.sampler_tv == pytest.approx(2e-5)
    eps = 0.9
    assert led.delta(eps) == pytest.approx(clean.delta(eps) + (1 + math.exp(eps)) * 2e-5, rel=1e-9)
    e = led.epsilon(1e-4)
    assert led.delta(e) <= 1e-4 * (1 + 1e-9)
    assert e > clean.epsilon(1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SampledGaussianEvent(0.0, 0.1),
        lambda: SampledGaussianEvent(-1.0, 0.1),
        lambda: SampledGaussianEvent(1.0, 0.0),
        lambda: SampledGaussianEvent(1.0, 1.5),
        lambda: GaussianEvent(float("nan")),
        lambda: LaplaceEvent(0),
        lambda: ApproxDPEvent(1.0, 1.0),
        lambda: ZCDPEvent(-0.1),
        lambda: DiscreteGaussianEvent(1.0, 0.1, 0, 1),
        lambda: Ledger("exact"),
        lambda: Ledger("rdp", "swap"),
        lambda: Budget(1.0, 0.0),
        lambda: Ledger("rdp").epsilon(1.5),
        lambda: Ledger("rdp").epsilon(),
        lambda: Ledger("rdp").add(EV, 0),
        lambda: Ledger("moments", orders=[2, 3]),
        lambda: Ledger("rdp", orders=[0.5, 2]),
    ],
)
def test_invalid_arguments_raise_privacy_error(make):
    with pytest.raises(PrivacyError):
        make()


def test_error_messages_name_the_value_and_range():
    with pytest.raises(PrivacyError, match=r"q must be in \(0, 1\], got 1.5"):
        SampledGaussianEvent(1.0, 1.5)
    with pytest.raises(PrivacyError, match=r"delta must be in \(0, 1\), got 0"):
        Ledger("rdp").epsilon(0)
    with pytest.raises(PrivacyError, match="moments"):
        Ledger("nope")
