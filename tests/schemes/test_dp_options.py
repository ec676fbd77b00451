"""DP as a wrapper: one options model (DPOptions), one wrapper (make_private), σ resolved once."""

import math

import pytest
import torch

from dpfl.config import PrivacyConfig
from dpfl.errors import ConfigError
from dpfl.privacy import DiscreteGaussianEvent, calibrate_sigma_for_events, sampler_tv_bound
from dpfl.schemes.catalog import fl_rnd, fl_sign
from dpfl.schemes.dp import GaussianNoiseStep
from dpfl.schemes.dp_options import DPOptions
from dpfl.schemes.dp_wrapper import make_private
from dpfl.schemes.registry import build_scheme, fl_std

N = 5000
FACTS = {"accountant": "rdp", "delta": 1e-5, "sampling": "poisson", "sampling_rate": 0.1, "rounds": 20,
         "cohort_size": 10, "n_clients": 100, "n_params": N}


def _env(accountant="rdp", sampling="poisson"):
    return {"n_params": N, "cohort_size": 10, "n_clients": 100, "sampling": sampling, "sampling_rate": 0.1,
            "rounds": 20, "privacy": PrivacyConfig(accountant=accountant, delta=1e-5), "seed": 0}


def _dp(**opts):
    return DPOptions.parse(opts, **{**FACTS, "name": opts.pop("name", "fl-std-dp")})


@pytest.mark.parametrize("opts", [{}, {"sigma": 1.0, "epsilon": 2.0}])
def test_sigma_and_target_epsilon_are_exclusive(opts):
    with pytest.raises(ConfigError, match="exactly one of sigma .* or epsilon"):
        _dp(**opts)
    with pytest.raises(ConfigError, match="exactly one of sigma"):
        build_scheme("fl-std-dp", opts, _env())
    assert _dp(sigma=1.0).sigma == 1.0 and _dp(epsilon=2.0).epsilon == 2.0


@pytest.mark.parametrize("opts,words", [
    ({"sigma": -1.0}, "sigma must be a finite number > 0"),
    ({"sigma": True}, "sigma must be a finite number > 0"),
    ({"sigma": "1"}, "sigma must be a finite number > 0"),
    ({"epsilon": math.inf}, "epsilon must be a finite number > 0"),
    ({"sigma": 1.0, "clip": "median"}, "clip must be a number > 0, 'auto', 'private' or 'adaptive', got 'median'"),
    ({"sigma": 1.0, "clip": 0}, "clip must be a number > 0"),
    ({"sigma": 1.0, "tolerate": -1}, "tolerate must be an integer ≥ 0"),
    ({"sigma": 1.0, "tolerate": 10}, "tolerate = 10 must be < the cohort size |K| = 10"),
    ({"sigma": 1.0, "noise": "everywhere"}, "noise must be one of"),
    ({"sigma": 1.0, "secure_aggregation": "yes"}, "secure_aggregation must be true or false"),
    ({"sigma": 1.0, "frac_bits": 60}, "frac_bits must be an integer in [0, 52]"),
    ({"sigma": 1.0, "noise": "central", "neighbours": 4}, "only apply to secure aggregation"),
    ({"sigma": 1.0, "noise": "local", "tolerate": 1}, "only applies to distributed noise"),
])
def test_a_bad_value_is_one_config_error_line_naming_it(opts, words):
    for build in (lambda: _dp(**opts), lambda: build_scheme("fl-std-dp", opts, _env())):
        with pytest.raises(ConfigError) as e:
            build()
        msg = str(e.value)
        assert words in msg and "\n" not in msg and msg.startswith("scheme 'fl-std-dp': ")
        assert "validation error" not in msg and "pydantic" not in msg  # not pydantic's multi-line report


def test_several_bad_values_still_make_one_line():
    with pytest.raises(ConfigError) as e:
        _dp(sigma=-1.0, tolerate=-2, noise="x")
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in ("sigma must", "tolerate must", "noise must"))


