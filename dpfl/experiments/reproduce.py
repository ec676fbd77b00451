"""`dpfl reproduce TABLE`: run a thesis table's row configs and print measured vs thesis.

A table is a folder `dpfl/experiments/configs/<table>/` of row configs (`<row>.toml`, full
run configs) and `thesis.json`: `{"_table": {"description": ..., "unit": "KB"|"Mbit"|"MB"},
"<row>": {"accuracy": .., "round": .., "up": .., "down": .., "epsilon": .., "bits": ..}}`.
Rows run one at a time into `<out>/<table>/<row>/`; a finished row is not run again and an
interrupted one resumes from its checkpoint, because a full table takes hours on a CPU.
With `report_only`, nothing runs: the comparison is printed from the run directories already
under `<out>` (finished or partial), e.g. the committed records in `records/`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from dpfl.config import RESUME_RESOURCES
from dpfl.errors import ConfigError, DataError
from dpfl.experiments import configs_root

UNITS = {"KB": 1e3, "MB": 1e6, "Mbit": 1e6 / 8, "B": 1.0}


# datasets a user can get here without supplying files (Debian package, or shipped with scikit-learn)
AVAILABLE = ("fashion-mnist", "digits", "default")


def list_tables() -> dict[str, str]:
    """Table id -> description; tables whose rows need files the user must supply say so."""
    out = {}
    for d in sorted(configs_root().iterdir()):
        if d.is_dir() and (d / "thesis.json").is_file():
            meta = json.loads((d / "thesis.json").read_text()).get("_table", {})
            need = sorted(table_datasets(d.name) - set(AVAILABLE))
            note = (f" — NEEDS the {', '.join(need)} files, which you supply (DPFL_DATA_DIR=DIR with "
                    f"DIR/{need[0]}/ holding them)" if need else "")
            out[d.name] = meta.get("description", "") + note
    return out


def table_datasets(table: str) -> set[str]:
    """The datasets the rows of `table` train on (read from their TOML, nothing loaded)."""
    import tomllib

    return {tomllib.loads(p.read_text()).get("data", {}).get("dataset", "default")
            for p in (configs_root() / table).glob("*.toml")}


def table_rows(table: str) -> tuple[dict, dict[str, Path]]:
    d = configs_root() / table
    if not (d / "thesis.json").is_file():
        raise ConfigError(f"unknown table {table!r}; available: {', '.join(list_tables())}")
    thesis = json.loads((d / "thesis.json").read_text())
    rows = {p.stem: p for p in sorted(d.glob("*.toml"))}
    return thesis, rows


def same_run(table: str, row: str) -> tuple[str, str]:
    """(table, row) whose run directory holds `row` of `table`: itself, or the row that its thesis.json
    entry names as `"same_run": "<table>/<row>"`. That row must exist, name no row itself, and have the same
    config but for the name; anything else is a ConfigError."""
    from dpfl.config import load_config

    thesis, rows = table_rows(table)
    target = thesis.get(row, {}).get("same_run")
    if target is None:
        return table, row
    t, _, r = str(target).partition("/")
    where = f"{table}/{row}: same_run {target!r}"
    if t not in list_tables():
        raise ConfigError(f"{where} names no table")
    t_thesis, t_rows = table_rows(t)
    if r not in t_rows or (t, r) == (table, row):
        raise ConfigError(f"{where} names no other row of {t}")
    if "same_run" in t_thesis.get(r, {}):
        raise ConfigError(f"{where} names a row that names another itself")
    a, b = (load_config(p).model_dump(mode="json", exclude={"name"}) for p in (rows[row], t_rows[r]))
    if a != b:
        raise ConfigError(f"{where}: the configs differ (in more than the name)")
    return t, r


def row_dir(table: str, row: str, base: Path, same: tuple[str, str] | None = None) -> Path:
    """The run directory of `row` under `base` (`<out>/<table>[-<accountant>]`), its same_run row's if
    any (`same`: that row, if the caller has resolved it already)."""
    t, r = same or same_run(table, row)
    return base.parent / (t + base.name[len(table):]) / r


def private_rows(table: str, all_rows: dict[str, Path], chosen: list[str], explicit: bool) -> list[str]:
    """The rows `--accountant` applies to: those whose scheme accounts a client-level ε. A row named
    with --row that is not one, or a table without any, is a ConfigError."""
    from dpfl.config import load_config
    from dpfl.schemes.index import PRIVATE

    private = [r for r in chosen if load_config(all_rows[r]).scheme.name in PRIVATE]
    other = [r for r in chosen if r not in private]
    if explicit and other:
        raise ConfigError(f"--accountant applies to client-level DP rows only; {', '.join(other)} "
                          f"of {table} account no ε")
    if not private:
        raise ConfigError(f"--accountant applies to client-level DP rows only; {table} has none")
    return private


def reproduce_table(table: str, rows: list[str], rounds: int | None, out: Path, overrides: list[str],
                    accountant: str | None, console: Console, execute: Callable,
                    report_only: bool = False, wide: bool = False, overwrite: bool = False,
                    allow_recalibration: bool = False) -> list[dict]:
    thesis, all_rows = table_rows(table)
    chosen = rows or list(all_rows)
    unknown = [r for r in chosen if r not in all_rows]
    if unknown:
        raise ConfigError(f"table {table}: unknown row(s) {unknown}; rows: {', '.join(all_rows)}")
    if accountant is not None:
        from typing import get_args

        from dpfl.config import PrivacyConfig

        names = get_args(PrivacyConfig.model_fields["accountant"].annotation)
        if accountant not in names:
            raise ConfigError(f"--accountant must be one of {', '.join(names)}, got {accountant!r}")
        chosen = private_rows(table, all_rows, chosen, explicit=bool(rows))
    base = out / (table + (f"-{accountant}" if accountant else ""))
    if report_only:
        return report_table(table, thesis, chosen, base, console, wide)
    from dpfl.config import load_config
    from dpfl.run.state import CHECKPOINT, Run, is_run_dir

    sets = list(overrides)
    if rounds is not None:
        sets.append(f"federation.rounds={rounds}")
    if accountant is not None:
        sets.append(f'privacy.accountant="{accountant}"')
    results = []

    def skip(row: str, run_dir: Path, e: Exception) -> None:
        console.print(f"[yellow]{row}: skipped: {escape(str(e))}[/yellow]")
        results.append({"row": row, "summary": {"skipped": str(e)}, "dir": str(run_dir)})

    for row in chosen:
        run_dir = base / row
        try:
            t, r = same_run(table, row)
            if (t, r) != (table, row):
                run_dir = row_dir(table, row, base, (t, r))
                console.print(f"[dim]{row}: the same run as {t}/{r}, recorded in {run_dir}[/dim]")
            cfg = load_config(table_rows(t)[1][r], sets)
            summary_file = run_dir / "summary.json"
            if not overwrite and summary_file.is_file():
                try:
                    s = json.loads(summary_file.read_text())
                except (ValueError, OSError) as e:
                    raise DataError(f"{summary_file}: not readable JSON ({e}); --overwrite starts the row over") \
                        from None
                if s.get("rounds_run") == cfg.federation.rounds or s.get("stopped"):
                    diff = config_differences(cfg, run_dir)
                    note = f"; made with a different config ({', '.join(diff)})" if diff else ""
                    console.print(f"[dim]{row}: done earlier ({run_dir}){escape(note)}[/dim]")
                    results.append({"row": row, "summary": {**s, "rounds_planned": cfg.federation.rounds,
                                                            "rounds_full": full_rounds(table, row)},
                                    "dir": str(run_dir)})
                    continue
            if not overwrite and (run_dir / CHECKPOINT).is_file():
                diff = config_differences(cfg, run_dir)
                if diff:
                    raise ConfigError(f"{run_dir} was run with a different config ({', '.join(diff)}); "
                                      "a resumed row keeps its own: use another --out, or --overwrite")
                job = Run.resume(run_dir, log=console.print, rounds=cfg.federation.rounds,
                                 allow_recalibration=allow_recalibration,
                                 resources={k: getattr(cfg.run, k) for k in RESUME_RESOURCES})
                console.print(f"{row}: resuming at round {job.round}")
            else:
                if not overwrite and is_run_dir(run_dir):
                    raise ConfigError(f"{run_dir} holds a run without a checkpoint to resume from; "
                                      "--overwrite starts it over")
                job = Run(cfg, run_dir, log=console.print, overwrite=overwrite)
        except (ConfigError, DataError) as e:  # e.g. a scheme refusing the accountant, a refused resume
            skip(row, run_dir, e)
            continue
        console.print(f"{row}: {job.scheme.describe()}")
        try:
            s = execute(job, row)
        except ConfigError as e:  # refused by the simulator (e.g. a cohort that cannot fit in memory)
            skip(row, run_dir, e)
            continue
        results.append({"row": row, "summary": {**s, "rounds_planned": cfg.federation.rounds,
                                                "rounds_full": full_rounds(table, row)}, "dir": str(run_dir)})
    compare = print_comparison(table, thesis, results, console, wide)
    base.mkdir(parents=True, exist_ok=True)
    (base / "results.json").write_text(json.dumps(compare, indent=2))
    from dpfl.experiments.report import load_run, write_plots

    ran = [r for r in results if "skipped" not in r["summary"]]
    write_plots([(Path(r["dir"]), *load_run(Path(r["dir"]))) for r in ran], base, console,
                [r["row"] for r in ran])
    return compare


# settings that change how fast a row runs or how often it checkpoints, and its label, not the experiment
# (threads and device change float rounding: the record's `code` names what ran each part)
_RESOURCE_KEYS = ("federation.rounds", *(f"run.{k}" for k in RESUME_RESOURCES), "name")


def config_differences(cfg, run_dir: Path) -> list[str]:
    """Keys (a.b.c) where `cfg` differs from the config.toml in `run_dir`, resource settings aside."""
    from dpfl.config import load_config

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            if isinstance(v, dict) and not k.endswith("options"):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[prefix + k] = v
        return out

    a = flat(cfg.model_dump(mode="json"))
    b = flat(load_config(run_dir / "config.toml").model_dump(mode="json"))
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k not in _RESOURCE_KEYS)



def full_rounds(table: str, row: str) -> int:
    """The row's full length: the rounds of its config in the table (a run may have been shortened)."""
    from dpfl.config import load_config

    return load_config(table_rows(table)[1][row]).federation.rounds


