import math

import numpy as np
import pytest
import torch
from attack_helpers import fl_sign, round_ctx, tiny_config
from scipy import stats

from dpfl.attacks.registry import build_attack
from dpfl.config import AttackConfig
from dpfl.engine.simulator import Simulator
from dpfl.errors import ConfigError
from dpfl.run.state import Run


def attack(name, fraction=0.2, mode="fixed", **options):
    return build_attack(AttackConfig(name=name, fraction=fraction, mode=mode, options=options))


# ---- selection ---------------------------------------------------------------------


@pytest.mark.parametrize("fraction,k,expected", [(0.1, 100, 10), (0.2, 10, 2), (0.01, 100, 1), (0.25, 10, 3),
                                                 (0.0, 10, 0), (1.0, 7, 7)])
def test_fixed_fraction_selects_round_of_fraction_times_k(fraction, k, expected):
    a = attack("sign-inversion", fraction)
    for r in (1, 2, 3):
        assert a.select(round_ctx(k, 5, r=r)).sum() == expected


def test_selection_is_reproducible_and_changes_with_the_round():
    a, b = attack("sign-inversion", 0.3), attack("sign-inversion", 0.3)
    s1 = [a.select(round_ctx(50, 5, r=r, seed=7)) for r in range(1, 6)]
    s2 = [b.select(round_ctx(50, 5, r=r, seed=7)) for r in range(1, 6)]
    assert all(np.array_equal(x, y) for x, y in zip(s1, s2))
    assert not all(np.array_equal(s1[0], x) for x in s1[1:])


def test_bernoulli_selection_has_the_binomial_law():
    a = attack("sign-inversion", 0.3, mode="bernoulli")
    counts = [int(a.select(round_ctx(40, 5, r=r)).sum()) for r in range(1, 401)]
    # chi-square goodness of fit of the counts against Binomial(40, 0.3), pooled tails
    edges = [0, 8, 10, 12, 14, 16, 41]
    observed = np.histogram(counts, bins=edges)[0]
    cdf = stats.binom(40, 0.3).cdf
    expected = np.diff([0.0] + [cdf(e - 1) for e in edges[1:-1]] + [1.0]) * len(counts)
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_persistent_attackers_are_fixed_clients():
    a = attack("sign-inversion", 0.25, persistent=True)
    n = 40
    bad_clients = a.malicious_clients(n, round_ctx(1, 1).seeds)
    assert bad_clients.sum() == 10
    for r in range(1, 6):
        cohort = np.sort(np.random.default_rng(r).choice(n, 12, replace=False))
        sel = a.select(round_ctx(12, 5, r=r, n_clients=n, cohort=cohort))
        assert np.array_equal(sel, bad_clients[cohort])


# ---- what malicious rows send ------------------------------------------------------


def test_random_update_is_gaussian_with_sigma_adv_and_leaves_honest_rows():
    k, n = 6, 20000
    u = torch.randn(k, n) * 0.01
    honest = u.clone()
    a = attack("random-update", 0.5)  # σ_Adv = 200 by default
    ctx = round_ctx(k, n)
    ctx.malicious = a.select(ctx)
    out = a.tamper(u, ctx)
    bad = torch.from_numpy(ctx.malicious)
    assert torch.equal(out[~bad], honest[~bad])
    z = out[bad].numpy().astype(np.float64)
    assert stats.kstest(z.ravel()[:20000] / 200.0, "norm").pvalue > 1e-3
    assert not np.allclose(z[0], z[1])  # independent attackers, no collusion


def test_sign_inversion_and_boosting():
    k, n = 5, 30
    u = torch.randn(k, n)
    ctx = round_ctx(k, n, malicious=np.array([True, False, False, True, False]))
    inv = attack("sign-inversion", 0.4).tamper(u.clone(), ctx)
    boosted = attack("boost", 0.4, boost=7.0).tamper(u.clone(), ctx)
    both = attack("sign-inversion", 0.4, boost=3.0).tamper(u.clone(), ctx)
    bad = torch.from_numpy(ctx.malicious)
    assert torch.equal(inv[bad], -u[bad]) and torch.equal(inv[~bad], u[~bad])
    assert torch.equal(boosted[bad], 7.0 * u[bad]) and torch.equal(boosted[~bad], u[~bad])
    assert torch.equal(both[bad], -3.0 * u[bad])