def test_unknown_and_scheme_specific_options_name_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['bogus'\]; allowed: .*sigma, epsilon, clip"):
        build_scheme("fl-std-dp", {"sigma": 1.0, "bogus": 1}, _env())
    # FL-SIGN-DP's sensitivity is √n: no clip options, and the error says why
    with pytest.raises(ConfigError, match=r"option 'clip' does not apply: .* sensitivity √n, not a clip bound S"):
        build_scheme("fl-sign-dp", {"sigma": 1.0, "clip": 1.0}, _env())
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['bogus'\]; allowed: gamma, sigma, epsilon, tolerate"):
        build_scheme("fl-sign-dp", {"sigma": 1.0, "bogus": 1.0}, _env())
    # the run's facts come from the run config, not from [scheme.options]
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['accountant'\]"):
        build_scheme("fl-std-dp", {"sigma": 1.0, "accountant": "pld"}, _env())
    with pytest.raises(ConfigError, match="scheme 'fl-std-dp': unknown option 'bogus'; allowed: sigma, epsilon"):
        _dp(sigma=1.0, bogus=1)


@pytest.mark.parametrize("name,base,opts", [
    ("fl-std-dp", fl_std, {"epsilon": 2.0, "clip": 0.5}),
    ("fl-std-dp", fl_std, {"sigma": 1.3, "clip": "private", "noise": "central"}),
    ("fl-rnd-dp", lambda: fl_rnd(0.05), {"sigma": 3.0, "noise": "local", "clip_clients": 5}),
])
def test_the_wrapper_over_a_non_dp_scheme_gives_the_dp_scheme(name, base, opts):
    built = build_scheme(name, opts, _env())
    wrapped = make_private(base(), _dp(name=name, **opts))
    assert wrapped.describe() == built.describe()
    assert [type(s) for s in wrapped.steps] == [type(s) for s in built.steps]
    assert wrapped.steps[-1].sigma == built.steps[-1].sigma
    assert wrapped.privacy_sampling == built.privacy_sampling
    assert wrapped.transport.name == built.transport.name


def test_the_wrapper_over_fl_sign_gives_fl_sign_dp_with_its_discrete_calibration():
    built = build_scheme("fl-sign-dp", {"epsilon": 2.0}, _env())
    dp = DPOptions.parse({"epsilon": 2.0}, **FACTS, name="fl-sign-dp", mechanism="discrete")
    wrapped = make_private(fl_sign(0.005), dp)
    assert wrapped.describe() == built.describe()
    assert "sign(γ=0.005) → discrete_gaussian" in wrapped.describe() and wrapped.transport.name == "secure_sum"
    share = wrapped.steps[-1]

    def event(x):  # the round's event at σ = x, as the share records it for |K| = 10 clients
        return DiscreteGaussianEvent(x, 0.1, N, 10, sampler_tv=10 * N * sampler_tv_bound(math.sqrt(N) * x / math.sqrt(10)))

    assert share.sigma == calibrate_sigma_for_events(2.0, 1e-5, 0.1, 20, "rdp", event)


def test_sigma_is_resolved_once_by_the_privacy_calibration():
    s = build_scheme("fl-std-dp", {"epsilon": 2.0, "clip": 1.0}, _env()).steps[-1].sigma
    assert s == calibrate_sigma_for_events(2.0, 1e-5, 0.1, 20, "rdp")
    wor = build_scheme("fl-std-dp", {"sigma": 2.0, "clip": 1.0}, _env(sampling="without-replacement")).steps[-1]
    assert wor.without_replacement == (100, 10) and wor.sigma == 2.0


def test_fl_cs_reads_the_noise_level_from_the_rounds_context(contexts):
    """λ = "noise": the noise step leaves the std of the noise in the mean in the round's context,
    and FL-CS's threshold follows it (no attribute patched in after construction)."""
    scheme = build_scheme("fl-cs-dp", {"sigma": 2.0, "clip": 0.5, "lam": "noise", "ratio": 0.1, "chunks": 2,
                                       "noise": "central"}, _env())
    cs, _, noise = scheme.steps
    assert isinstance(noise, GaussianNoiseStep) and not hasattr(cs, "noise_std")
    sctx, rctx = contexts(N)
    for s in scheme.steps:
        s.setup(sctx)
    ctx = rctx(1, 8)
    ctx.cohort_size = 10
    agg = torch.zeros(cs.op.m)
    for s in reversed(scheme.steps):
        agg = s.server(agg, ctx)
    assert ctx.dp_noise_std == pytest.approx(0.5 * 2.0 / 10)  # S·σ/|K|, central noise
    want = cs.server_lr * math.sqrt(ctx.dp_noise_std**2 * cs.op.m / N * 2 * math.log(N))
    assert ctx.metrics["cs_lambda"] == pytest.approx(want, rel=1e-12)