def collect_runs(table: str, base: Path, chosen: list[str]) -> tuple[list[dict], list[str]]:
    """The run directories of `chosen` rows of `table` under `base` (finished or partial), and the rows
    never run."""
    from dpfl.config import load_config
    from dpfl.experiments.report import load_run

    results, missing = [], []
    for row in chosen:
        run_dir = row_dir(table, row, base)
        if not (run_dir / "metrics.jsonl").is_file():
            missing.append(row)
            continue
        summary, metrics = load_run(run_dir)
        summary.setdefault("rounds_run", len(metrics))
        summary["rounds_planned"] = load_config(run_dir / "config.toml").federation.rounds
        summary["rounds_full"] = full_rounds(table, row)
        results.append({"row": row, "summary": summary, "dir": str(run_dir), "metrics": metrics})
    return results, missing


def report_table(table: str, thesis: dict, chosen: list[str], base: Path, console: Console,
                 wide: bool = False) -> list[dict]:
    """Measured vs thesis from existing run directories under `base`; rows never run are listed as such."""
    results, missing = collect_runs(table, base, chosen)
    if not results:
        acct = f" --accountant {base.name[len(table) + 1:]}" if base.name != table else ""
        raise ConfigError(f"no run of {table} under {base}; run it with `dpfl reproduce {table}{acct}`")
    compare = print_comparison(table, thesis, results, console, wide)
    if missing:
        console.print(f"not run yet: {', '.join(missing)}", highlight=False)
    return compare