def test_sign_boost_replaces_malicious_rows_after_the_chain():
    k, n = 4, 9
    s = (torch.randint(0, 2, (k, n)) * 2 - 1).to(torch.int8)  # FL-SIGN(-DP without noise) output
    ctx = round_ctx(k, n, malicious=np.array([False, True, False, True]))
    a = attack("sign-inversion", 0.5, omit_noise=True, sign_boost=5000)
    bad = a.select(ctx)
    assert np.array_equal(ctx.omit_noise, bad) and bad.sum() == 2  # the rows DP noise steps skip
    ctx.malicious = np.array([False, True, False, True])
    out = a.after_chain(s, ctx)
    assert out.dtype == torch.int64
    assert torch.equal(out[[1, 3]], 5000 * s[[1, 3]].long()) and torch.equal(out[[0, 2]], s[[0, 2]].long())
    with pytest.raises(ConfigError, match="integer"):
        attack("sign-inversion", 0.5, sign_boost=2.5).after_chain(s, ctx)


# ---- registry errors ---------------------------------------------------------------


@pytest.mark.parametrize("name,opts,msg", [
    ("nope", {}, "unknown attack 'nope'; allowed: none, boost, gradient-ascent"),
    ("random-update", {"sigma_adv": 1}, r"unknown option\(s\) \['sigma_adv'\]; allowed: boost, persistent"),
    ("random-update", {"sigma": -1}, "sigma must be a positive number"),
    ("in-backdoor", {"source": 5}, "target"),
    ("boost", {}, "boost"),
    ("gradient-ascent", {"boost": 0}, "boost must be a positive number"),
    ("in-backdoor", {"source": 3, "target": 3}, "must differ"),
    ("sign-inversion", {"persistent": 1}, "true or false")])
def test_bad_attack_configs_are_named(name, opts, msg):
    with pytest.raises(ConfigError, match=msg):
        attack(name, 0.1, **opts)


def test_attack_section_validation_names_allowed_modes():
    with pytest.raises(ConfigError, match="mode"):
        tiny_config(attack={"name": "random-update", "fraction": 0.1, "mode": "sometimes"})


# ---- effect on tiny runs -----------------------------------------------------------


def run(cfg, scheme=None, rounds=None):
    sim = Run(cfg, None, log=lambda s: None)
    if scheme is not None:
        sim.scheme = scheme
    norms, accs = [], []
    for _ in range(rounds or cfg.federation.rounds):
        w0 = sim.w.clone()
        m = Simulator(sim).step_round()
        norms.append(float((sim.w - w0).norm()))
        accs.append(m["accuracy"])
    return sim, norms, accs


def test_random_update_ruins_fl_std_but_not_fl_sign():
    ru = {"name": "random-update", "fraction": 0.1}  # one attacker in a cohort of 10, σ_Adv = 200
    _, n_clean, a_clean = run(tiny_config(rounds=5))
    sim, n_att, a_att = run(tiny_config(rounds=5, attack=ru))
    n = sim.flat.n
    # FL-STD: the weighted mean carries 1/10 of a G(0, 200²) vector: norm ≈ 200·√n / 10
    assert all(abs(x / (200 * math.sqrt(n) / 10) - 1) < 0.1 for x in n_att)
    assert max(n_clean) < 2 and a_att[-1] < a_clean[-1] - 0.3
    _, s_clean, b_clean = run(tiny_config(rounds=5), scheme=fl_sign(0.01))
    _, s_att, b_att = run(tiny_config(rounds=5, attack=ru), scheme=fl_sign(0.01))
    # FL-SIGN: every update is γ·(±1)ⁿ whatever the attacker sends
    assert all(x == pytest.approx(0.01 * math.sqrt(n), rel=1e-5) for x in s_clean + s_att)
    assert b_att[-1] > b_clean[-1] - 0.1


def test_gradient_ascent_colluders_send_one_update_from_the_union_of_their_data():
    from dpfl.schemes.round import train_mask
    from dpfl.schemes.sampling import local_positions

    cfg = tiny_config(rounds=1, attack={"name": "gradient-ascent", "fraction": 0.3, "options": {"boost": 10.0}})
    sim = Run(cfg, None, log=lambda s: None)
    sim.setup()
    cohort, _ = sim.select(1)
    ctx = sim.context(1, cohort, len(cohort))
    ctx.malicious = sim.attack.select(ctx)
    u = Simulator(sim).client_updates(ctx)
    bad = torch.from_numpy(ctx.malicious)
    assert int(bad.sum()) == 3 and (u[bad] == u[bad][0]).all()  # colluding: one identical update
    # reference: the same local procedure, ascending, on the pooled data, boosted by η_Adv = 10
    pool = np.concatenate([sim.fed.clients[c] for c in cohort[ctx.malicious]])
    pos = local_positions(np.array([len(pool)]), 5, 10, ctx.numpy_rng("attack", "batches"))[0]
    ref = sim.trainer.train(sim.w, sim.fed.x, sim.fed.y, torch.from_numpy(pool[pos][None]), train_mask(sim.scheme.steps, ctx),
                            torch.tensor([-1.0]))
    torch.testing.assert_close(u[bad][0], 10.0 * ref[0])
    # ascent: the pooled loss goes up along the attackers' update, down along an honest one
    from dpfl.training.evaluate import evaluate

    x, y = sim.fed.x[pool], sim.fed.y[pool]

    def loss(w):
        sim.flat.load_into(sim.model, w)
        return evaluate(sim.model, x, y, "multiclass")["loss"]

    base = loss(sim.w)
    assert loss(sim.w + ref[0]) > base > loss(sim.w + u[~bad].mean(0))


