"""One federated run: its state (model, scheme and its state, seeds, privacy ledger, record-level
accountant, round, totals, best round) and what every round ends with (the model update, the
server's evaluation, the metrics line, checkpoints, the summary and the run directory's files).

`Run` is the one object both drivers drive: the in-process simulator (`engine.simulator.simulate`,
whose clients train in this process) and the Flower deployment
(`dpfl.flower.coordinator.Coordinator`, whose clients train on their own sites). Neither reads the
other; the run directory they write is the same (`RUN_FILES`).

All randomness is drawn from named streams of one root seed, keyed by round and purpose,
so a run resumed from a checkpoint continues bit-identically.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from pydantic import ValidationError

from dpfl.config import RESUME_RESOURCES, RunConfig, dump_config, load_config
from dpfl.errors import ConfigError, DataError
from dpfl.privacy import participation
from dpfl.rng import Seeds
from dpfl.run import checkpoint as ckpt
from dpfl.schemes.base import RoundContext, SetupContext
from dpfl.schemes.registry import Scheme, build_scheme
from dpfl.schemes.round import (
    Accounting,
    check_dpsgd,
    empty_totals,
)
from dpfl.schemes.sampling import drop, select_fixed, select_poisson
from dpfl.training.evaluate import evaluate
from dpfl.training.memory import keep_freed_memory
from dpfl.training.trainer import LocalTraining, Trainer

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.toml"
SUMMARY = "summary.json"
RUN_FILES = (CONFIG, METRICS, CHECKPOINT, SUMMARY)


@dataclass
class Federation:
    """All training data in one tensor; clients are index arrays into it."""

    x: torch.Tensor
    y: torch.Tensor
    clients: list[np.ndarray]
    x_test: torch.Tensor
    y_test: torch.Tensor
    task: str
    num_classes: int
    source: str
    public: tuple[torch.Tensor, torch.Tensor] | None = None
    dataset: str = ""  # the loader's name: what `data.dataset = "default"` resolved to
    sizes: np.ndarray = field(init=False)

    def __post_init__(self):
        self.sizes = np.array([len(c) for c in self.clients], dtype=np.int64)
        if (self.sizes == 0).any():
            raise DataError(f"{int((self.sizes == 0).sum())} clients have no data; use fewer clients "
                            "or another partition")

    def record(self) -> dict[str, str]:
        """Which data this is: the resolved dataset, its source, and a SHA-256 of the arrays and the
        client partition (what a resumed run must see again)."""
        h = hash_tensors([self.x, self.y, self.x_test, self.y_test, *(self.public or ())])
        for c in self.clients:
            h.update(np.ascontiguousarray(c, dtype=np.int64).data)
            h.update(b";")
        return {"dataset": self.dataset, "source": self.source, "sha256": h.hexdigest()}


def hash_tensors(tensors: list[torch.Tensor], h: Any = None) -> Any:
    """`h` (a new SHA-256 by default; e.g. an HMAC) fed the tensors' dtypes, shapes and bytes, in order."""
    h = hashlib.sha256() if h is None else h
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b"")
    return h


def sites_record(sites: dict[int, str]) -> dict[str, Any]:
    """The data record of a server that holds no data: each site's data MAC (its hello's), and one
    SHA-256 of them all. (Their salt stays in the checkpoint: with it, another run could link them.)"""
    by_id = {str(c): h for c, h in sorted(sites.items())}
    return {"dataset": "sites", "source": "each site's own data; the server loads none",
            "sha256": hashlib.sha256(json.dumps(by_id).encode()).hexdigest(), "sites": by_id}


def build_federation(cfg: RunConfig, seeds: Seeds) -> Federation:
    from dpfl.data import downsample_majority, load_dataset, partition

    d = cfg.data
    ds = load_dataset(d.dataset, root=d.root, seed=cfg.seed, **d.options)
    labels = ds.y_train.numpy()
    if d.partition == "natural":
        if ds.client_indices is None:
            raise ConfigError(f"data.partition = 'natural' but dataset {d.dataset!r} has no natural clients")
        clients = list(ds.client_indices)
        if len(clients) != d.n_clients:
            raise ConfigError(f"data.n_clients = {d.n_clients} but dataset {d.dataset!r} has {len(clients)} "
                              "natural clients")
    else:
        clients = partition(labels, d.n_clients, d.partition, seed=seeds.seed("partition"), **d.partition_options)
    if d.downsample_majority:
        rng = seeds.numpy("downsample")
        clients = [downsample_majority(c, labels, rng) for c in clients]
    public = ds.public
    x_test, y_test = ds.x_test, ds.y_test
    if public is None and d.public_size:
        # take the public batch from the test set and keep it out of evaluation
        perm = seeds.numpy("public").permutation(len(y_test))
        pub, rest = perm[: d.public_size], np.sort(perm[d.public_size :])
        public = (x_test[pub], y_test[pub])
        x_test, y_test = x_test[rest], y_test[rest]
    dev = device(cfg)
    return Federation(ds.x_train.to(dev), ds.y_train.to(dev), clients, x_test.to(dev), y_test.to(dev),
                      ds.task, ds.num_classes, ds.source,
                      None if public is None else (public[0].to(dev), public[1].to(dev)), ds.name)


