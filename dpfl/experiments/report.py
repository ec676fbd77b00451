"""Best-round tables and plots of run directories (`dpfl report`), and the pieces `reproduce` and
`publish` share: run labels, byte units, tables that fit the terminal, deterministic figures."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dpfl.compression.costs import human_bytes
from dpfl.errors import ConfigError, DataError


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    run_dir = Path(run_dir)
    mfile = run_dir / "metrics.jsonl"
    if not mfile.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no metrics.jsonl)")
    lines = mfile.read_text(errors="replace").splitlines()
    metrics = []
    for i, ln in enumerate(lines, 1):
        try:
            m = json.loads(ln) if ln.strip() else None
        except ValueError:
            if i == len(lines):  # a half-written last line (a run killed mid-append): not a round
                break
            raise DataError(f"{mfile}: line {i} is not a JSON metrics record") from None
        if m is not None and not isinstance(m, dict):
            raise DataError(f"{mfile}: line {i} is not a JSON metrics record")
        if m is not None:
            metrics.append(m)
    sfile = run_dir / "summary.json"
    try:
        summary = json.loads(sfile.read_text()) if sfile.is_file() else {}
    except ValueError:
        raise DataError(f"{sfile}: not readable JSON") from None
    if not isinstance(summary, dict):
        raise DataError(f"{sfile}: not a JSON object")
    if not summary.get("best"):
        summary["best"] = best_round(metrics)
    if "name" not in summary and (run_dir / "config.toml").is_file():  # a run not finished yet
        import tomllib

        cfg = tomllib.loads((run_dir / "config.toml").read_text())
        summary["name"] = cfg.get("name", run_dir.name)
        summary.setdefault("scheme", cfg.get("scheme", {}).get("name", ""))
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


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(base, cfg) -> list[str]:
    """`key=value` for every setting of `cfg` that differs from `base` (both RunConfig), in `--set` syntax."""
    a = _flat(base.model_dump(mode="json", exclude_none=True))
    b = _flat(cfg.model_dump(mode="json", exclude_none=True))
    out = []
    for k in sorted(set(a) | set(b)):
        if k != "name" and a.get(k) != b.get(k):
            out.append(f"{k}=" + ("(unset)" if k not in b else json.dumps(b[k], ensure_ascii=False)))
    return out


def _named_overrides(run_dir: Path, name: str) -> list[str] | None:
    """What the run changed against the built-in config of its name, or None when there is no such config."""
    from dpfl.config import load_config
    from dpfl.experiments import configs_root

    named = configs_root() / f"{name}.toml"
    cfg_file = run_dir / "config.toml"
    if not (named.is_file() and cfg_file.is_file()):
        return None
    try:
        return config_diff(load_config(named), load_config(cfg_file))
    except ConfigError:
        return None


def run_labels(runs: list[tuple[Path, dict, list]], max_len: int = 70) -> tuple[list[str], dict[str, list[str]]]:
    """Distinct labels: the config name plus what was overridden vs the built-in config of that name
    (only what differs between runs of the same name; what they share is returned per name); where
    labels still collide, the run directory's name (with its parent when those collide too)."""
    names = [str(s.get("name", Path(d).name)) for d, s, _ in runs]
    overs = [_named_overrides(Path(d), n) or [] for n, (d, _, _) in zip(names, runs)]
    shared: dict[str, list[str]] = {}
    for n in dict.fromkeys(names):  # first-seen order
        group = [o for m, o in zip(names, overs) if m == n]
        if len(group) > 1:
            common = [x for x in group[0] if all(x in o for o in group[1:])]
            if common:
                shared[n] = common
    labels = []
    for n, o in zip(names, overs):
        own = [x for x in o if x not in shared.get(n, [])]
        label = f"{n} ({', '.join(own)})" if own else n
        labels.append(label if len(label) <= max_len else n)
    for attempt in (lambda d: Path(d).name, lambda d: f"{Path(d).parent.name}/{Path(d).name}", str):
        dup = {x for x in labels if labels.count(x) > 1}
        if not dup:
            break
        labels = [attempt(d) if lab in dup else lab for lab, (d, _, _) in zip(labels, runs)]
    return labels, shared


