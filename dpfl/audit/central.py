"""Central DP-SGD audit (`dpfl dpsgd`): canary records through `dpfl.dpsgd.train`, its Poisson sampling,
per-example clipping, noise and ledger unchanged (Steinke, Nasr & Jagielski 2023, §5).

The config is a TOML file with a `name` and a `[dpsgd]` table holding the options of `dpfl dpsgd train`
(`dpfl.dpsgd.central.DPSGDConfig`); σ, q = lot_size / N and T = epochs / q are planned from the real N
training examples exactly as `dpfl dpsgd train` plans them, and the canaries are records added to them,
each with probability 1/2 (independent coins, one stream per kind of canary).

Input canaries (both `--observe` modes; the black box): m test examples with their features shuffled
and a wrong label, as in the record-level audit (drawn with replacement where m exceeds the test set:
each has its own shuffle and label). Score ℓ_j(θ_0) − ℓ_j(θ_T): how much the final model
learnt the wrong label.

Gradient canaries (`--observe white` adds them; the white box): m records whose per-example gradient is
a fixed direction, Steinke et al.'s "Dirac canaries". The trained model is the config's model wrapped in
`GradientCanaryModel`, which adds m parameters c_1 … c_m that no real record's loss touches. Canary j's
loss has gradient 10·C·e_j with respect to c (and 0 with respect to the real model), so the real
per-example clipping cuts it to C·e_j; DP-SGD then adds its noise to every coordinate as to any other.
On c_j the run is exactly the Poisson-subsampled Gaussian mechanism the ledger accounts, with no
interference from the real gradients. Score (c_j(0) − c_j(T)) / η = Σ_t g̃_t[j], the sum of the noisy
gradient's coordinate j over every released step (with momentum 0; with momentum μ each step is
weighted by (1 − μ^(T−t+1)) / (1 − μ)): the final parameters give it exactly, so no hook into the
training loop is needed. The wrapper's extra parameters send `clipped_sum` to the per-example (vmap)
path, so a white-box run does not exercise the book-keeping path that the plain model may take; the
black-box-only run (`--observe black`) trains the plain model on the path `dpfl dpsgd train` takes.
"""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn
from torch.func import functional_call

from dpfl.config import apply_overrides
from dpfl.dpsgd.central import DPSGDConfig, plan_for
from dpfl.errors import ConfigError

CANARY_GRADIENT = 10.0  # a gradient canary's raw gradient norm, in units of the clip bound C


@dataclass
class CentralConfig:
    """A central DP-SGD run to audit: its name, `dpfl dpsgd train`'s options, and the torch threads to use
    (None: torch's default)."""

    name: str
    dpsgd: DPSGDConfig
    threads: int | None = None

    def toml(self) -> str:
        import tomli_w

        top = {"name": self.name, **({"threads": self.threads} if self.threads is not None else {})}
        return tomli_w.dumps({**top, "dpsgd": self.dpsgd.model_dump(mode="json", exclude_none=True)})


def is_central(path: str | Path) -> bool:
    """Whether a TOML file is a central DP-SGD config (a top-level [dpsgd] table)."""
    try:
        return "dpsgd" in tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False


