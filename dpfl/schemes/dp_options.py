"""The options of a client-level DP scheme: one typed model, checked once (see docs/dp-schemes.md).

`DPOptions` holds what `[scheme.options]` may say about privacy — σ or a target ε, the clip
bound S, noise placement, failure tolerance l, secure aggregation — and the run's facts σ
depends on (accountant, δ, client sampling, q, T, N, |K|, n). `register_dp` registers a builder
`fn(dp: DPOptions, **own options)`: the registry then offers its own options plus these, and a
bad value is one `ConfigError` line.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dpfl.errors import ConfigError
from dpfl.privacy.ledger import SUPPORTED_SAMPLINGS
from dpfl.schemes.registry import register

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class DPOptions(BaseModel):
    """Client-level DP options of one scheme. The `description` of a user option says what it must be."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # ---- [scheme.options] keys
    sigma: Positive | None = Field(None, description="a finite number > 0 (noise multiplier σ)")
    epsilon: Positive | None = Field(None, description="a finite number > 0 (target ε)")
    clip: Positive | Literal["auto", "private", "adaptive"] = Field(
        "auto", description="a number > 0, 'auto', 'private' or 'adaptive'")
    tolerate: int = Field(0, ge=0, description="an integer ≥ 0 (l, client failures the noise covers)")
    noise: Literal["distributed", "central", "local"] = Field(
        "distributed", description="one of 'distributed', 'central', 'local' (noise placement)")
    secure_aggregation: bool | None = Field(None, description="true or false")
    neighbours: int | None = Field(None, description="an integer (SecAgg+ graph degree) or omitted")
    threshold: int | None = Field(None, description="an integer (Shamir threshold t) or omitted")
    drop_after_masking: float = Field(0.0, description="a fraction in [0, 1)")
    frac_bits: int | None = Field(None, ge=0, le=52, description="an integer in [0, 52] or omitted (automatic)")
    clip_clients: int | None = Field(None, ge=1, description="an integer ≥ 1 or omitted (all N)")
    clip_epsilon: Positive = Field(0.1, description="a finite number > 0 (ε₀ of clip = 'private')")
    # clip = "adaptive" (Andrew et al., NeurIPS 2021); None: the paper's default (see ADAPTIVE_DEFAULTS)
    clip_quantile: float | None = Field(None, gt=0, le=1, allow_inf_nan=False,
                                        description="a fraction in (0, 1] (target quantile γ of clip = 'adaptive')")
    clip_lr: Positive | None = Field(None, description="a finite number > 0 (learning rate η_C of clip = 'adaptive')")
    clip_init: Positive | None = Field(None, description="a finite number > 0 (initial bound C₀ of clip = 'adaptive')")
    clip_count_sigma: Positive | None = Field(
        None, description="a finite number > 0 (σ_b, std of the noise on the count of clip = 'adaptive')")
    # correlated noise (DP-FTRL's tree aggregation, BandMF; dpfl.privacy.factorization), accounted on the
    # federation's participation schema; the keys after it apply to one of the two (CORRELATED_KEYS)
    correlated: Literal["tree", "bandmf"] | None = Field(
        None, description="'tree' or 'bandmf' (correlated noise across rounds) or omitted (independent noise)")
    bands: int | None = Field(None, ge=1, description="an integer ≥ 1 (BandMF's bands b; default: the "
                                                      "participation's separation)")
    restart: int | None = Field(None, ge=1, description="an integer ≥ 1 (rounds per tree; default: one tree)")
    completion: bool | None = Field(None, description="true or false (tree completion at each restart; "
                                                      "default true)")
    workload_momentum: float | None = Field(
        None, ge=0, lt=1, allow_inf_nan=False,
        description="a number in [0, 1) (BandMF optimised for server momentum β; default: prefix sums)")

    # ---- the scheme and the run (not [scheme.options])
    name: str = "dp"  # the DP scheme's name
    mechanism: Literal["gaussian", "discrete"] = "gaussian"  # discrete: FL-SIGN-DP's DG on integer rows
    accountant: Literal["rdp", "pld", "moments"]
    delta: float = Field(gt=0, lt=1, strict=False)
    sampling: Literal["poisson", "without-replacement", "none"] = "poisson"
    sampling_rate: float = Field(gt=0, le=1, strict=False)  # q
    rounds: int = Field(ge=1, strict=False)  # T
    cohort_size: int = Field(ge=1, strict=False)  # |K|
    n_clients: int | None = Field(None, strict=False)  # N
    n_params: int = Field(ge=1, strict=False)  # n
    participation: tuple[str, int] | None = None  # (schema, separation b): RunConfig.participation()
    dropout: float = Field(0.0, strict=False)  # federation.dropout

    @model_validator(mode="after")
    def _consistent(self) -> DPOptions:
        if (self.sigma is None) == (self.epsilon is None):
            raise ValueError("give exactly one of sigma (noise multiplier) or epsilon (target ε)")
        if self.tolerate and self.tolerate >= self.cohort_size:
            raise ValueError(f"tolerate = {self.tolerate} must be < the cohort size |K| = {self.cohort_size}")
        if self.tolerate and self.noise != "distributed":
            raise ValueError(f"tolerate = {self.tolerate} only applies to distributed noise "
                             f"(got noise = {self.noise!r})")
        _check_correlated(self)  # first: a participation schema is not sampling
        if self.mechanism == "discrete":
            if self.accountant == "pld":
                raise ValueError("FL-SIGN-DP's discrete Gaussian event (thesis Thm 3) bounds log-moments: use "
                                 "privacy.accountant = 'rdp' or 'moments', not 'pld'")
            if self.accounted_sampling == "without-replacement":
                raise ValueError(
                    "FL-SIGN-DP's discrete Gaussian bound (thesis Thm 3) is for Poisson sampling; this run draws "
                    "a fixed-size cohort: state privacy.sampling_assumption = 'poisson' (the thesis's assumption) "
                    "or use federation.sampling = 'poisson'")
        if self.accounted_sampling not in SUPPORTED_SAMPLINGS[self.accountant] + ("none",):
            raise ValueError(
                f"privacy.accountant = {self.accountant!r} cannot account the fixed-size cohort as sampling without "
                "replacement (dp-accounting has no such PLD); use privacy.accountant = 'rdp' or 'moments', or "
                "state privacy.sampling_assumption = 'poisson' (ε then assumes Poisson sampling)")
        if self.accounted_sampling == "without-replacement" and self.n_clients is None:
            raise ValueError("sampling without replacement needs n_clients (N)")
        given = [k for k in ADAPTIVE_DEFAULTS if getattr(self, k) is not None]
        if given and self.clip != "adaptive":
            raise ValueError(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to clip = 'adaptive' "
                             f"(got clip = {self.clip!r})")
        if self.secure:
            return self
        if self.drop_after_masking:
            raise ValueError("drop_after_masking needs distributed noise with secure aggregation")
        if self.noise != "distributed" and self.secure_aggregation:
            raise ValueError(f"noise = {self.noise!r} sends rows in plain: secure_aggregation must be false "
                             "(secure aggregation goes with distributed noise)")
        set_opts = [k for k in ("neighbours", "threshold", "frac_bits") if getattr(self, k) is not None]
        if set_opts:
            raise ValueError(f"options {set_opts} only apply to secure aggregation (noise = 'distributed')")
        return self

    @property
    def secure(self) -> bool:
        """Secure aggregation: by default exactly for distributed noise."""
        on = self.noise == "distributed" if self.secure_aggregation is None else self.secure_aggregation
        return on and self.noise == "distributed"

    @property
    def accounted_sampling(self) -> str:
        """How the events account client selection; local and correlated noise: none (no amplification by
        sampling; correlated noise is accounted on the participation schema)."""
        return "none" if self.noise == "local" or self.correlated else self.sampling

    @property
    def without_replacement(self) -> tuple[int, int] | None:
        """(N, |K|) when a fixed-size cohort is accounted as drawn, else None."""
        return (self.n_clients, self.cohort_size) if self.accounted_sampling == "without-replacement" else None

    def adaptive(self, key: str) -> float:
        """An option of clip = "adaptive", or the paper's default (clip_count_sigma: |K|/20)."""
        v = getattr(self, key)
        if v is not None:
            return float(v)
        return 0.05 * self.cohort_size if key == "clip_count_sigma" else ADAPTIVE_DEFAULTS[key]

    @property
    def neighbouring(self) -> str:
        return "replace_one" if self.without_replacement else "add_remove"

    @classmethod
    def parse(cls, options: dict[str, Any], **facts: Any) -> DPOptions:
        """Validate `options` with the scheme's and run's `facts`; a bad value is one ConfigError line."""
        try:
            return cls.model_validate({**options, **facts})
        except ValidationError as e:
            raise ConfigError(f"scheme {facts.get('name', 'dp')!r}: {_one_line(e)}") from None