def print_fitted(console: Console, title: str, columns: list[tuple[str, int]], rows: list[list[str]],
                 wide: bool = False) -> list[str]:
    """Print a table of `columns` = (header, drop order: 0 never, higher numbers go first) that fits the
    terminal: columns are dropped until it does; returns the dropped headers. With `wide`, or when the
    output is not a terminal (a file, a pipe), every column is printed and nothing is cut."""
    def need(i):
        return max([len(w) for w in columns[i][0].split()] + [len(r[i]) for r in rows])

    def width(idx):
        return 1 + sum(3 + need(i) for i in idx)

    keep = list(range(len(columns)))
    dropped = []
    fit = not wide and console.is_terminal
    if fit:
        empty = {i for i in keep if rows and all(r[i] in ("-", "") for r in rows)}  # these go first
        for i in sorted((i for i in keep if columns[i][1] > 0 or i in empty),
                        key=lambda i: (i not in empty, -columns[i][1], -i)):
            if width(keep) <= console.width:
                break
            keep.remove(i)
            dropped.append(columns[i][0])
    widths = {i: need(i) for i in keep}
    if fit and width(keep) > console.width:  # still too wide: the first (label) column wraps, numbers never
        widths[0] = max(8, widths[0] - (width(keep) - console.width))
    t = Table(title=title)
    for i in keep:
        left = i == 0 or columns[i][0] in ("run", "row", "scheme", "metric")
        t.add_column(columns[i][0], justify="left" if left else "right", overflow="fold",
                     width=widths[i] if fit else None)  # fitted: headers wrap at spaces, cells never do
    for r in rows:
        t.add_row(*(r[i] for i in keep))
    saved = console.width
    if not fit:  # never squeeze numbers, also when piped to a file
        console.width = max(saved, width(keep) + 40)
    console.print(t)
    console.width = saved
    return dropped


def report_runs(run_dirs: list[Path], out: Path, console: Console, wide: bool = False) -> list[Path]:
    """The best-round table and plots of the training runs; an audit-only directory (audit.json, no
    metrics.jsonl: a central DP-SGD audit, or a committed audit record) prints its audit alone."""
    audit_only = [Path(d) for d in run_dirs
                  if not (Path(d) / "metrics.jsonl").is_file() and (Path(d) / "audit.json").is_file()]
    for d in audit_only:
        print_audit(console, load_audit(d), d, title=f"privacy audit of {d.name}")
    run_dirs = [d for d in run_dirs if Path(d) not in audit_only]
    if not run_dirs:
        return []
    runs = [(Path(d), *load_run(d)) for d in run_dirs]
    labels, shared = run_labels(runs)
    cols = [("run", 0), ("scheme", 3), ("metric", 6), ("value", 0), ("best round", 0), ("up / client", 0),
            ("formula up", 5), ("down / client", 4), ("ε", 0)]
    rows = []
    for label, (d, s, metrics) in zip(labels, runs):
        b = s.get("best") or {}
        key = b.get("metric", "accuracy")
        eps = b.get("epsilon")
        last = metrics[-1]["round"] if metrics else 0
        rows.append([label, str(s.get("scheme", "")), key, f"{b[key]:.4f}" if b else "-",
                     f"{b['round']} of {last}" if b else "-", human_bytes(b.get("cum_up_bytes_per_client")),
                     human_bytes(b.get("formula_up_bytes_per_client")), human_bytes(b.get("cum_down_bytes_per_client")),
                     "-" if eps is None else f"{eps:.3f}"])
    dropped = print_fitted(console, "best round of each run", cols, rows, wide)
    console.print("thesis protocol: best over all rounds; costs (cumulative per client of the population) and ε "
                  "at that round" + (f"; not shown for width: {', '.join(dropped)} (--wide)" if dropped else ""),
                  highlight=False)
    for name, common in shared.items():
        console.print(f"all {name} runs: {', '.join(common)}", highlight=False)
    for label, (d, _, _) in zip(labels, runs):
        audit = load_audit(d)
        if audit is not None:
            print_audit(console, audit, d, title=f"privacy audit of {label}")
    return write_plots(runs, Path(out), console, labels)


# ---- privacy audits (audit.json, written by `dpfl audit`) ------------------------------------------

def load_audit(run_dir: Path) -> dict | None:
    """The run's audit.json, or None if it has none."""
    path = Path(run_dir) / "audit.json"
    if not path.is_file():
        return None
    try:
        audit = json.loads(path.read_text())
    except ValueError:
        raise DataError(f"{path}: not readable JSON") from None
    if not isinstance(audit, dict) or "epsilon_accounted" not in audit or "confidence" not in audit:
        raise DataError(f"{path}: not an audit record (no epsilon_accounted / confidence)")
    return audit


