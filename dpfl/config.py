"""Run configuration (TOML), validated with pydantic. Errors name the bad key and allowed values."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpfl.errors import ConfigError


def _non_finite(v: Any, path: str = "") -> str | None:
    """The first non-finite float inside `v` (nested dicts/lists), as `path = value`."""
    if isinstance(v, float) and not math.isfinite(v):
        return f"{path or 'value'} = {v}"
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) else ()
    for k, x in items:
        bad = _non_finite(x, f"{path}.{k}" if path else str(k))
        if bad:
            return bad
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _finite(cls, v: Any) -> Any:  # typed floats: allow_inf_nan; free-form options: here
        bad = None if isinstance(v, BaseModel) else _non_finite(v)
        if bad:
            raise ValueError(f"{bad}: numbers must be finite")
        return v


class DataConfig(_Strict):
    dataset: str = "default"  # fashion-mnist | mnist | digits | default | medical-synthetic | ...
    root: str | None = None  # directory with the dataset files (auto-discovered when None)
    options: dict[str, Any] = Field(default_factory=dict)  # passed to load_dataset (n_train, scale, size...)
    n_clients: int = Field(6000, ge=1)  # N
    partition: str = "shards"  # shards | dirichlet | classes | quantity | natural
    partition_options: dict[str, Any] = Field(default_factory=dict)  # alpha, classes_per_client, size...
    downsample_majority: bool = False  # per-client majority down-sampling (binary tasks)
    public_size: int = Field(0, ge=0)  # server-side public batch taken from the test set when the dataset has none


class ModelConfig(_Strict):
    name: str = "cnn"
    options: dict[str, Any] = Field(default_factory=dict)


class DPSGDTrainConfig(_Strict):
    """Record-level DP: every client's local training is DP-SGD on its own records.

    Each local step samples each of client k's n_k records independently with probability
    q_k = min(1, batch_size / n_k) (Poisson; the batch size varies, its mean is train.batch_size),
    clips every example's gradient to `clip`, adds N(0, σ²·clip²) to the sum and divides by
    the expected batch size q_k·n_k. Accounting: RDP of the Poisson-subsampled Gaussian per client."""

    clip: float = Field(1.0, gt=0)  # per-example clipping norm C
    noise_multiplier: float | None = Field(None, gt=0)  # σ; calibrated from target_epsilon when None
    target_epsilon: float | None = Field(None, gt=0)  # record-level ε no client may exceed: the run stops before
    delta: float = Field(1e-5, gt=0, lt=1)  # record-level δ
    sampling: Literal["poisson"] = "poisson"

    @model_validator(mode="after")
    def _noise(self):
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("give train.dpsgd.noise_multiplier or train.dpsgd.target_epsilon (or both)")
        return self


class TrainConfig(_Strict):
    steps: int = Field(5, ge=1)  # T_gd
    batch_size: int = Field(10, ge=1)  # |B|
    lr: float = Field(0.215, gt=0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    prox_mu: float = Field(0.0, ge=0)
    dpsgd: DPSGDTrainConfig | None = None  # record-level DP-SGD in every client (see DPSGDTrainConfig)


class FederationConfig(_Strict):
    rounds: int = Field(200, ge=1)  # T_cl
    sampling: Literal["fixed", "poisson"] = "fixed"
    fraction: float | None = Field(None, gt=0, le=1)  # C
    clients_per_round: int | None = Field(None, ge=1)  # |K| (alternative to fraction)
    dropout: float = Field(0.0, ge=0, lt=1)  # selected clients that never answer
    # which rounds one client may take part in (dpfl.privacy.participation), what correlated noise is accounted
    # on: "any" (no bound), "cyclic" (`groups` groups take turns), "min-separation" (rounds ≥ `separation` apart)
    participation: Literal["any", "cyclic", "min-separation"] = "any"
    groups: int | None = Field(None, ge=1)  # cyclic: b
    separation: int | None = Field(None, ge=1)  # min-separation: b

    @model_validator(mode="after")
    def _one_of(self):
        if self.fraction is not None and self.clients_per_round is not None:
            raise ValueError("give federation.fraction or federation.clients_per_round, not both")
        for key, schema in (("groups", "cyclic"), ("separation", "min-separation")):
            if getattr(self, key) is None and self.participation == schema:
                raise ValueError(f"federation.participation = {schema!r} needs federation.{key}")
            if getattr(self, key) is not None and self.participation != schema:
                raise ValueError(f"federation.{key} applies only to participation = {schema!r} "
                                 f"(got {self.participation!r})")
        if self.participation != "any" and self.sampling == "poisson":
            raise ValueError(f"federation.participation = {self.participation!r} draws a fixed cohort within its "
                             "schema: use federation.sampling = 'fixed'")
        return self


class SchemeConfig(_Strict):
    name: str = "fl-std"
    options: dict[str, Any] = Field(default_factory=dict)
    aggregator: str | None = None  # replace the scheme's aggregator (robust rules: median, krum, ...)
    aggregator_options: dict[str, Any] = Field(default_factory=dict)


class AttackConfig(_Strict):
    name: str = "none"  # random-update | gradient-ascent | sign-inversion | in-backdoor | out-backdoor | ...
    fraction: float = Field(0.0, ge=0, le=1)  # share of each round's cohort that is malicious
    mode: Literal["fixed", "bernoulli"] = "fixed"
    options: dict[str, Any] = Field(default_factory=dict)


class PrivacyConfig(_Strict):
    accountant: Literal["moments", "rdp", "pld"] = "rdp"
    delta: float = Field(1e-5, gt=0, lt=1)
    target_epsilon: float | None = Field(None, gt=0)  # stop before exceeding
    # how epsilon accounts a fixed-size cohort: "without-replacement" (the sampling done; replace-one
    # neighbours) or "poisson" (q = |K|/N, add/remove neighbours: the thesis's assumption, stated).
    # Unset: the sampling done (see RunConfig.accounted_sampling).
    sampling_assumption: Literal["poisson", "without-replacement"] | None = None


class EvalConfig(_Strict):
    every: int = Field(1, ge=1)
    batch_size: int = Field(1000, ge=1)
    # best-round metric; default accuracy (balanced_accuracy for binary); the others exist for binary tasks only
    metric: Literal["accuracy", "balanced_accuracy", "auroc"] | None = None


# run settings a resume may take from the resuming process: how fast, where and how often, not what
RESUME_RESOURCES = ("threads", "device", "max_cohort", "checkpoint_every")


class RunSection(_Strict):
    checkpoint_every: int = Field(10, ge=1)
    device: str = "cpu"
    engine: Literal["vectorized", "sequential"] = "vectorized"
    # train cohorts larger than this in pieces (memory); a scheme that streams (signSGD) also signs and sends
    # piece by piece, so no [k, n] tensor of the whole cohort is held; 0 = no limit
    max_cohort: int = Field(0, ge=0)
    threads: int = Field(0, ge=0)  # torch threads; 0 = torch default

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("cpu", "cuda") and not v.startswith("cuda:"):
            raise ValueError("device must be 'cpu', 'cuda' or 'cuda:N'")
        return v


class RunConfig(_Strict):
    name: str = "run"
    seed: int = 0
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    federation: FederationConfig = Field(default_factory=FederationConfig)
    scheme: SchemeConfig = Field(default_factory=SchemeConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    attack: AttackConfig | None = None
    eval: EvalConfig = Field(default_factory=EvalConfig)
    run: RunSection = Field(default_factory=RunSection)

    @model_validator(mode="after")
    def _sampling_matches(self):
        if self.federation.sampling == "poisson" and self.privacy.sampling_assumption == "without-replacement":
            raise ValueError("privacy.sampling_assumption = 'without-replacement' but federation.sampling = "
                             "'poisson' draws each client independently: use 'poisson' or leave it unset")
        if self.privacy.sampling_assumption is not None and (
                self.federation.participation != "any" or self.scheme.options.get("correlated") is not None):
            raise ValueError("privacy.sampling_assumption does not apply: correlated noise and participation "
                             "schemas are accounted on how often a client takes part, not on sampling")
        fed = self.federation
        if fed.participation != "any":
            from dpfl.errors import PrivacyError
            from dpfl.privacy.participation import check_selection

            try:
                check_selection(*self.participation(), self.data.n_clients, self.cohort_size())
            except PrivacyError as e:
                raise ValueError(f"federation.participation: {e}") from None
        return self

    def participation(self) -> tuple[str, int]:
        """(schema, separation b): how often one client may take part (dpfl.privacy.participation)."""
        fed = self.federation
        if fed.participation == "cyclic":
            return "cyclic", fed.groups
        if fed.participation == "min-separation":
            return "min-separation", fed.separation
        return "any", 1

    def accounted_sampling(self) -> str:
        """How epsilon accounts client selection: "poisson", "without-replacement", or "none" (a fixed
        cohort of every client: nothing is sampled)."""
        if self.federation.sampling == "poisson":
            return "poisson"
        if self.privacy.sampling_assumption is not None:
            return self.privacy.sampling_assumption
        return "none" if self.cohort_size() == self.data.n_clients else "without-replacement"

    def cohort_size(self) -> int:
        fed = self.federation
        if fed.clients_per_round is not None:
            k = fed.clients_per_round
        elif fed.fraction is not None:
            k = round(fed.fraction * self.data.n_clients)
        else:
            k = self.data.n_clients
        if k > self.data.n_clients:
            raise ConfigError(f"federation.clients_per_round = {k} exceeds data.n_clients = {self.data.n_clients}")
        return max(1, k)

    def sampling_rate(self) -> float:
        return self.cohort_size() / self.data.n_clients


def _format_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            parent = _section_for(e["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else ""
            msg = f"unknown key; allowed keys here: {allowed}"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"{loc}: {msg}")
    return f"invalid configuration in {source}: " + "; ".join(lines)


def _section_for(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def parse_value(text: str) -> Any:
    """A --set value: TOML scalar/array/inline table if it parses, else a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p!r} is not a section")
        node[parts[-1]] = parse_value(value.strip())
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None) -> RunConfig:
    """Read a TOML file (or a dict), apply `key.path=value` overrides, validate."""
    source = str(path) if path else "(defaults)"
    raw: dict = dict(data or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
    raw = apply_overrides(raw, overrides or [])
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(e, source)) from None


def dump_config(cfg: RunConfig) -> str:
    import tomli_w

    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