# the options of one correlated mechanism: key -> the `correlated` it applies to
CORRELATED_KEYS: dict[str, str] = {"bands": "bandmf", "restart": "tree", "completion": "tree",
                                   "workload_momentum": "bandmf"}


def _check_correlated(o: DPOptions) -> None:
    """ValueError (one line) where correlated noise, its options or the participation schema do not fit."""
    wrong = [k for k, m in CORRELATED_KEYS.items() if getattr(o, k) is not None and o.correlated != m]
    if wrong:
        raise ValueError("; ".join(f"{k} applies only to correlated = {CORRELATED_KEYS[k]!r}" for k in wrong)
                         + f" (got correlated = {o.correlated!r})")
    part = o.participation
    if o.correlated is None:
        if part is not None and part[0] != "any":
            raise ValueError(f"federation.participation = {part[0]!r} is accounted only with correlated noise "
                             "(correlated = 'tree' or 'bandmf'; 'bandmf' with bands = 1 is independent noise under "
                             "this schema): the sampling accountants assume uniformly drawn cohorts")
        return
    if part is None:
        raise ValueError("correlated noise is accounted on the run's participation schema, which this builder "
                         "was not given (a deployed node is not yet): run it in the simulator")
    if o.noise == "local":
        raise ValueError("correlated noise is 'central' (a trusted server adds it) or 'distributed' (shares in the "
                         "secure sum, every client in every round), not 'local'")
    if o.clip == "adaptive":
        raise ValueError("clip = 'adaptive' does not combine with correlated noise (its count's noise is not "
                         "correlated): give clip a number, 'auto' or 'private'")
    schema, sep = part
    if o.correlated == "bandmf":
        if o.bands is None and schema == "any":
            raise ValueError("correlated = 'bandmf' needs a client's rounds at least b apart: set "
                             "federation.participation = 'cyclic' (groups = b) or 'min-separation' (separation = "
                             "b), or bands = 1 (independent noise) where a client may take part in every round")
        if (o.bands or 1) > sep:
            raise ValueError(f"bands = {o.bands} needs a client's rounds ≥ {o.bands} apart, but "
                             f"federation.participation = {schema!r} allows {sep}: raise its groups or separation "
                             f"to ≥ {o.bands}, or lower bands")
        if (o.bands or 1) > o.rounds:
            raise ValueError(f"bands = {o.bands} exceeds federation.rounds = {o.rounds}")
    if o.noise == "distributed" and (o.sampling != "none" or o.dropout or o.tolerate or o.drop_after_masking):
        raise ValueError("correlated noise with noise = 'distributed' needs the same clients in every round's sum "
                         "(a fixed cohort of all N clients, federation.dropout = 0, tolerate = 0, no "
                         "drop_after_masking): a client's share of round t continues its own earlier shares, which "
                         "no other client holds; use noise = 'central' (a trusted server adds the noise)")