def test_gradient_ascent_diverges_fl_std_and_fl_sign_still_learns():
    ga = {"name": "gradient-ascent", "fraction": 0.2, "options": {"boost": 10.0}}
    _, _, a_std = run(tiny_config(rounds=5, attack=ga))
    _, _, a_clean = run(tiny_config(rounds=5))
    _, _, a_sign = run(tiny_config(rounds=5, attack=ga), scheme=fl_sign(0.01))
    assert a_std[-1] < 0.2 < a_clean[-1] - 0.3
    assert a_sign[-1] > 0.3


def test_runs_with_an_attack_are_reproducible():
    cfg = tiny_config(rounds=2, attack={"name": "random-update", "fraction": 0.2, "mode": "bernoulli"})
    s1, _, _ = run(cfg)
    s2, _, _ = run(cfg)
    assert torch.equal(s1.w, s2.w)


def test_boosted_signs_cannot_pass_fl_sign_one_bit_transport():
    from dpfl.compression.bits import SignCodec
    from dpfl.schemes.aggregators import SumAggregator, build_aggregator
    from dpfl.schemes.transport import PlainTransport

    k, n = 5, 64
    s = (torch.randint(0, 2, (k, n), generator=torch.Generator().manual_seed(3)) * 2 - 1).to(torch.int8)
    ctx = round_ctx(k, n, malicious=np.array([True, False, False, False, False]))
    boosted = attack("sign-inversion", 0.2, sign_boost=5000).after_chain(s, ctx)
    one_bit = PlainTransport(SignCodec())
    # the 1-bit wire format carries only the sign: the boost is lost on the way (thesis ch. 6)
    assert torch.equal(one_bit.transmit(boosted, ctx).total, one_bit.transmit(s, ctx).total)
    # a transport that carries the values: the attacker decides the plain vote, sign-vote rejects it
    rec = PlainTransport().transmit(boosted.float(), ctx)
    assert torch.equal(SumAggregator()(rec, ctx).sign(), s[0].float())
    assert torch.equal(build_aggregator("sign-vote", {})(rec, ctx), s[1:].sum(0).float())


def test_omitted_noise_and_boosted_signs_take_over_fl_sign_dp_but_not_fl_sign():
    """Thesis §6.3 at one round: the attacker's noiseless η_Adv·sign row rides through the secure
    sum of FL-SIGN-DP and decides the vote; FL-SIGN's 1-bit transport leaves it a single vote."""
    from dpfl.compression.bits import SignCodec
    from dpfl.schemes.aggregators import SumAggregator
    from dpfl.schemes.dp import DiscreteGaussianShareStep
    from dpfl.schemes.secure_sum import SecureSum
    from dpfl.schemes.sign import SignStep
    from dpfl.schemes.transport import PlainTransport

    k, n = 10, 2000
    u = torch.randn(k, n, generator=torch.Generator().manual_seed(5))
    a = attack("sign-inversion", 0.1, omit_noise=True, sign_boost=400)  # 13-bit ring: |value| ≤ 409
    ctx = round_ctx(k, n)
    ctx.malicious = a.select(ctx)
    bad = int(np.flatnonzero(ctx.malicious)[0])
    sent = torch.where(a.tamper(u.clone(), ctx)[bad] > 0, 1.0, -1.0)  # the attacker's (inverted) signs

    def agreement(steps, transport):
        x = a.tamper(u.clone(), ctx)
        for s in steps:
            x = s.client(x, ctx)
        rec = transport.transmit(a.after_chain(x, ctx), ctx)
        delta = steps[0].server(SumAggregator()(rec, ctx), ctx)
        return float((delta.sign() == sent).double().mean())

    share = DiscreteGaussianShareStep(sigma=1.0, q=0.1)
    dp = agreement([SignStep(0.01), share], SecureSum(share))
    assert ctx.metrics["dp_noise_shares"] == k - 1  # the attacker added no share
    plain = agreement([SignStep(0.01)], PlainTransport(SignCodec()))
    assert dp > 0.99 and plain < 0.75


