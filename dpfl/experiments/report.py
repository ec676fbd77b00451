"""Best-round tables and plots of run directories."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dpfl.errors import ConfigError


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    run_dir = Path(run_dir)
    mfile = run_dir / "metrics.jsonl"
    if not mfile.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no metrics.jsonl)")
    metrics = [json.loads(ln) for ln in mfile.read_text().splitlines() if ln.strip()]
    sfile = run_dir / "summary.json"
    summary = json.loads(sfile.read_text()) if sfile.is_file() else {}
    if not summary.get("best"):
        summary["best"] = best_round(metrics)
    summary.setdefault("name", run_dir.name)
    return summary, metrics


def best_round(metrics: list[dict], key: str | None = None) -> dict | None:
    evals = [m for m in metrics if "accuracy" in m]
    if not evals:
        return None
    key = key or ("balanced_accuracy" if "balanced_accuracy" in evals[0] else "accuracy")
    best = None
    for m in evals:
        if best is None or m[key] > best[key]:
            best = m
    return {**best, "metric": key}


def kb(b: float) -> str:
    return f"{b / 1000:,.2f}"


def report_runs(run_dirs: list[Path], out: Path, console: Console) -> None:
    runs = [(Path(d), *load_run(d)) for d in run_dirs]
    t = Table(title="best round (thesis protocol: best over all rounds; costs and ε at that round)")
    for c in ("run", "scheme", "metric", "value", "round", "up KB/client", "thesis-formula up KB", "down KB/client", "ε"):
        t.add_column(c, justify="right" if c not in ("run", "scheme", "metric") else "left")
    for d, s, _ in runs:
        b = s.get("best") or {}
        key = b.get("metric", "accuracy")
        eps = b.get("epsilon")
        t.add_row(s.get("name", d.name), str(s.get("scheme", "")), key,
                  f"{b.get(key, float('nan')):.4f}" if b else "-", str(b.get("round", "-")),
                  kb(b.get("cum_up_bytes_per_client", 0)), kb(b.get("formula_up_bytes_per_client", 0)),
                  kb(b.get("cum_down_bytes_per_client", 0)), "-" if eps is None else f"{eps:.3f}")
    console.print(t)
    write_plots(runs, Path(out), console)


def write_plots(runs, out: Path, console: Console) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for xkey, xlabel, fname in (("round", "round", "accuracy_vs_round.png"),
                                ("cum_up_bytes_per_client", "cumulative upstream bytes per client",
                                 "accuracy_vs_upstream.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for d, s, metrics in runs:
            ev = [m for m in metrics if "accuracy" in m]
            if not ev:
                continue
            ykey = "balanced_accuracy" if "balanced_accuracy" in ev[0] else "accuracy"
            ax.plot([m[xkey] for m in ev], [m[ykey] for m in ev], label=s.get("name", d.name))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy")
        if xkey != "round":
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = out / fname
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
        console.print(f"wrote {p}")
    return paths