# (measured key at the best round, thesis.json key, column label)
EXTRA = (("source_accuracy", "source_accuracy", "source acc"), ("attack_success", "attack_success", "attack success"),
         ("step_up_bits_per_value", "bits", "bits/param"))


def diverged_at(best: dict) -> bool:
    """Whether a best round read a diverged model: its evaluation loss is NaN or ±inf (the "accuracy" is
    then the constant output's, 0.1 on ten balanced classes, not a trained model's)."""
    loss = best.get("loss")
    return isinstance(loss, float) and not math.isfinite(loss)


def compare_rows(thesis: dict, results: list[dict]) -> list[dict]:
    """Measured vs thesis, one dict per row (costs in the table's unit). `complete`: run to the row's full
    length (`rounds_full`, the table's config; a run shortened by --rounds is not) and not stopped early;
    `diverged`: the best round's loss is not finite (`diverged_at`); `delta` only for a complete row that
    did not diverge, compared on the thesis's own dataset."""
    scale = UNITS[thesis.get("_table", {}).get("unit", "KB")]
    out = []
    for r in results:
        th = thesis.get(r["row"], {})
        s = r["summary"]
        if "skipped" in s:
            out.append({"row": r["row"], "skipped": s["skipped"], "dir": r["dir"]})
            continue
        b = s.get("best") or {}
        key = b.get("metric", "accuracy")
        meas = b.get(key)
        ref = th.get(key, th.get("accuracy"))

        def per(k, b=b):
            v = b.get(k)
            return None if v is None else v / scale

        ran, planned = s.get("rounds_run"), s.get("rounds_planned")
        full = s.get("rounds_full", planned)
        complete = (full is None or ran == full) and not s.get("stopped")
        comparable = th.get("dataset", "fashion-mnist") == "fashion-mnist"
        diverged = diverged_at(b)
        row = {"row": r["row"], "metric": key, "measured": meas, "thesis": ref,
               "delta": meas - ref if complete and comparable and not diverged and None not in (meas, ref)
               else None,
               "diverged": diverged, "complete": complete, "stopped": s.get("stopped"),
               "thesis_dataset": th.get("dataset"),
               "thesis_converged": th.get("converged"), "round": b.get("round"),
               "thesis_round": th.get("round"), "up": per("cum_up_bytes_per_client"),
               "formula_up": per("formula_up_bytes_per_client"), "thesis_up": th.get("up"),
               "down": per("cum_down_bytes_per_client"), "thesis_down": th.get("down"),
               "epsilon": b.get("epsilon"), "thesis_epsilon": th.get("epsilon"), "dir": r["dir"],
               "rounds_run": ran}
        if planned is not None:
            row["rounds_planned"] = planned
        if full is not None:
            row["rounds_full"] = full
        for k, tk, _ in EXTRA:
            row[k], row[f"thesis_{tk}"] = b.get(k), th.get(tk)
        out.append(row)
    return out