# Andrew et al. (NeurIPS 2021) and TFF's `gaussian_adaptive`: γ = 0.5, η_C = 0.2, C₀ = 0.1, σ_b = 0.05·|K|
ADAPTIVE_DEFAULTS: dict[str, float] = {"clip_quantile": 0.5, "clip_lr": 0.2, "clip_init": 0.1,
                                       "clip_count_sigma": math.nan}  # (σ_b: |K|/20, see DPOptions.adaptive)
USER_OPTIONS = tuple(k for k in DPOptions.model_fields if DPOptions.model_fields[k].description)
# FL-SIGN-DP's sensitivity is √n: no clip bound to give, select or adapt
GAUSSIAN_ONLY = ("clip", "clip_clients", "clip_epsilon", "frac_bits", *ADAPTIVE_DEFAULTS, "correlated",
                 *CORRELATED_KEYS)


def _one_line(err: ValidationError) -> str:
    """The validation errors as one line: '<option> must be <what>, got <value>' per option."""
    out: dict[str, str] = {}
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        info = DPOptions.model_fields.get(field)
        if e["type"] == "value_error":
            out[field] = str(e["ctx"]["error"])
        elif e["type"] == "extra_forbidden":
            out[field] = f"unknown option {field!r}; allowed: {', '.join(USER_OPTIONS)}"
        elif info is not None and info.description:
            out[field] = f"{field} must be {info.description}, got {e['input']!r}"
        else:
            out.setdefault(field, f"{field}: {e['msg']}, got {e['input']!r}")
    return "; ".join(out.values())