def device(cfg: RunConfig) -> torch.device:
    """`run.device`, if this torch can use it (ConfigError otherwise)."""
    name = cfg.run.device
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"run.device = {name!r} but this torch ({torch.__version__}) has no usable CUDA "
                              "device; use run.device = 'cpu'")
        index = int(name.split(":", 1)[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"run.device = {name!r} but this machine has {torch.cuda.device_count()} "
                              "CUDA device(s)")
    return torch.device(name)


def scheme_env(cfg: RunConfig, n_params: int) -> dict[str, Any]:
    """The run facts scheme builders take: the server's and every deployed client's alike."""
    return {"n_params": n_params, "cohort_size": cfg.cohort_size(), "n_clients": cfg.data.n_clients,
            "train": cfg.train, "privacy": cfg.privacy, "seed": cfg.seed,
            "sampling_rate": cfg.sampling_rate(), "rounds": cfg.federation.rounds,
            "dropout": cfg.federation.dropout, "sampling": cfg.accounted_sampling(),
            "participation": cfg.participation()}


def configured_scheme(cfg: RunConfig, env: dict[str, Any]) -> Scheme:
    """The configured scheme with the configured aggregator (`env`: `scheme_env`)."""
    scheme = build_scheme(cfg.scheme.name, dict(cfg.scheme.options), env)
    if cfg.scheme.aggregator:
        from dpfl.schemes.aggregators import build_aggregator

        scheme.aggregator = build_aggregator(cfg.scheme.aggregator, dict(cfg.scheme.aggregator_options), env)
    return scheme


def first_output(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output for one example batch `x`, in eval mode without gradients (its mode kept):
    the check that a model takes some data. RuntimeError when it does not."""
    from dpfl.data.dataset import as_model_input

    was = model.training
    try:
        with torch.no_grad():
            model.eval()
            return model(as_model_input(x, next(model.parameters()).dtype))
    finally:
        model.train(was)


def _best_metric(cfg: RunConfig, task: str) -> str:
    return cfg.eval.metric or ("balanced_accuracy" if task == "binary" else "accuracy")


def is_run_dir(out: Path) -> bool:
    """True if `out` holds files of a run (config, metrics, checkpoint or summary)."""
    return any((out / f).exists() for f in RUN_FILES)


class Run:
    """One federated run's state and bookkeeping (module docstring); `simulate(run)` trains its clients.

    `data=False`: a deployed server that evaluates on the sites only (evaluation = "federated")
    loads no dataset: `fed` is None, the sites check their data against the model, a scheme that
    needs data on the server is refused at setup, the best round is the best `fed_accuracy`, and
    the data record holds the sites' hashes (`sites`, filled from their hellos)."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path | None = None, log: Callable[[str], None] = print,
                 overwrite: bool = False, *, data: bool = True, _resuming: bool = False):
        self.cfg = cfg
        self.out = Path(out_dir) if out_dir else None
        self.log = log
        # a new run onto an existing one replaces its files only when asked to
        self._fresh = not _resuming
        self._overwrite = overwrite
        if self.out and self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"output directory {self.out} is a file")
        if self.out and self._fresh and not overwrite and is_run_dir(self.out):
            raise ConfigError(f"{self.out} already holds a run; resume it, choose another output directory, "
                              "or overwrite it explicitly (dpfl run --overwrite)")
        self.seeds = Seeds(cfg.seed)
        self.device = device(cfg)
        self.code = [{**code_version(), "ran_on": ran_on(self.device), "from_round": 1}]  # a resume adds a part
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        keep_freed_memory()
        self.fed: Federation | None = build_federation(cfg, self.seeds) if data else None
        self.sites: dict[int, str] = {}  # client id → its data MAC (a deployment's hello)
        self.site_salt: bytes | None = None  # the run's salt of those MACs (a deployment's; kept on resume)
        if cfg.eval.metric not in (None, "accuracy") and self.fed is None:
            raise ConfigError(f"eval.metric = {cfg.eval.metric!r} needs the server's evaluation; the sites' "
                              "(evaluation = 'federated') gives fed_accuracy: use 'accuracy', or evaluation = "
                              "'server' or 'both'")
        if cfg.eval.metric not in (None, "accuracy") and self.fed.task != "binary":
            raise ConfigError(f"eval.metric = {cfg.eval.metric!r} exists for binary tasks only; "
                              f"{self.fed.dataset or cfg.data.dataset} is {self.fed.task}: use 'accuracy'")
        from dpfl.models import build_model

        self.model = build_model(cfg.model.name, seed=self.seeds.seed("model"), **cfg.model.options).to(self.device)
        if self.fed is not None:  # else each site checks its own data
            self._check_model_takes_data()
        env = self._scheme_env()
        self.scheme: Scheme = configured_scheme(cfg, env)
        self.attack = None
        if cfg.attack is not None and cfg.attack.name != "none":
            from dpfl.attacks.registry import build_attack

            self.attack = build_attack(cfg.attack, env)
            self.fed = self.attack.prepare(self.fed, self.seeds)
        tc = cfg.train.model_dump(exclude={"dpsgd"})
        tc.update(self.scheme.train_overrides)
        self.local = LocalTraining(**tc)
        mode = "auto"
        task = self.fed.task if self.fed is not None else "multiclass"  # (a server without data never trains)
        self.trainer = Trainer(self.model, task, self.local, mode=mode, max_cohort=cfg.run.max_cohort)
        self.flat = self.trainer.flat
        self.w = self.flat.flatten(self.model).to(self.device)
        self.ledger = None
        self.record = None  # per-client record-level accountant (train.dpsgd)
        self.record_sigma = self._record_sigma(cfg.federation.rounds)
        self.round = 0
        self.cum = empty_totals()
        self.best: dict[str, Any] | None = None
        self.stopped_reason: str | None = None
        self._setup_done = False
        self._data_record: dict[str, str] | None = None
        self.noise_key: bytes | None = None  # a resumed deployed server's key for redrawn noise (its checkpoint)
        self.checkpoint_every = cfg.run.checkpoint_every  # a deployed server: every round (Coordinator)

    def _scheme_env(self) -> dict[str, Any]:
        return scheme_env(self.cfg, sum(p.numel() for p in self.model.parameters()))

    def setup(self) -> None:
        """Set the scheme up and create the ledger (once; every driver calls it before round 1)."""
        if self._setup_done:
            return
        self._setup_done = True
        n = self.flat.n
        self.ledger = self._make_ledger()
        if self.record_sigma is not None:
            from dpfl.privacy.record import RecordAccountant

            self.record = RecordAccountant(self.cfg.data.n_clients, self.record_sigma)
        ctx = SetupContext(n_params=n, seeds=self.seeds, device=self.device, initial_params=self.w.clone(),
                           model=self.model, trainer=self.trainer, public_data=None if self.fed is None else self.fed.public,
                           clients=self.fed, n_clients=self.cfg.data.n_clients,
                           cohort_size=self.cfg.cohort_size(), ledger=self.ledger)
        what = self._server_data_use() if self.fed is None else None
        if what:
            raise ConfigError(f"{what} needs data on the server, which loads none with evaluation = 'federated': "
                              "use evaluation = 'server' or 'both'")
        self.scheme.setup(ctx)

    def _server_data_use(self) -> str | None:
        """The option that makes the scheme's setup take data on the server, as the config names it."""
        for s in self.scheme.steps:
            if getattr(s, "selector", None) is not None:  # a ClipStep choosing its bound
                return f"scheme.options.clip = {self.cfg.scheme.options.get('clip', 'auto')!r} (a bound chosen from data)"
            if s.name == "topk" and s.indices is None:
                return f"scheme {self.cfg.scheme.name!r} (its Top-K set comes from public data)"
            if s.name == "sub-fedavg" and s.personal_eval:
                return (f"scheme.options.personal_eval = {s.personal_eval} (sub-fedavg's personal models are "
                        "evaluated on the server's test data; 0 turns it off)")
        return None

    def _make_ledger(self):
        if not self.scheme.private:
            return None
        from dpfl.privacy import Budget, Ledger

        p = self.cfg.privacy
        budget = Budget(epsilon=p.target_epsilon, delta=p.delta) if p.target_epsilon else None
        return Ledger(accountant=p.accountant, neighbouring=self.epsilon_neighbouring(), budget=budget)

    def epsilon_sampling(self) -> str:
        """How ε accounts client selection: poisson | without-replacement | none."""
        return self.scheme.privacy_sampling or self.cfg.accounted_sampling()

    def epsilon_neighbouring(self) -> str:
        return "replace_one" if self.epsilon_sampling() == "without-replacement" else "add_remove"

    def accounting_note(self) -> str:
        """One line: which sampling and neighbouring relation the reported ε is for."""
        n, k, s = self.cfg.data.n_clients, self.cfg.cohort_size(), self.epsilon_sampling()
        rel = {"add_remove": "add/remove-one", "replace_one": "replace-one"}[self.epsilon_neighbouring()]
        if s == "without-replacement":
            what = f"{k} of {n} clients sampled without replacement"
        elif s == "none":
            what = "no amplification by client sampling"
        else:
            what = f"Poisson sampling of clients, q = {k}/{n}"
            if self.cfg.federation.sampling == "fixed":
                what += (f" (assumed: the run draws a fixed cohort of {k}; "
                         "privacy.sampling_assumption = 'poisson')")
        return f"privacy: ε ({self.cfg.privacy.accountant}) assumes {what}; {rel} neighbours"

    def _record_sigma(self, rounds: int) -> float | None:
        """train.dpsgd's σ: as given, or the smallest σ keeping every client within the record-level
        target over `rounds` rounds. The calibration replays the (public, seed-drawn) client selection,
        counting every selected client as trained, and pairs the largest rate q_k with the most
        participations: an upper bound on every client's ε."""
        dp = self.cfg.train.dpsgd
        if dp is None:
            return None
        check_dpsgd(self.scheme)
        if dp.noise_multiplier is not None:
            return float(dp.noise_multiplier)
        from dpfl.privacy.calibration import calibrate_sigma

        seen = np.zeros(self.cfg.data.n_clients, dtype=np.int64)
        for r in range(1, rounds + 1):
            answering, dropped = self.select(r)
            seen[answering] += 1
            seen[dropped] += 1
        q = float(np.minimum(1.0, self.local.batch_size / self.fed.sizes[seen > 0]).max())
        return calibrate_sigma(dp.target_epsilon, dp.delta, q, int(seen.max()) * self.local.steps, accountant="rdp")

    def record_metrics(self, trained: np.ndarray) -> dict[str, Any]:
        """Record-level DP-SGD metrics after a round in which `trained` clients trained."""
        delta = self.cfg.train.dpsgd.delta
        spent = self.record.spent()
        eps = self.record.epsilon(spent, delta)
        own = self.record.epsilon(trained, delta)
        return {"record_epsilon_max": float(eps.max()) if eps.size else 0.0,
                "record_epsilon_median": float(np.median(eps)) if eps.size else 0.0,
                "record_clients_spent": int(spent.size),
                "record_epsilon_per_client": {str(int(c)): float(e) for c, e in zip(trained, own)}}

    def select(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Round r's (answering, dropped) clients, drawn from the run's seed."""
        cfg = self.cfg
        n = cfg.data.n_clients
        if self.scheme.all_clients:
            cohort = np.arange(n)
        elif cfg.federation.participation != "any":  # cyclic or min-separation (dpfl.privacy.participation)
            cohort = participation.select(*cfg.participation(), n, cfg.cohort_size(), r, self.seeds)
        elif cfg.federation.sampling == "poisson":
            cohort = select_poisson(n, cfg.sampling_rate(), self.seeds.numpy("round", r, "select"))
        else:
            cohort = select_fixed(n, cfg.cohort_size(), self.seeds.numpy("round", r, "select"))
        return drop(cohort, cfg.federation.dropout, self.seeds.numpy("round", r, "dropout"))

    def context(self, r: int, cohort: np.ndarray, n_selected: int, sizes: np.ndarray | None = None) -> RoundContext:
        """Round r's context; `sizes`: the clients' data sizes as the driver knows them (a deployment:
        as the sites said in their hello), else the federation's."""
        sizes = self.fed.sizes[cohort] if sizes is None else sizes
        return RoundContext(round=r, n_params=self.flat.n, cohort=cohort, n_selected=n_selected,
                            weights=torch.from_numpy(sizes.astype(np.float32)).to(self.device),
                            seeds=self.seeds, device=self.device, global_params=self.w,
                            n_clients=self.cfg.data.n_clients, cohort_size=self.cfg.cohort_size(),
                            ledger=self.ledger)

    def accounting(self) -> Accounting:
        p = self.cfg.privacy
        return Accounting(self.ledger, p.target_epsilon, p.delta, self.epsilon_sampling())

    def update_best(self, m: dict[str, Any]) -> None:
        key = _best_metric(self.cfg, self.fed.task) if self.fed is not None else "fed_accuracy"
        v = m.get(key)
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return
        if self.best is None or v > self.best[key]:
            keep = ("round", "accuracy", "balanced_accuracy", "auroc", "loss", "epsilon", "record_epsilon_max",
                    "cum_up_bytes_per_client", "cum_down_bytes_per_client",
                    "formula_up_bytes_per_client", "formula_down_bytes_per_client",
                    "source_accuracy", "attack_success", "step_up_bits_per_value")
            if self.fed is None:
                keep += ("fed_accuracy", "fed_loss", "fed_examples", "fed_sites")
            self.best = {k: m[k] for k in keep if k in m}
            self.best["metric"] = key

    def data_record(self) -> dict[str, Any]:
        """`Federation.record()` of this run's data (computed once); without data, `sites_record`."""
        if self.fed is None:
            return sites_record(self.sites)
        if self._data_record is None:
            self._data_record = self.fed.record()
        return self._data_record

    def sigmas(self) -> list[float | None]:
        """Each step's noise multiplier σ (None for steps without one), then train.dpsgd's σ if any."""
        extra = [] if self.record_sigma is None else [self.record_sigma]
        return [s.sigma for s in self.scheme.steps] + extra

    def _check_model_takes_data(self) -> None:
        """One test example through the model (eval mode: no state changes), so that a model built for
        other inputs is one ConfigError at start, not a traceback from the first round."""
        x = self.fed.x_test[:1]
        if not len(x):
            return
        try:
            first_output(self.model, x)
        except RuntimeError as e:
            raise ConfigError(f"model {self.cfg.model.name!r} does not take the examples of "
                              f"{self.fed.dataset or self.cfg.data.dataset} (shape {tuple(x.shape[1:])}): "
                              f"{str(e).splitlines()[0]}") from None


    # ---- what every round ends with (both drivers) -------------------------------
    def eval_due(self, r: int) -> bool:
        """Round r's model is evaluated (every eval.every rounds, and the last)."""
        return r % self.cfg.eval.every == 0 or r == self.cfg.federation.rounds

    def end_round(self, r: int, out: Any, trained: np.ndarray) -> dict[str, Any]:
        """Round r's result (`run_round`'s output) applied: w ← w + Δ when the round released one;
        its metrics, with the record-level ones of the clients that `trained`."""
        if out.delta is not None:
            self.w = self.w + out.delta.to(self.w.dtype)
        self.round = r
        m = out.metrics
        if self.record is not None:
            m.update(self.record_metrics(trained))
        return m

    def evaluate_global(self) -> dict[str, Any]:
        """The global model on the server's test data."""
        self.flat.load_into(self.model, self.w)
        return evaluate(self.model, self.fed.x_test, self.fed.y_test, self.fed.task, self.cfg.eval.batch_size)

    def start_files(self) -> None:
        """The run directory at the start of a run: config.toml (with the data's hash) and, for a new
        run, an empty metrics.jsonl (an overwritten run's files removed first)."""
        if not self.out:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        if self._fresh:
            if self._overwrite:
                for f in (*RUN_FILES, CHECKPOINT + ".tmp"):
                    (self.out / f).unlink(missing_ok=True)
            (self.out / METRICS).write_text("")
            self._fresh = False
        d = self.data_record()
        source = d["source"].replace("\n", " ")
        sites = "".join(f"# site {c}: data MAC {h}\n" for c, h in d.get("sites", {}).items())
        ckpt.write_text(self.out / CONFIG, f"# data used: {d['dataset']} ({source}), "
                                           f"sha256 {d['sha256']}\n" + sites + dump_config(self.cfg))

    def write_round(self, m: dict[str, Any]) -> None:
        """Round m's metrics line, and a checkpoint every run.checkpoint_every rounds and at the last."""
        if not self.out:
            return
        with open(self.out / METRICS, "a") as f:
            f.write(json.dumps(m) + "\n")
        if self.round % self.checkpoint_every == 0 or self.round == self.cfg.federation.rounds:
            self.save_checkpoint()

    def rewrite_round(self, m: dict[str, Any]) -> None:
        """Round m's metrics line replaced (metrics that came after it was written: federated evaluation)."""
        if not self.out:
            return
        lines = (self.out / METRICS).read_text().splitlines()
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].strip() and json.loads(lines[i]).get("round") == m["round"]:
                lines[i] = json.dumps(m)
                ckpt.write_text(self.out / METRICS, "".join(ln + "\n" for ln in lines))
                return

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The end of a run: a last checkpoint, and the summary (with `extra`), written."""
        if self.out:
            self.save_checkpoint()
        summary = {**self.summary(), **(extra or {})}
        if self.out:
            ckpt.write_text(self.out / SUMMARY, json.dumps(summary, indent=2))
        return summary

    def summary(self) -> dict[str, Any]:
        return {"machine": machine(self.device), "code": self.code, "name": self.cfg.name, "scheme": self.scheme.name,
                "describe": self.scheme.describe(),
                "dataset": self.data_record()["source"], "data": self.data_record(), "n_params": self.flat.n,
                "rounds_run": self.round,
                "best": self.best, "stopped": self.stopped_reason,
                "epsilon_final": None if self.ledger is None else self.ledger.epsilon(self.cfg.privacy.delta),
                "delta": self.cfg.privacy.delta if self.ledger is not None else None,
                **({} if self.ledger is None else {"epsilon_sampling": self.epsilon_sampling(),
                                                   "epsilon_neighbouring": self.epsilon_neighbouring(),
                                                   "epsilon_note": self.accounting_note()}),
                **self._record_summary()}

    def _record_summary(self) -> dict[str, Any]:
        dp = self.cfg.train.dpsgd
        if dp is None:
            return {}
        spent = self.record.spent() if self.record is not None else np.zeros(0, dtype=np.int64)
        eps = self.record.epsilon(spent, dp.delta) if spent.size else np.zeros(0)
        return {"record_level": {
            "noise_multiplier": self.record_sigma, "clip": dp.clip, "delta": dp.delta,
            "epsilon_max": float(eps.max()) if eps.size else 0.0,
            "epsilon_median": float(np.median(eps)) if eps.size else 0.0, "clients_spent": int(spent.size),
            "accountant": "rdp: Poisson-subsampled Gaussian per client, q_k = min(1, batch_size / n_k), "
                          "one event per local step taken; local batches are Poisson samples"}}

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "w": self.w.cpu(), "scheme": self.scheme.state_dict(),
                "attack": None if self.attack is None else self.attack.state_dict(),
                "ledger": None if self.ledger is None else self.ledger.state_dict(),
                "record": None if self.record is None else self.record.state_dict(),
                "cum": dict(self.cum), "best": self.best, "stopped": self.stopped_reason,
                "sigmas": self.sigmas(), "data": self.data_record(), "code": self.code,
                "noise_key": self.noise_key,  # a deployed server's key for redrawn noise (Coordinator)
                "sites": {str(c): h for c, h in sorted(self.sites.items())}, "site_salt": self.site_salt}

    def save_checkpoint(self) -> None:
        ckpt.save(self.state_dict(), self.out / CHECKPOINT)

    def load_state_dict(self, st: dict[str, Any], source: str = "checkpoint") -> None:
        """Restore from `state_dict()` output; DataError naming `source` if it does not fit this run."""
        self.setup()
        w = st.get("w")
        if not isinstance(st.get("round"), int) or isinstance(st.get("round"), bool) or st["round"] < 0:
            raise DataError(f"{source}: 'round' must be an integer >= 0, got {st.get('round')!r}")
        if not isinstance(w, torch.Tensor) or w.shape != self.w.shape or not w.is_floating_point():
            what = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise DataError(f"{source}: model weights 'w' are {what}, this run's model has ({self.flat.n},)")
        if (st.get("ledger") is None) != (self.ledger is None):
            raise DataError(f"{source}: {'no' if self.ledger is not None else 'a'} privacy ledger, but this run's "
                            f"scheme {'has' if self.ledger is not None else 'has none'}")
        if (st.get("record") is None) != (self.record is None):
            raise DataError(f"{source}: record-level DP-SGD accounting is {'missing' if self.record else 'present'}, "
                            f"but this run {'has' if self.record else 'has no'} train.dpsgd")
        # checkpoints written before code versions were recorded: their rounds' code is unknown
        was = (_code_history(st["code"], source) if "code" in st
               else [{"dpfl": None, "commit": None, "modified": None, "from_round": 1}])
        try:
            self.round = st["round"]
            self.w = w.to(self.device, self.w.dtype)
            self.scheme.load_state_dict(st["scheme"])
            if self.attack is not None and st.get("attack") is not None:
                self.attack.load_state_dict(st["attack"])
            if st["ledger"] is not None:
                self.ledger.load_state_dict(st["ledger"])
            if self.record is not None:
                self.record.load_state_dict(st["record"])
            self.cum = {k: type(v)(st["cum"][k]) for k, v in self.cum.items()}
            self.best = st["best"]
            self.stopped_reason = st.get("stopped")
            self.noise_key = st.get("noise_key")
            if self.noise_key is not None and (not isinstance(self.noise_key, bytes) or len(self.noise_key) != 32):
                raise ValueError("'noise_key' must be 32 bytes")
            self.sites, self.site_salt = _sites(st, self.cfg.data.n_clients)
            # a new part when other code, or another device or CPU, runs the rest (unknown where: code alone)
            here = self.code[0]["ran_on"]  # this process's part, set in __init__
            last = {k: v for k, v in was[-1].items() if k not in ("from_round", "ran_on")} if was else None
            moved = bool(was) and was[-1].get("ran_on", here) != here
            self.code = (was if last == code_version() and not moved
                         else [*was, {**code_version(), "ran_on": here, "from_round": self.round + 1}])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
            raise DataError(f"{source}: does not fit this run ({type(e).__name__}: {e})") from None
        self._fresh = False

    @classmethod
    def resume(cls, out_dir: str | Path, log: Callable[[str], None] = print, rounds: int | None = None,
               allow_recalibration: bool = False, resources: dict[str, Any] | None = None, data: bool = True) -> Self:
        """Continue the run in `out_dir` from its checkpoint (optionally to `rounds` rounds in total;
        `resources`: this process's run.threads / device / max_cohort / checkpoint_every, else the run's;
        `data=False`: a server without data; a deployed server's `sites` and `site_salt` come back from
        the checkpoint, to check the sites' data against).

        Refuses (DpflError) a checkpoint that is not plain data or is corrupt, data that differ from
        the run's, fewer rounds than already run, and a noise multiplier σ that changed (e.g. one that
        `rounds` re-calibrates) unless `allow_recalibration`."""
        out = Path(out_dir)
        if not (out / CONFIG).is_file() or not (out / CHECKPOINT).is_file():
            raise ConfigError(f"{out} is not a resumable run directory (needs {CONFIG} and {CHECKPOINT})")
        cfg = load_config(out / CONFIG)
        st = ckpt.load(out / CHECKPOINT)
        metrics = _read_metrics(out / METRICS)
        done = st.get("round")
        if rounds is not None:
            if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
                raise ConfigError(f"the total number of rounds must be an integer >= 1, got {rounds!r}")
            if isinstance(done, int) and rounds < done:
                raise ConfigError(f"{out} has already run {done} rounds; the total number of rounds must be "
                                  f">= {done}, got {rounds}")
            cfg.federation.rounds = rounds
        if resources:
            bad = sorted(set(resources) - set(RESUME_RESOURCES))
            if bad:
                raise ConfigError(f"a resume takes only {', '.join(RESUME_RESOURCES)} from outside the run, got {bad}")
            try:
                cfg.run = cfg.run.model_validate({**cfg.run.model_dump(), **resources})
            except ValidationError as e:
                err = e.errors()[0]
                raise ConfigError(f"run.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        was = st.get("data")
        if isinstance(was, dict) and ("sites" in was) == data:  # the server's data came or went
            held = "no data (evaluation = 'federated')" if data else "data (evaluation = 'server' or 'both')"
            raise ConfigError(f"{out} was run by a server holding {held}; resume it with the same evaluation")
        sim = cls(cfg, out, log, data=data, _resuming=True)
        sim.load_state_dict(st, str(out / CHECKPOINT))
        now = sim.data_record()
        if data and was is not None and (was.get("dataset"), was.get("sha256")) != (now["dataset"], now["sha256"]):
            raise DataError(f"{out}: the data differ from the run's: it used {was.get('dataset')} "
                            f"(sha256 {str(was.get('sha256'))[:12]}), now {now['dataset']} (sha256 "
                            f"{now['sha256'][:12]}); refusing to resume on other data")
        if was is None and data:
            log(f"note: {out / CHECKPOINT} predates data records: the data could not be checked")
        planned = load_config(out / CONFIG).federation.rounds
        old = st.get("sigmas")
        if old is None and cfg.federation.rounds != planned:
            old = sim._sigmas_for_rounds(planned)
        if old is not None and old != sim.sigmas():
            change = ", ".join(f"{a} -> {b}" for a, b in zip(old, sim.sigmas()) if a != b)
            why = (f"with {cfg.federation.rounds} rounds instead of {planned}" if cfg.federation.rounds != planned
                   else "(the calibration differs from the one the run used)")
            if not allow_recalibration:
                raise ConfigError(f"resuming {out} {why} would change the noise multiplier σ ({change}); "
                                  "pass --allow-recalibration to accept that")
            log(f"σ re-calibrated on resume {why}: {change}")
        kept = [ln for ln, r in metrics if r <= sim.round]  # drop metric lines written after the checkpoint
        if (out / METRICS).exists():
            ckpt.write_text(out / METRICS, "".join(ln + "\n" for ln in kept))
        return sim

    def _sigmas_for_rounds(self, rounds: int) -> list[float | None]:
        """The σ of each step had the scheme been built for `rounds` rounds."""
        env = {**self._scheme_env(), "rounds": rounds}
        extra = [] if self.record_sigma is None else [self._record_sigma(rounds)]
        return [s.sigma for s in build_scheme(self.cfg.scheme.name, dict(self.cfg.scheme.options),
                                                                env).steps] + extra


def _read_metrics(path: Path) -> list[tuple[str, int]]:
    """(line, round) of each metrics record. A last line cut short (a kill during an append) is
    dropped; a bad line before it is a DataError naming the file and line."""
    if not path.exists():
        return []
    lines = path.read_bytes().decode("utf-8", "surrogateescape").split("\n")  # bad bytes: a bad line
    complete = lines[-1] == ""  # the file ends with a newline
    lines = lines[:-1] if complete else lines
    out = []
    for i, ln in enumerate(lines, 1):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except ValueError as e:
            if i == len(lines) and not complete:
                break  # partial last line
            raise DataError(f"{path}: line {i} is not JSON ({e})") from None
        r = rec.get("round") if isinstance(rec, dict) else None
        if not isinstance(r, int):
            if i == len(lines) and not complete:
                break
            raise DataError(f"{path}: line {i} is not a metrics record (no integer 'round')")
        out.append((ln, r))
    return out


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable), or None where unknown."""
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine(device: torch.device) -> dict[str, Any]:
    """Where a run finished: what a reader needs to compare its wall times (and to tell why a rerun on
    another CPU rounds differently: the same model name can come with other vector instructions)."""
    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    out = {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "device": str(device),
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}  # the kernels torch picked: AVX2, AVX512…
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def ran_on(device: torch.device) -> str:
    """The device and CPU kernels that ran a part of a run, in one line (a resume elsewhere adds a part)."""
    m = machine(device)
    return f"{m['device']}: " + (f"{m['gpu']} on " if "gpu" in m else "") + f"{m['cpu']} ({m['cpu_capability']})"