def print_comparison(table: str, thesis: dict, results: list[dict], console: Console,
                     wide: bool = False) -> list[dict]:
    """Print `compare_rows` as a table that fits the terminal (all columns with `wide` or into a file)."""
    from dpfl.compression.costs import human_bytes
    from dpfl.experiments.report import print_fitted

    unit = thesis.get("_table", {}).get("unit", "KB")
    rows = compare_rows(thesis, results)
    extra = [(k, tk, label) for k, tk, label in EXTRA
             if any(r.get(k) is not None or r.get(f"thesis_{tk}") is not None for r in rows)]
    # (header, drop order when narrow: 0 = always kept)
    u = "/ client" if unit == "B" else unit
    cols = [("row", 0), ("rounds run", 0), ("metric", 9), ("measured", 0), ("thesis", 0), ("Δ", 0), ("round", 0),
            ("thesis round", 6), (f"up {u}", 0), (f"formula up {u}", 10), (f"thesis up {u}", 5),
            (f"down {u}", 8), (f"thesis down {u}", 8), ("ε", 0), ("thesis ε", 7)]
    for _, _, label in extra:
        cols += [(label, 0), (f"thesis {label}", 4)]

    def f(v, p=4):
        return "-" if v is None else (f"{v:,.{p}f}" if isinstance(v, float) else str(v))

    def cost(v):  # a table without a cost unit of its own (unit B): KB / MB
        return human_bytes(v) if unit == "B" and v is not None else f(v, 2)

    cells = []
    for row in rows:
        if "skipped" in row:
            cells.append([row["row"], "-", "skipped", *["-"] * (len(cols) - 3)])
            continue
        ran, planned = row["rounds_run"], row.get("rounds_full")
        delta = f"{row['delta']:+.3f}" if row["delta"] is not None else (
            "diverged" if row["diverged"] else "cut short" if not row["complete"] else "-")
        c = [row["row"], f"{ran}/{planned}" if planned and ran != planned else f(ran), row["metric"],
             f(row["measured"]), f(row["thesis"]), delta, f(row["round"]), f(row["thesis_round"]),
             cost(row["up"]), cost(row["formula_up"]), cost(row["thesis_up"]), cost(row["down"]),
             cost(row["thesis_down"]), f(row["epsilon"], 3), f(row["thesis_epsilon"], 2)]
        for k, tk, _ in extra:
            c += [f(row[k]), f(row[f"thesis_{tk}"])]
        cells.append(c)
    dropped = print_fitted(console, f"{table}: measured vs thesis", cols, cells, wide)
    console.print(f"costs: cumulative {'bytes' if unit == 'B' else unit} per client of the population, "
                  "at the best round; formula up: the thesis's cost formula at the width the values were sent at "
                  "(a DP row's b-bit masked integers, where the thesis counts float32 but for FL-SIGN-DP)"
                  + (f"; not shown for width: {', '.join(dropped)} (--wide)" if dropped else ""), highlight=False)
    return rows