_ENV = ("n_params", "cohort_size", "n_clients", "sampling", "sampling_rate", "rounds", "privacy")
_ENV_DEFAULTS = {"n_clients": None, "sampling": "poisson"}
# run facts read from the whole env (never offered as options): correlated noise's participation schema
_FROM_ENV = {"participation": None, "dropout": 0.0}
_KW = inspect.Parameter.KEYWORD_ONLY
_EMPTY = inspect.Parameter.empty


def register_dp(name: str, mechanism: str = "gaussian", **defaults: Any) -> Callable[[Callable], Callable]:
    """Register `fn(dp: DPOptions, **own)` as scheme `name`. Its options: `fn`'s own, then the
    DP options (not clip, clip_clients, clip_epsilon, frac_bits for the discrete mechanism), with
    `defaults` replacing DPOptions's defaults. The run's facts come from the engine's env."""
    dp_keys = [k for k in USER_OPTIONS if mechanism == "gaussian" or k not in GAUSSIAN_ONLY]

    def deco(fn: Callable) -> Callable:
        own = [p.replace(kind=_KW) for p in list(inspect.signature(fn).parameters.values())[1:]]
        env = [inspect.Parameter(k, _KW, default=_ENV_DEFAULTS.get(k, _EMPTY)) for k in _ENV]
        dps = [inspect.Parameter(k, _KW, default=defaults.get(k, DPOptions.model_fields[k].default)) for k in dp_keys]
        whole = inspect.Parameter("env", _KW, default=None)  # the registry passes its env dict here
        sig = inspect.Signature([*env, whole, *own, *dps])  # what the registry offers

        @functools.wraps(fn)
        def build(**given: Any):
            bound = sig.bind(**given)
            bound.apply_defaults()
            kw = dict(bound.arguments)
            facts = {k: kw.pop(k) for k in _ENV}
            run = kw.pop("env") or {}
            facts.update({k: run.get(k, d) for k, d in _FROM_ENV.items()})
            privacy = facts.pop("privacy")
            mine = {p.name: kw.pop(p.name) for p in own}
            dp = DPOptions.parse(kw, name=name, mechanism=mechanism, accountant=privacy.accountant,
                                 delta=privacy.delta, **facts)
            return fn(dp, **mine)

        build.__signature__ = sig
        if mechanism != "gaussian":
            build.refused_options = {k: (
                f"option {k!r} does not apply: its discrete Gaussian mechanism on sign vectors has sensitivity √n, "
                "not a clip bound S: nothing to give, select or adapt (no clip = 'adaptive')") for k in GAUSSIAN_ONLY
                if k != "frac_bits" and k != "correlated" and k not in CORRELATED_KEYS}
            build.refused_options.update({k: (
                f"option {k!r} does not apply: its discrete Gaussian shares have no correlated-noise version "
                "(correlated noise is for the Gaussian schemes)") for k in ("correlated", *CORRELATED_KEYS)})
        return register(name)(build)

    return deco
