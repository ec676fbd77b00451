"""One deployed client: its own data, and the simulator's training core and client chain.

A client trains exactly as the simulator (`engine.simulator`) does for one row of its cohort (`Trainer.train` on
batches [1, T, B]), runs the scheme's client steps on that row, and encodes it for the
transport: a codec payload, or words in Z_(2^b) for the secure sum, masked by its side of
`dpfl.secagg.protocol` (`party.Party`).

Randomness. By default every stream a client draws (local batches, sign ties, DP noise,
secure-aggregation keys and seeds) is keyed from the OS (`OsSeeds`, `CryptoRNG()`), so nothing
is derivable from the public config seed. A node started with `dpfl-seeded=true` draws them
from the config seed instead, as the simulator does: runs become reproducible and comparable
with `dpfl run` bit for bit, and the noise gives no privacy at all. Tests only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpfl.config import RunConfig
from dpfl.errors import BudgetExceededError, ConfigError, DataError, ProtocolError
from dpfl.flower.certs import signing_files, site_key
from dpfl.rng import CryptoRNG, Seeds, derive_key
from dpfl.run.state import configured_scheme, first_output, hash_tensors, scheme_env
from dpfl.schemes.base import RoundContext, SetupContext, Transport
from dpfl.schemes.registry import Scheme
from dpfl.schemes.round import check_dpsgd, client_chain, local_plan, statistic_step
from dpfl.schemes.sampling import local_positions, poisson_positions
from dpfl.schemes.secure_sum import SecAggTransport
from dpfl.secagg import ring
from dpfl.secagg.graph import default_threshold
from dpfl.secagg.protocol import RoundConfig
from dpfl.training.trainer import ClientDP, LocalTraining, Trainer

DATA_MAC_DOMAIN = b"dpfl site data v2;"  # then the run's salt, then the arrays


class OsSeeds(Seeds):
    """`Seeds` for deployment: a root from the OS, and every crypto stream OS-keyed (256 bits), except
    the streams that correlated noise draws again in later rounds (DP-FTRL's tree nodes: `REDRAWN`):
    those are keyed from one 256-bit secret `key`, so that a node drawn again is the same draw (fresh
    draws would void the tree's accounting). `key`: from the OS unless given (a site derives it from
    its node secret; the server keeps it in its checkpoint)."""

    REDRAWN = ("dp-mf", "dp-mf-share")  # CorrelatedNoiseStep's paths (server, client)

    def __init__(self, key: bytes | None = None) -> None:
        super().__init__(int.from_bytes(os.urandom(8), "little") >> 1)
        self.key = os.urandom(32) if key is None else key
        if not isinstance(self.key, bytes) or len(self.key) != 32:
            raise ValueError("OsSeeds key must be 32 bytes")

    def crypto(self, *path: object) -> CryptoRNG:
        if path and path[0] in self.REDRAWN:
            return CryptoRNG(key=derive_key(self.key, "crypto", *path))
        return CryptoRNG()


def distributed_correlated(scheme: Scheme) -> bool:
    """The sites add correlated noise (a share each, continuing their earlier rounds' shares)."""
    return any(getattr(s, "name", "") == "correlated_noise" and s.noise == "distributed" for s in scheme.steps)


def build_run_scheme(cfg: RunConfig, n_params: int) -> Scheme:
    """The configured scheme, built as the server's `Run` builds it (`run.state.scheme_env`)."""
    return configured_scheme(cfg, scheme_env(cfg, n_params))


def round_secagg(transport: Transport, k: int, d: int) -> SecAggTransport:
    """The secure-aggregation transport of a round with k clients sending d values."""
    if isinstance(transport, SecAggTransport):
        return transport
    sa = transport.round_transport(k, d)
    if sa is None:
        raise ConfigError(f"secure transport {transport.name!r} cannot run over Flower; supported: "
                          "SecAggTransport and transports with round_transport(k, d) (SecureSum)")
    return sa


def encode_words(sa: SecAggTransport, u: torch.Tensor, k: int, rng: np.random.Generator,
                 index: int | None = None) -> tuple[np.ndarray, int]:
    """One client's rows [1, d] → (words in Z_(2^b), b) with the no-overflow bound of a k-client sum.
    `index` (seeded clients only): the client's row in the cohort; its stochastic rounding then
    takes the draws the simulator's cohort-wide stream gives that row (one 64-bit draw per value)."""
    bits = sa.round_bits(k)
    if sa.encoding == "int":
        return ring.encode_int(u, bits, bound=ring.client_bound(bits, k)), bits
    if index:
        rng.bit_generator.advance(index * u.shape[1])
    return ring.encode_fixed(u, bits, sa.clip_range, sa.frac_bits, rng), bits


def check_round_config(sa: SecAggTransport, rc: RoundConfig) -> None:
    """A client's check that the server's secure-sum configuration is the one its own config
    implies: the Shamir threshold, the minimum number of inputs in a released sum, and the
    neighbour graph's degree (complete unless the scheme asks for SecAgg+ neighbours)."""
    k = rc.n_clients
    degree = min(len(v) for v in rc.neighbours.values())
    sparse = sa.neighbours is not None and sa.neighbours < k - 1
    want_degree = 2 * (sa.neighbours // 2) if sparse else k - 1
    want_t = default_threshold(degree) if sa.threshold is None else int(sa.threshold)
    want_min = max(1, k - sa.max_dropouts)
    if degree != want_degree or rc.threshold != want_t or rc.min_survivors != want_min:
        raise ProtocolError(f"round {rc.round_id}: the server's secure-sum configuration (degree {degree}, t = "
                            f"{rc.threshold}, min_survivors = {rc.min_survivors}) differs from this client's "
                            f"(degree {want_degree}, t = {want_t}, min_survivors = {want_min})")


def round_values(scheme: Scheme) -> dict[str, float]:
    """The server's `Step.round_values` of every step, as "<step index>/<name>" → value (the round plan's)."""
    return {f"{i}/{k}": float(v) for i, s in enumerate(scheme.steps) for k, v in s.round_values().items()}


def load_round_values(scheme: Scheme, values: Mapping[str, float], r: int) -> None:
    """A deployed client's steps take the server's round values; the names must be those its own
    steps give (a plan without them, or with others, is a ProtocolError)."""
    mine = round_values(scheme)
    if set(values) != set(mine):
        raise ProtocolError(f"round {r}: the plan's step values {sorted(values)} are not the ones this client's scheme "
                            f"takes {sorted(mine)}")
    for i, s in enumerate(scheme.steps):
        got = {k.split("/", 1)[1]: v for k, v in values.items() if k.split("/", 1)[0] == str(i)}
        if got:
            s.load_round_values(got)


def decode_sum(sa: SecAggTransport, total: np.ndarray, bits: int) -> torch.Tensor:
    """The unmasked sum in Z_(2^b) → int64 (integer encoding) or float64 (fixed point)."""
    if sa.encoding == "int":
        return torch.from_numpy(ring.centred_lift(total, bits))
    return torch.from_numpy(ring.decode_fixed(total, bits, sa.frac_bits))


@dataclass(frozen=True)
class NodeSettings:
    """What a SuperNode's `--node-config` says about its client (docs/site-data.md)."""

    cid: int  # partition-id: the client's id in the federation
    data_path: str | None = None  # its own training data: a CSV, .npz or image folder (else: partition `cid`)
    seeded: bool = False  # dpfl-seeded: draw client randomness from the config seed (tests only)
    test_path: str | None = None  # its own held-out data, for federated evaluation
    label_column: str = "label"  # the CSV's label column
    data_shape: str | None = None  # reshape each example, e.g. "1,28,28"
    data_scale: float | None = None  # divide CSV / .npz feature values by it (255 for 0..255 pixels)
    signing_key: str | None = None  # its OpenSSH node key (--auth-supernode-private-key): signed secure rounds
    peers: str | None = None  # the operator's peers.toml: every site's registered public key by partition id
    site_key: str | None = None  # the file of its 32-byte secret keying its data MAC (default: certs.default_site_key)

    KEYS = ("partition-id", "num-partitions", "data-path", "test-path", "label-column", "data-shape", "data-scale",
            "dpfl-seeded", "signing-key", "peers", "site-key")

    @classmethod
    def parse(cls, node_config: Mapping[str, Any], n_clients: int) -> NodeSettings:
        unknown = sorted(set(node_config) - set(cls.KEYS))
        if unknown:
            raise ConfigError(f"unknown node config keys {unknown}; node config keys: {', '.join(cls.KEYS)}")
        pid = node_config.get("partition-id")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < n_clients:
            raise ConfigError(f"node config partition-id must be an integer in [0, {n_clients}) "
                              f"(data.n_clients = {n_clients}), got {pid!r}; node config keys: {', '.join(cls.KEYS)}")
        num = node_config.get("num-partitions", n_clients)
        if num != n_clients:
            raise ConfigError(f"node config num-partitions = {num!r} but the run config has data.n_clients = "
                              f"{n_clients}; they must agree")
        text = {}
        for key in ("data-path", "test-path", "label-column", "data-shape", "site-key"):
            v = node_config.get(key)
            if v is not None and (not isinstance(v, str) or not v):
                raise ConfigError(f"node config {key} must be a non-empty string, got {v!r}")
            text[key] = v
        scale = node_config.get("data-scale")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
            raise ConfigError(f"node config data-scale must be a number > 0, got {scale!r}")
        describes = [k for k in ("label-column", "data-shape", "data-scale") if node_config.get(k) is not None]
        if describes and text["data-path"] is None and text["test-path"] is None:
            raise ConfigError(f"node config {', '.join(describes)} describe the files in data-path / test-path; "
                              "give one or leave them out")
        seeded = node_config.get("dpfl-seeded", False)
        if not isinstance(seeded, bool):
            raise ConfigError(f"node config dpfl-seeded must be true or false, got {seeded!r}")
        signing = signing_files(node_config) or (None, None)
        return cls(pid, text["data-path"], seeded, text["test-path"], text["label-column"] or "label",
                   text["data-shape"], None if scale is None else float(scale), *signing, text["site-key"])


def site_data(path: str, node: NodeSettings, cfg: RunConfig, model: torch.nn.Module):
    """A site's own file (`dpfl.data.load_site_data`), checked against the model: it takes an
    example, and the labels are classes the model predicts. One DataError line otherwise."""
    from dpfl.data import load_site_data
    site = load_site_data(path, label_column=node.label_column, shape=node.data_shape, scale=node.data_scale,
                          like=cfg.data.dataset)
    check_takes(path, site.x, site.y, site.task, cfg, model)
    return site


def check_takes(what: str, x: torch.Tensor, y: torch.Tensor, task: str, cfg: RunConfig, model: torch.nn.Module) -> None:
    """The model takes an example of `x`, and the labels `y` are classes it predicts; one DataError
    line naming `what` otherwise."""
    if not len(y):
        return
    try:
        out = first_output(model, x[:1])
    except RuntimeError as e:
        raise DataError(f"{what}: model {cfg.model.name!r} does not take its examples (shape "
                        f"{list(x.shape[1:])}): {str(e).splitlines()[0]}") from None
    binary = out.shape[-1] == 1
    classes = 2 if binary else int(out.shape[-1])
    if int(y.max()) >= classes or (task == "binary") != binary:
        raise DataError(f"{what}: labels {int(y.min())}..{int(y.max())} ({task}), the model predicts "
                        f"{'a binary label' if binary else f'{classes} classes'}")


_federations: dict[str, Any] = {}


def federation(cfg: RunConfig):
    """The configured dataset, partitioned with the config seed exactly as the simulator does
    (kept per process: several in-process clients share one copy)."""
    from dpfl.run.state import build_federation

    key = repr((cfg.seed, cfg.data.model_dump(), cfg.run.device))
    if key not in _federations:
        _federations.clear()
        _federations[key] = build_federation(cfg, Seeds(cfg.seed))
    return _federations[key]


def check_record_dp(cfg: RunConfig) -> None:
    """Over Flower, train.dpsgd needs an explicit σ: a client cannot replay the server's selection
    to calibrate one, and must not take its noise level from the server."""
    if cfg.train.dpsgd is not None and cfg.train.dpsgd.noise_multiplier is None:
        raise ConfigError("over Flower, train.dpsgd needs noise_multiplier (a client does not calibrate σ from "
                          "the server's selection); target_epsilon then stops each client at its own budget")


def record_spend(cfg: RunConfig, steps: dict[float, int], q: float, n: int) -> tuple[dict[float, int], float]:
    """A client's own record-level accounting: `steps` (local DP-SGD steps per rate) with n more at
    rate q, and its ε then; BudgetExceededError (nothing spent) past train.dpsgd.target_epsilon."""
    from dpfl.privacy.record import RecordAccountant

    d = cfg.train.dpsgd
    after = dict(steps)
    after[q] = after.get(q, 0) + n
    acc = RecordAccountant(1, d.noise_multiplier)
    for qq, s in after.items():
        acc.add([0], [qq], s)
    eps = float(acc.epsilon([0], d.delta)[0])
    if d.target_epsilon is not None and eps > d.target_epsilon:
        raise BudgetExceededError(f"this client would reach record-level ε = {eps:.4g} > train.dpsgd.target_epsilon "
                                  f"= {d.target_epsilon}; it trains no more")
    return after, eps


class LocalClient:
    """A client's data, model, trainer and scheme, built from the run config."""

    def __init__(self, cfg: RunConfig, node: NodeSettings):
        if cfg.attack is not None and cfg.attack.name != "none":
            raise ConfigError("attacks are simulation-only; remove the [attack] section to deploy")
        check_record_dp(cfg)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.cfg, self.node, self.cid = cfg, node, node.cid
        self.device = torch.device(cfg.run.device)
        public_seeds = Seeds(cfg.seed)  # data partition and model structure: public, as in the simulator
        self.seeds: Seeds = public_seeds if node.seeded else OsSeeds()
        from dpfl.models import build_model

        model = build_model(cfg.model.name, seed=public_seeds.seed("model"), **cfg.model.options).to(self.device)
        public, fed = None, None
        if node.data_path:
            site = site_data(node.data_path, node, cfg, model)
            self.x, self.y, task = site.x, site.y, site.task
        else:
            fed = federation(cfg)
            idx = torch.from_numpy(fed.clients[self.cid]).to(fed.x.device)
            self.x, self.y, task, public = fed.x[idx], fed.y[idx], fed.task, fed.public
            check_takes(f"client {self.cid}'s part of {fed.dataset or cfg.data.dataset}", self.x, self.y, task, cfg,
                        model)  # (a server without data does not check it)
        self.x, self.y = self.x.to(self.device), self.y.to(self.device)
        self.size = len(self.y)
        self.task = task
        self.x_test, self.y_test = self._held_out(fed, model)
        self.n = sum(p.numel() for p in model.parameters())
        self.scheme = build_run_scheme(cfg, self.n)
        if cfg.train.dpsgd is not None:  # the client's own check, before it sends anything
            check_dpsgd(self.scheme)
        tc = cfg.train.model_dump(exclude={"dpsgd"})
        tc.update(self.scheme.train_overrides)
        self.trainer = Trainer(model, task, LocalTraining(**tc), mode="auto", max_cohort=cfg.run.max_cohort)
        w0 = self.trainer.flat.flatten(model).to(self.device)
        try:
            self.scheme.setup(SetupContext(n_params=self.n, seeds=self.seeds, device=self.device, initial_params=w0,
                                           model=model, trainer=self.trainer, public_data=public, clients=None,
                                           n_clients=cfg.data.n_clients, cohort_size=cfg.cohort_size()))
        except (AttributeError, TypeError) as e:
            raise ConfigError(f"scheme {self.scheme.name!r} needs the federation's data to set up ({e}); "
                              "it cannot be deployed as configured (give fixed values, e.g. a numeric clip)") from None

    def _held_out(self, fed: Any, model: torch.nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This site's held-out data for federated evaluation: its test-path file; without its own
        files, its part of the built-in test set (`site_test_split`); else none."""
        if self.node.test_path:
            site = site_data(self.node.test_path, self.node, self.cfg, model)
            if site.task != self.task:
                raise DataError(f"{self.node.test_path}: a {site.task} task, the training data's is {self.task}")
            return site.x.to(self.device), site.y.to(self.device)
        if fed is None or not len(fed.y_test):
            return None, None
        from dpfl.data import site_test_split

        idx = torch.from_numpy(site_test_split(len(fed.y_test), self.cfg.data.n_clients, self.cfg.seed)[self.cid])
        return fed.x_test[idx].to(self.device), fed.y_test[idx].to(self.device)

    def data_mac(self, salt: bytes) -> str:
        """HMAC-SHA256 of the run's `salt` and this site's training and held-out arrays as loaded,
        under its site key (`certs.site_key`), which never leaves the site: the hello sends it, the
        run records it and a resumed run checks it; without the key it says nothing about the data,
        and runs with other salts get unrelated MACs of the same data."""
        held_out = [] if self.x_test is None else [self.x_test, self.y_test]
        mac = hmac.new(site_key(self.node.site_key), DATA_MAC_DOMAIN + salt, hashlib.sha256)
        return hash_tensors([self.x, self.y, *held_out], mac).hexdigest()

    def evaluate(self, w: torch.Tensor) -> dict[str, float | int]:
        """The global model `w` on this site's held-out data: counts the server can add up
        (examples, correct predictions, summed loss); n = 0 without held-out data."""
        if self.x_test is None or not len(self.y_test):
            return {"n": 0, "correct": 0, "loss_sum": 0.0}
        from dpfl.training.evaluate import evaluate_counts

        self.trainer.flat.load_into(self.trainer.model, w)
        return evaluate_counts(self.trainer.model, self.x_test, self.y_test, self.task, self.cfg.eval.batch_size)

    def check_plan(self, plan: Any) -> None:
        if plan.cohort[plan.index] != self.cid:
            raise ProtocolError(f"client {self.cid}: the plan puts client {plan.cohort[plan.index]} at index {plan.index}")
        if plan.sizes[plan.index] != self.size:
            raise ProtocolError(f"client {self.cid}: the plan says {plan.sizes[plan.index]} samples, it holds {self.size}")
        if plan.describe != self.scheme.describe():
            raise ProtocolError(f"client {self.cid}: the server runs {plan.describe!r}, this client built "
                                f"{self.scheme.describe()!r}; configs differ")

    def context(self, plan: Any, w: torch.Tensor) -> RoundContext:
        ctx = RoundContext(round=plan.round, n_params=self.n, cohort=np.array([self.cid]), n_selected=plan.n_selected,
                           weights=torch.tensor([float(self.size)], device=self.device), seeds=self.seeds,
                           device=self.device, global_params=w, n_clients=self.cfg.data.n_clients,
                           cohort_size=self.cfg.cohort_size(), ledger=None)
        ctx.answering = plan.answering  # k: the rows of the sum (proposed RoundContext field, see docs)
        return ctx

    def statistic(self, plan: Any, w: torch.Tensor) -> torch.Tensor:
        """This client's row of the round statistic its scheme needs before training
        (`Step.client_statistic`, on all its data: FSVRG's ∇f_k(w_t)), float32 [n]."""
        self.check_plan(plan)
        step = statistic_step(self.scheme)
        if step is None:
            raise ProtocolError(f"client {self.cid}: the server asks for a round statistic, scheme "
                                f"{self.scheme.name!r} has none")
        return step.client_statistic(self.context(plan, w), self.x, self.y, [np.arange(self.size)])[0]

    def update(self, plan: Any, w: torch.Tensor, statistic: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, RoundContext]:
        """Local training and the client chain for this round (`dpfl.schemes.round`): the row [1, d'].
        `statistic`: the round statistic from the server, for a scheme that needs one."""
        self.check_plan(plan)
        load_round_values(self.scheme, plan.values, plan.round)  # (the adaptive clip's C_t) before any step runs
        ctx = self.context(plan, w)
        ctx.statistic = statistic
        mask, cplan = local_plan(self.scheme, ctx)
        start, hook = w, None
        if cplan is not None:
            start = w if cplan.start is None else cplan.start
            hook = cplan.grad_hook
        dp = None
        if self.cfg.train.dpsgd is not None:  # the simulator's per-client streams (OS-keyed unless seeded)
            if hook is not None:
                raise ConfigError(f"train.dpsgd does not combine with scheme {self.scheme.name!r}: it sets "
                                  "its own gradient corrections, which would bypass DP-SGD")
            d = self.cfg.train.dpsgd
            if self.node.seeded:  # the simulator's draw for the whole cohort (its padding), then this client's row
                samplers = [self.seeds.crypto("round", plan.round, "dpsgd-sample", int(c)) for c in plan.cohort]
                pos, weight, q = poisson_positions(np.asarray(plan.sizes), plan.steps, plan.batch, samplers)
                pos, weight, q = pos[plan.index], weight[plan.index : plan.index + 1], q[plan.index : plan.index + 1]
            else:
                sampler = self.seeds.crypto("round", plan.round, "dpsgd-sample", self.cid)
                pos, weight, q = poisson_positions(np.array([self.size]), plan.steps, plan.batch, [sampler])
                pos = pos[0]
            dp = ClientDP(d.clip, d.noise_multiplier, torch.from_numpy(weight).to(self.device),
                          torch.from_numpy(q * self.size).to(self.device),
                          [self.seeds.crypto("round", plan.round, "dpsgd-noise", self.cid)])
        else:
            rng = self.seeds.numpy("round", plan.round, "batches")
            if self.node.seeded:  # the simulator's draw for the whole cohort, then this client's row
                pos = local_positions(np.asarray(plan.sizes), plan.steps, plan.batch, rng)[plan.index]
            else:
                pos = local_positions(np.array([self.size]), plan.steps, plan.batch, rng)[0]
        torch.manual_seed(self.seeds.seed("round", plan.round, "torch", self.cid))  # dropout layers
        u = self.trainer.train(start, self.x, self.y, torch.from_numpy(pos[None]).to(self.device), mask,
                               grad_hook=hook, dp=dp)
        u = client_chain(self.scheme.steps, u, ctx)
        if u.ndim != 2 or u.shape[0] != 1:
            raise RuntimeError(f"scheme {self.scheme.name}: the client chain returned shape {tuple(u.shape)}, "
                               "expected one row")
        return u, ctx

    def report(self, ctx: RoundContext) -> dict[str, np.ndarray]:
        """What the steps' server sides need beside this client's row (`Step.client_report`), as
        flat named arrays with one leading row."""
        out: dict[str, np.ndarray] = {}
        for i, s in enumerate(self.scheme.steps):
            for name, t in s.client_report(ctx).items():
                out[f"{i}/{name}"] = t.detach().cpu().numpy()
        return out

    def client_state(self) -> dict[str, np.ndarray]:
        """What this client keeps on its node between rounds: the state of the steps that declare
        `client_state` (FedDyn's gradient memory), as flat named arrays."""
        out: dict[str, np.ndarray] = {}
        for i, s in enumerate(self.scheme.steps):
            if s.client_state:
                _flatten(s.state_dict(), f"{i}", out)
        return out

    def load_client_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        for i, s in enumerate(self.scheme.steps):
            if s.client_state:
                mine = {k[len(f"{i}/"):]: v for k, v in arrays.items() if k.startswith(f"{i}/")}
                if mine:
                    s.load_state_dict(_unflatten(mine))

    def node_secret(self) -> bytes:
        """32 bytes from which this client derives its secure-aggregation keys of every round
        (kept on the node, never sent)."""
        return derive_key(self.cfg.seed, "flower-secagg", self.cid) if self.node.seeded else os.urandom(32)


def _flatten(state: Mapping[str, Any], prefix: str, out: dict[str, np.ndarray]) -> None:
    for k, v in state.items():
        if isinstance(v, Mapping):
            _flatten(v, f"{prefix}/{k}", out)
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}/{k}"] = v.detach().cpu().numpy()
        else:
            raise TypeError(f"client state {prefix}/{k}: {type(v).__name__} is not a tensor")


def _unflatten(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, a in arrays.items():
        *path, last = key.split("/")
        d = out
        for p in path:
            d = d.setdefault(p, {})
        d[last] = torch.from_numpy(np.array(a))
    return out
