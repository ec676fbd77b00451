"""The table of committed audit runs (docs/audit/<run>/audit.json), generated for docs/audit.md by
`dpfl publish` (block `audit`); nothing in it is typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

from dpfl.errors import ConfigError

# row order: client-level FL-STD-DP, FL-SIGN-DP, record-level DP-SGD in the clients, central DP-SGD, then the
# other client-level schemes by name; within a mechanism by accounted ε
_FIRST = ("fl-std-dp", "fl-sign-dp", "record", "central")


def _mechanism(a: dict) -> str:
    if a["level"] == "client":
        return a["scheme"]
    return a["level"]


def _label(a: dict) -> str:
    if a["level"] == "client":
        return f"{a['scheme'].upper()} (client level)"
    if a["level"] == "record":
        return f"DP-SGD in the clients ({a['scheme'].upper()}, record level)"
    return "central DP-SGD (`dpfl dpsgd`)"


def _key(a: dict) -> tuple:
    mech = _mechanism(a)
    return (_FIRST.index(mech) if mech in _FIRST else len(_FIRST), mech, a["epsilon_accounted"])


def load_runs(root: Path) -> list[tuple[Path, dict, dict]]:
    """(run directory, audit.json, summary.json) of every run under root, in table order."""
    runs = []
    for path in sorted(Path(root).glob("*/audit.json")):
        d = path.parent
        if not (d / "summary.json").is_file() or not (d / "config.toml").is_file():
            raise ConfigError(f"{d}: an audit record needs audit.json, config.toml and summary.json")
        runs.append((d, json.loads(path.read_text()), json.loads((d / "summary.json").read_text())))
    if not runs:
        raise ConfigError(f"{root} holds no audit run (*/audit.json)")
    return sorted(runs, key=lambda r: _key(r[1]))


def _bound(a: dict, box: str) -> str:
    b = a.get(box)
    if b is None:
        return "—"
    return f"{b['epsilon_lower_bound']:.3f} ({b['epsilon_lower_bound'] / a['epsilon_accounted']:.2f})"


def _setting(a: dict, s: dict) -> str:
    if a["level"] == "central":
        return (f"{s['n_train']} records, q = {s['sample_rate']:.3g}, {s['steps']} steps, "
                f"σ = {s['noise_multiplier']:.3f}")
    rounds = a.get("rounds_run")
    if a["level"] == "record":
        rl = s.get("record_level", {})
        sigma = f", DP-SGD σ = {rl['noise_multiplier']:.3f}" if "noise_multiplier" in rl else ""
        return f"{rounds} rounds{sigma}"
    sig = s.get("describe", "")
    sigma = sig.split("σ=")[1].split(",")[0] if "σ=" in sig else None
    q = sig.split("q=")[1].split(")")[0] if "q=" in sig else None
    parts = [f"{rounds} rounds"] + ([f"q = {q}"] if q else []) + ([f"σ = {float(sigma):.3f}"] if sigma else [])
    return ", ".join(parts)


def _dataset(a: dict, s: dict) -> str:
    return (s.get("data") or {}).get("dataset") or s.get("dataset") or "?"


def audit_block(root: Path, rel: str) -> str:
    """Markdown table: one row per committed audit run (links relative to the doc: `rel`/<run>)."""
    lines = [("| mechanism | dataset | accounted ε (δ) | white-box bound (/ ε) | black-box bound (/ ε) | "
              "canaries (included) | setting | record |"),
             "|---|---|---|---|---|---|---|---|"]
    for d, a, s in load_runs(root):
        inc = f"{a['included']}" + (f" / {a['included_inputs']}" if "included_inputs" in a else "")
        lines.append(f"| {_label(a)} | {_dataset(a, s)} | {a['epsilon_accounted']:.3f} ({a['delta']:g}) | "
                     f"{_bound(a, 'white')} | {_bound(a, 'black')} | {a['canaries']} ({inc}) | {_setting(a, s)} | "
                     f"[{d.name}]({rel}/{d.name}) |")
    return "\n".join(lines)