def test_boosted_share_rows_keep_their_int32_width_and_sum_as_int64_rows_do():
    """FL-SIGN-DP's share rows are int32: the boosted rows are written in place when ±η_Adv fits, and
    the secure sum of them is the sum of the same values widened to int64 (the former path)."""
    from dpfl.compression.bits import random_sign
    from dpfl.schemes.dp import DiscreteGaussianShareStep
    from dpfl.schemes.secure_sum import SecureSum
    from dpfl.schemes.sign import SignStep

    k, n = 10, 2000
    u = torch.randn(k, n, generator=torch.Generator().manual_seed(7))
    a = attack("sign-inversion", 0.2, omit_noise=True, sign_boost=400)  # 13-bit ring: |value| ≤ 409
    ctx = round_ctx(k, n)
    ctx.malicious = a.select(ctx)
    share = DiscreteGaussianShareStep(sigma=1.0, q=0.1)
    x = share.client(SignStep(0.01).client(a.tamper(u.clone(), ctx), ctx), ctx)
    assert x.dtype == torch.int32 and (x == 0).any()  # zeros: the attackers' random signs are drawn too
    bad = torch.from_numpy(ctx.malicious)
    wide = x.to(torch.int64)
    wide[bad] = torch.from_numpy(random_sign(x[bad].numpy(), ctx.numpy_rng("attack", "sign-zeros"))).long() * 400
    out = a.after_chain(x, ctx)
    assert out.dtype == torch.int32 and out.data_ptr() == x.data_ptr() and torch.equal(out.long(), wide)
    t = SecureSum(share)
    assert torch.equal(t.transmit(out.clone(), ctx).total, t.transmit(wide.clone(), ctx).total)
    big = attack("sign-inversion", 0.2, sign_boost=2**40).after_chain(x.clone(), ctx)  # does not fit int32
    assert big.dtype == torch.int64 and int(big[bad].abs().min()) == 2**40


def test_in_backdoor_against_fl_sign_dp_end_to_end():
    att = {"name": "in-backdoor", "fraction": 0.1,
           "options": {"source": 5, "target": 7, "omit_noise": True, "sign_boost": 100}}
    cfg = tiny_config(attack=att, rounds=8, privacy={"sampling_assumption": "poisson"})  # as the thesis
    cfg.scheme.name, cfg.scheme.options = "fl-sign-dp", {"gamma": 0.01, "sigma": 1.0}
    sim = Run(cfg, None, log=lambda s: None)
    ms = [Simulator(sim).step_round() for _ in range(8)]
    assert all(m["step_dp_noise_shares"] == 9 for m in ms)
    assert all(m["source_accuracy"] == 0 for m in ms)  # thesis Tables 6.9 / 6.10: 0 on the source class
    assert ms[-1]["attack_success"] > 0.7 and ms[-1]["accuracy"] > 0.3


def test_an_overflowing_ascent_sends_its_last_finite_iterate_and_is_not_dropped():
    """With a huge step the attackers' ascent overflows; they then send the update of the last
    finite step (a NaN row would be dropped as a diverged client and the attack silently disarmed)."""
    from dpfl.schemes.round import train_mask
    from dpfl.schemes.sampling import local_positions

    ga = {"name": "gradient-ascent", "fraction": 0.3, "options": {"boost": 10.0}}
    cfg = tiny_config(rounds=1, lr=1e18, attack=ga)
    sim = Run(cfg, None, log=lambda s: None)
    sim.setup()
    cohort, _ = sim.select(1)
    ctx = sim.context(1, cohort, len(cohort))
    ctx.malicious = sim.attack.select(ctx)
    pool = np.concatenate([sim.fed.clients[c] for c in cohort[ctx.malicious]])
    pos = local_positions(np.array([len(pool)]), 5, 10, ctx.numpy_rng("attack", "batches"))[0]
    batches, mask, asc = torch.from_numpy(pool[pos][None]), train_mask(sim.scheme.steps, ctx), torch.tensor([-1.0])
    assert not torch.isfinite(sim.trainer.train(sim.w, sim.fed.x, sim.fed.y, batches, mask, asc)).all()
    total, steps = torch.zeros_like(sim.w), 0  # reference: step by step while the model stays finite
    for t in range(5):
        step = sim.trainer.train(sim.w + total, sim.fed.x, sim.fed.y, batches[:, t : t + 1], mask, asc)[0]
        if not torch.isfinite(total + step).all():
            break
        total, steps = total + step, steps + 1
    assert 1 <= steps < 5 and total.abs().max() > 0
    u = Simulator(sim).client_updates(ctx)
    bad = torch.from_numpy(ctx.malicious)
    assert torch.isfinite(u[bad]).all()
    torch.testing.assert_close(u[bad][0], 10.0 * total)  # finite: the divergence filter keeps it