def print_audit(console: Console, audit: dict, run_dir: Path | None = None, title: str = "privacy audit") -> None:
    """The accounted ε beside the empirical lower bounds (and Andrew et al.'s estimates) of an audit."""
    def num(v) -> str:
        return "-" if v is None else f"{v:.3f}"

    t = Table(title=title)
    for c in ("observed", "accounted ε", "lower bound", "bound / accounted", "guesses (correct)",
              "Andrew et al. estimate"):
        t.add_column(c, justify="left" if c == "observed" else "right")
    eps = audit.get("epsilon_accounted")
    for box in ("white", "black"):
        b = audit.get(box)
        if b is None:
            continue
        lb = b["epsilon_lower_bound"]
        t.add_row(f"{box} box", num(eps), num(lb), "-" if not eps else f"{lb / eps:.2f}",
                  f"{b['guesses']} ({b['correct']})", num((b.get("andrew_estimate") or {}).get("epsilon")))
    console.print(t)
    what = "canary clients" if audit.get("level") == "client" else "canary records"
    console.print(f"{audit.get('canaries')} {what}, {audit.get('included')} included; lower bound at confidence "
                  f"{audit.get('confidence')} and δ = {audit.get('delta')} (Steinke et al., best of "
                  f"{next((audit[b]['choices'] for b in ('white', 'black') if b in audit), '?')} guess counts, "
                  "Bonferroni); the estimate is a Gaussian fit, not a bound", highlight=False, soft_wrap=True)
    if audit.get("flagged"):
        console.print("[red]FLAGGED[/red]: an empirical lower bound exceeds the accounted ε — the implementation "
                      "does not deliver the ε it prints (or this was the 1 − confidence chance)", soft_wrap=True)
    else:
        console.print("not flagged: no lower bound exceeds the accounted ε (an audit cannot prove the ε holds)",
                      highlight=False, soft_wrap=True)
    if run_dir is not None:
        console.print(f"audit record: {Path(run_dir) / 'audit.json'}", highlight=False, soft_wrap=True)


# ---- figures -------------------------------------------------------------------------------------

def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Fixed dpi and no software/time metadata: the same data gives the same PNG bytes."""
    fig.savefig(path, dpi=100, metadata={"Software": None})


def _bytes_axis(ax) -> None:
    """Log x axis labelled in B / KB / MB, minor ticks too where the range is about a decade or less."""
    from matplotlib.ticker import LogFormatter

    class Bytes(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return human_bytes(x).replace(".00 ", " ")

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(Bytes())
    ax.xaxis.set_minor_formatter(Bytes())


def plot_curves(ax, curves: list[tuple[str, list[dict]]], xkey: str, annotate: bool = True) -> None:
    """One line per (label, metrics), y = the run's metric; the best round marked with a star."""
    from matplotlib.ticker import MaxNLocator

    for i, (label, metrics) in enumerate(curves):
        ev = [m for m in metrics if "accuracy" in m and m.get(xkey) is not None]
        if not ev:
            continue
        b = best_round(ev)
        key = b["metric"]
        color = f"C{i % 10}"
        ax.plot([m[xkey] for m in ev], [m[key] for m in ev], color=color, lw=1.2, label=label)
        ax.plot([b[xkey]], [b[key]], marker="*", ms=11, color=color, mec="black", mew=0.5, ls="none")
        if annotate:  # text on the side of the star away from the plot's right edge
            right = ev.index(next(m for m in ev if m["round"] == b["round"])) >= len(ev) / 2
            ax.annotate(f"{b[key]:.4f} @ round {b['round']}", (b[xkey], b[key]), textcoords="offset points",
                        xytext=(-8, 6) if right else (8, 6), ha="right" if right else "left", fontsize=7,
                        color=color)
    if annotate:
        ax.margins(y=0.1)  # room above the highest star for its label
    if xkey == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    elif xkey.endswith("bytes_per_client"):
        _bytes_axis(ax)
    ax.grid(alpha=0.3)


def write_plots(runs, out: Path, console: Console, labels: list[str] | None = None) -> list[Path]:
    """accuracy vs round, vs cumulative upstream bytes per client, and (when any run is private) vs ε."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    labels = labels or run_labels(runs)[0]
    curves = [(lab, metrics) for lab, (_, _, metrics) in zip(labels, runs)]
    if not any(metrics for _, metrics in curves):  # e.g. every row skipped: no empty figures
        console.print("no rounds to plot")
        return []
    figs = [("round", "round", "accuracy_vs_round.png"),
            ("cum_up_bytes_per_client", "cumulative upstream per client", "accuracy_vs_upstream.png")]
    if any(m.get("epsilon") is not None for _, metrics in curves for m in metrics):
        figs.append(("epsilon", "ε spent so far (δ as configured)", "accuracy_vs_epsilon.png"))
    paths = []
    for xkey, xlabel, fname in figs:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        plot_curves(ax, curves, xkey)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (★ best round)")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        p = out / fname
        save_figure(fig, p)
        plt.close(fig)
        paths.append(p)
        console.print(f"wrote {p}")
    return paths