def load_central_config(path: str | Path, overrides: list[str] | None = None) -> CentralConfig:
    """`name` and `[dpsgd]` from a TOML file, with `dpsgd.key=value` overrides (ConfigError in one line)."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    raw = apply_overrides(raw, overrides or [])
    extra = sorted(set(raw) - {"name", "threads", "dpsgd"})
    if extra:
        raise ConfigError(f"{p}: a central DP-SGD config has only `name`, `threads` and a [dpsgd] table; "
                          f"{', '.join(extra)} do not apply")
    threads = raw.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"{p}: threads must be an integer ≥ 1, got {threads!r}")
    if not isinstance(raw.get("dpsgd"), dict):
        raise ConfigError(f"{p}: [dpsgd] must be a table of `dpfl dpsgd train` options")
    try:
        cfg = DPSGDConfig(**raw["dpsgd"])
    except ValidationError as e:
        why = "; ".join(f"dpsgd{''.join('.' + str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{p}: {why}") from None
    return CentralConfig(str(raw.get("name", p.stem)), cfg, threads)


class GradientCanaryModel(nn.Module):
    """`base` plus m canary parameters c (see the module docstring).

    Input rows are the base model's input flattened, with one more column: 0 for a real record, j + 1
    for gradient canary j. A real row's output is base(x); canary j's is the logits (g·(c_j − c_j'), 0, …,
    0), c_j' = c_j detached, so its value is 0 and the cross-entropy gradient with respect to c is exactly
    g / K · e_j for any label but 0 (K classes). g = 10·C·K makes that 10·C."""

    def __init__(self, base: nn.Module, canaries: int, in_shape: tuple[int, ...], classes: int, clip: float):
        super().__init__()
        self.base = base
        self.canary = nn.Parameter(torch.zeros(int(canaries), dtype=next(base.parameters()).dtype))
        self.in_shape, self.classes = tuple(in_shape), int(classes)
        self.gain = CANARY_GRADIENT * float(clip) * self.classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, tag = x[:, :-1], x[:, -1]
        out = self.base(feats.reshape(x.shape[0], *self.in_shape))
        j = (tag.round().long() - 1).clamp(min=0)
        c = self.canary[j]
        logit = self.gain * (c - c.detach())
        canary_out = F.pad(logit[:, None], (0, self.classes - 1))
        return torch.where((tag > 0)[:, None], canary_out.to(out.dtype), out)


def _input_canaries(x_test: torch.Tensor, y_test: torch.Tensor, m: int, classes: int, rng: np.random.Generator):
    """m test examples (drawn with replacement only when m exceeds them), features shuffled (each canary in
    an order of its own) and the label shifted by 1 … K−1."""
    pick = torch.from_numpy(rng.choice(len(y_test), size=m, replace=m > len(y_test)))
    shift = torch.from_numpy(rng.integers(1, classes, size=m))
    x = x_test[pick]
    flat = x.reshape(m, -1)
    order = torch.from_numpy(np.argsort(rng.random(flat.shape), axis=1))
    return torch.gather(flat, 1, order).reshape(x.shape), (y_test[pick] + shift.to(y_test.dtype)) % classes


@torch.no_grad()
def _losses(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    out = [F.cross_entropy(functional_call(model, params, (xb,)), yb, reduction="none")
           for xb, yb in zip(x.split(500), y.split(500))]
    return torch.cat(out).to(torch.float64).numpy()


def run_central_audit(cfg: CentralConfig, canaries: int, observe: str = "white", out_dir: str | Path | None = None,
                      log: Callable[[str], None] = print, overwrite: bool = False) -> dict[str, Any]:
    """Train once with canary records through `dpfl.dpsgd.train`; return their scores and the accounting."""
    if observe not in ("white", "black"):
        raise ConfigError(f"observe must be 'white' or 'black', got {observe!r}")
    before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, canaries, observe, out_dir, log, overwrite)
    finally:
        torch.set_num_threads(before)


def _run(cfg: CentralConfig, canaries: int, observe: str, out_dir: str | Path | None, log: Callable[[str], None],
         overwrite: bool) -> dict[str, Any]:
    from dpfl.data import load_dataset
    from dpfl.dpsgd.ghost import path_for
    from dpfl.dpsgd.train import train
    from dpfl.models import build_model, count_params
    from dpfl.rng import Seeds

    c = cfg.dpsgd
    if out_dir is not None:
        out = Path(out_dir)
        if (out / "summary.json").exists() and not overwrite:
            raise ConfigError(f"{out} already holds a run: pass --overwrite to replace it, or another --out")
    ds = load_dataset(c.dataset, seed=c.seed, n_train=c.n_train, n_test=c.n_test)
    if ds.task != "multiclass":
        raise ConfigError(f"a central DP-SGD audit mislabels canaries of a multiclass task; {ds.name} is {ds.task}")
    n = ds.n_train
    plan = plan_for(c, n)
    q = plan.sample_rate
    m, classes, seeds = int(canaries), int(ds.num_classes), Seeds(c.seed)
    cx, cy = _input_canaries(ds.x_test, ds.y_test, m, classes, seeds.numpy("audit", "records"))
    inc_input = seeds.numpy("audit", "include", "inputs").random(m) < 0.5
    keep = torch.from_numpy(inc_input)
    x, y = torch.cat([ds.x_train, cx[keep]]), torch.cat([ds.y_train, cy[keep]])
    base = build_model(c.model, seed=c.seed, **c.model_options)
    model: nn.Module = base
    inc_grad = None
    xt = ds.x_test
    if observe == "white":
        inc_grad = seeds.numpy("audit", "include", "gradients").random(m) < 0.5
        model = GradientCanaryModel(base, m, tuple(ds.x_train.shape[1:]), classes, c.clip)
        tags = torch.from_numpy(np.flatnonzero(inc_grad) + 1).to(x.dtype)
        flat = x.reshape(len(x), -1)
        x = torch.cat([torch.cat([flat, torch.zeros(len(flat), 1, dtype=x.dtype)], 1),
                       torch.cat([torch.zeros(len(tags), flat.shape[1], dtype=x.dtype), tags[:, None]], 1)])
        y = torch.cat([y, torch.ones(len(tags), dtype=y.dtype)])
        xt = torch.cat([xt.reshape(len(xt), -1), torch.zeros(len(xt), 1, dtype=xt.dtype)], 1)
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    log(f"central DP-SGD on {ds.name}: {n} records + {int(inc_input.sum())} input canaries"
        + (f" + {int(inc_grad.sum())} gradient canaries" if inc_grad is not None else "")
        + f"; σ = {plan.noise_multiplier:.4f}, q = {q:.5f}, T = {plan.steps}")
    t0 = time.perf_counter()
    res = train(model, x, y, plan=plan, clip=c.clip, lr=c.lr, seeds=seeds, delta=c.delta, momentum=c.momentum,
                loss="ce", chunk_size=c.chunk_size, accountant=c.accountant, x_test=xt, y_test=ds.y_test,
                device=c.device)
    seconds = time.perf_counter() - t0
    params = {k: v.detach().cpu() for k, v in res.params.items()}
    prefix = "base." if observe == "white" else ""
    p0 = {k[len(prefix):]: v for k, v in w0.items() if k.startswith(prefix)}
    pT = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
    black = _losses(base, p0, cx, cy) - _losses(base, pT, cx, cy)
    white = None
    if inc_grad is not None:
        white = ((w0["canary"] - params["canary"]).to(torch.float64) / c.lr).numpy()
    summary = {
        "name": cfg.name, "level": "central", "scheme": "dpsgd",
        "describe": f"dpsgd: Poisson q={q:.5g} → per-example clip(C={c.clip}) → gaussian(σ={plan.noise_multiplier:.6g}) "
                    f"/ (q·N), {plan.steps} steps",
        "dataset": ds.name, "n_train": n, "n_test": ds.n_test, "model": c.model, "params": count_params(base),
        "clipping_path": path_for(model), "noise_multiplier": plan.noise_multiplier, "sample_rate": q,
        "steps": plan.steps, "rounds_run": plan.steps, "clip": c.clip, "lr": c.lr, "epsilon": res.epsilon,
        "epsilon_final": res.epsilon, "delta": c.delta, "accountant": c.accountant,
        "test_accuracy": res.test_accuracy, "mean_lot_size": res.mean_lot_size, "seconds": round(seconds, 1),
        "history": res.history, "machine": {"torch": torch.__version__, "threads": torch.get_num_threads()},
    }
    if out_dir is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(cfg.toml())
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    included = inc_grad if inc_grad is not None else inc_input
    return {"level": "central", "summary": summary, "included": included, "included_inputs": inc_input,
            "scores": {"white": white, "black": black}, "epsilon": res.epsilon, "delta": c.delta,
            "canary": "white: gradient canaries (Dirac, one parameter each); black: test examples, features "
                      "shuffled, wrong label"}
