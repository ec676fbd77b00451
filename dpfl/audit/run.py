"""`audit(cfg, …)`: train once with canaries, guess them, and write the result (`audit.json`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.audit.bound import andrew_estimate, one_run_bound
from dpfl.audit.central import CentralConfig
from dpfl.config import RunConfig
from dpfl.errors import ConfigError

AUDIT = "audit.json"
LEVELS = ("client", "record", "central")


def audit_level(cfg: RunConfig | CentralConfig, level: str | None) -> str:
    """The level to audit: as asked, or the only DP path the config has (ConfigError otherwise)."""
    from dpfl.schemes.index import PRIVATE

    if level is not None and level not in LEVELS:
        raise ConfigError(f"audit level must be 'client', 'record' or 'central', got {level!r}")
    if isinstance(cfg, CentralConfig):
        if level not in (None, "central"):
            raise ConfigError(f"a central DP-SGD config ([dpsgd] table) has no {level}-level DP: --level central "
                              "or none")
        return "central"
    if level == "central":
        raise ConfigError("--level central audits a central DP-SGD config (a TOML file with a [dpsgd] table, "
                          "the options of `dpfl dpsgd train`)")
    client, record = cfg.scheme.name in PRIVATE, cfg.train.dpsgd is not None
    if level is not None:
        if level == "client" and not client:
            raise ConfigError(f"scheme {cfg.scheme.name!r} adds no client-level DP noise: no client-level audit")
        if level == "record" and not record:
            raise ConfigError("the config has no train.dpsgd: no record-level audit")
        return level
    if client and record:
        raise ConfigError("the config has client-level DP and train.dpsgd: choose the level to audit (--level)")
    if not (client or record):
        raise ConfigError(f"scheme {cfg.scheme.name!r} adds no DP noise and the config has no train.dpsgd: "
                          "nothing to audit")
    return "client" if client else "record"


def bounds(scores: np.ndarray, included: np.ndarray, confidence: float, delta: float) -> dict[str, Any]:
    """Steinke et al.'s lower bound and Andrew et al.'s estimate from one set of scores."""
    b = one_run_bound(scores, included, confidence, delta)
    try:
        est = andrew_estimate(scores, included, delta)
    except ValueError as e:
        est = {"epsilon": None, "why": str(e)}
    return {"epsilon_lower_bound": b.epsilon, "guesses": b.guesses, "correct": b.correct, "k_pos": b.k_pos,
            "k_neg": b.k_neg, "choices": b.choices, "andrew_estimate": est}


def audit(cfg: RunConfig | CentralConfig, canaries: int = 1000, confidence: float = 0.95, observe: str = "white",
          level: str | None = None, out_dir: str | Path | None = None, log: Callable[[str], None] = print,
          overwrite: bool = False, scale: float | None = None,
          on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the audit; write `audit.json` into `out_dir` (if given) and return its content."""
    if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 2:
        raise ConfigError(f"--canaries must be an integer ≥ 2, got {canaries!r}")
    if not 0 < confidence < 1:
        raise ConfigError(f"--confidence must be in (0, 1), got {confidence!r}")
    if observe not in ("white", "black"):
        raise ConfigError(f"--observe must be 'white' or 'black', got {observe!r}")
    level = audit_level(cfg, level)
    if level == "client":
        from dpfl.audit.clients import run_client_audit

        res = run_client_audit(cfg, canaries, observe, out_dir, log, overwrite, 10.0 if scale is None else scale,
                               on_round)
    else:
        if scale is not None:
            raise ConfigError(f"--scale (the canary clients' update norm) does not apply to a {level}-level audit")
        if level == "central":
            if on_round is not None:
                raise ConfigError("a central DP-SGD audit has no rounds to report (on_round)")
            from dpfl.audit.central import run_central_audit

            res = run_central_audit(cfg, canaries, observe, out_dir, log, overwrite)
        else:
            from dpfl.audit.records import run_record_audit

            res = run_record_audit(cfg, canaries, observe, out_dir, log, overwrite, on_round)
    included, delta = res["included"], res["delta"]
    # which canaries each score is about (central DP-SGD: gradient canaries white, input canaries black)
    by_box = {"white": included, "black": res.get("included_inputs", included)}
    out: dict[str, Any] = {
        "level": level, "name": cfg.name, "scheme": res["summary"].get("scheme"),
        "describe": res["summary"].get("describe"), "canaries": canaries, "included": int(included.sum()),
        **({"included_inputs": int(res["included_inputs"].sum())} if "included_inputs" in res else {}),
        "confidence": confidence, "delta": delta, "observe": observe,
        "epsilon_accounted": res["epsilon"], "rounds_run": res["summary"].get("rounds_run"),
        **{k: res[k] for k in ("canary_norm", "canary", "released_rounds") if k in res},
    }
    for box in ("white", "black"):
        s = res["scores"].get(box)
        if s is not None:
            out[box] = bounds(s, by_box[box], confidence, delta)
    eps = res["epsilon"]
    out["flagged"] = bool(eps is not None and any(out[b]["epsilon_lower_bound"] > eps
                                                  for b in ("white", "black") if b in out))
    if out_dir is not None:
        path = Path(out_dir) / AUDIT
        path.write_text(json.dumps(out, indent=2) + "\n")
    return out