@functools.cache
def code_version() -> dict[str, Any]:
    """The dpfl code this process runs: version, git commit and whether tracked files under dpfl/
    differ from it (commit and modified are None outside a git checkout, e.g. an installed wheel)."""
    import subprocess

    import dpfl

    root = Path(dpfl.__file__).resolve().parent.parent
    out: dict[str, Any] = {"dpfl": dpfl.__version__, "commit": None, "modified": None}
    if not (root / ".git").exists():
        return out
    try:
        git = ["git", "-C", str(root)]
        sha = subprocess.run([*git, "rev-parse", "HEAD"], check=False, capture_output=True, text=True, timeout=10)
        changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "dpfl"],
                                 check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return out
    if sha.returncode == 0 and changed.returncode == 0:
        out.update(commit=sha.stdout.strip(), modified=bool(changed.stdout.strip()))
    return out


def _code_history(v: Any, source: str) -> list[dict[str, Any]]:
    """A checkpoint's list of the code versions that ran its rounds, checked to be plain data."""
    ok = isinstance(v, list) and all(
        isinstance(e, dict) and set(e) - {"ran_on"} == {"dpfl", "commit", "modified", "from_round"}
        and isinstance(e.get("ran_on", ""), str)
        and isinstance(e["from_round"], int) and not isinstance(e["from_round"], bool)
        and all(x is None or isinstance(x, str) for x in (e["dpfl"], e["commit"]))
        and (e["modified"] is None or isinstance(e["modified"], bool)) for e in v)
    if not ok:
        raise DataError(f"{source}: 'code' must be a list of code versions (dpfl, commit, modified, from_round)")
    return v


def _sites(st: dict[str, Any], n: int) -> tuple[dict[int, str], bytes | None]:
    """A checkpoint's site data MACs and their salt (a deployment's), checked to be plain data; a
    checkpoint from before they were kept has none."""
    sites, salt = st.get("sites", {}), st.get("site_salt")
    if not isinstance(sites, dict) or not all(
            isinstance(c, str) and c.isascii() and c.isdigit() and c == str(int(c)) and int(c) < n
            and isinstance(h, str) and len(h) == 64 and set(h) <= set("0123456789abcdef") for c, h in sites.items()):
        raise ValueError(f"'sites' must map client ids in [0, {n}) to 64-hex-digit data MACs")
    if salt is not None and (not isinstance(salt, bytes) or len(salt) != 32):
        raise ValueError("'site_salt' must be 32 bytes")
    if sites and salt is None:
        raise ValueError("'sites' holds data MACs without their salt")
    return {int(c): h for c, h in sites.items()}, salt
