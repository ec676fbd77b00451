"""`dpfl publish`: the README headline table and the thesis tables of docs/RESULTS.md, generated from
the run records under `records/` only, plus one figure per table under docs/figures/.

Generated text sits between `<!-- BEGIN generated: NAME -->` and `<!-- END generated -->` lines; the
prose around them is hand-written. NAME is `headline` in README.md and a table id (`table-4.4`) in
docs/RESULTS.md; a table's block holds every record of it, its `--accountant` variants included
(`records/table-5.1-pld/...`). `check` regenerates the text and reports the blocks that differ from
the files, writing nothing (the test suite runs it, so no number in those blocks can drift from the
records). Beside the literal reading, every table has a generated column for the best faithful reading of a
row that misses, read from records/best (`dpfl.experiments.best`), and the scoreboard counts both.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from dpfl.errors import ConfigError
from dpfl.experiments.best import BEST

if TYPE_CHECKING:
    from dpfl.config import RunConfig

BEGIN = "<!-- BEGIN generated: {} -->"
END = "<!-- END generated -->"

# README headline rows: (label, table, row, accountant of a `--accountant` run or None).
HEADLINE = (
    ("FL-STD, setting D", "table-4.4", "fl-std_r1.0", None),
    ("FL-SIGN, setting D", "table-4.4", "fl-sign_r1.0", None),
    ("FL-CS r = 0.05, setting C", "table-4.2", "fl-cs_r0.05", None),
    ("FL-TOP r = 0.5 %, setting D", "table-4.4", "fl-top_r0.005", None),
    ("FL-SIGN, setting A", "table-4.1", "fl-sign", None),
    ("FL-CS r = 0.1, setting C", "table-4.2", "fl-cs_r0.1", None),
    ("FL-CS r = 0.2, setting C", "table-4.2", "fl-cs_r0.2", None),
    ("FL-RND r = 0.1, setting C", "table-4.2", "fl-rnd_r0.1", None),
    ("FL-TOP r = 10 %, setting D", "table-4.4", "fl-top_r0.1", None),
    ("FL-BASIC r = 0.5 %, setting D", "table-4.4", "fl-basic_r0.005", None),
    ("FL-STD-DP ε = 1, setting B, secure aggregation", "table-5.1", "fl-std-dp_eps1", None),
    ("FL-STD-DP ε = 1, σ calibrated by PLD", "table-5.1", "fl-std-dp_eps1", "pld"),
    ("FL-SIGN-DP ε = 1, setting B", "table-5.1", "fl-sign-dp_eps1", None),
    ("FL-SIGN-DP ε = 1, σ calibrated by RDP", "table-5.1", "fl-sign-dp_eps1", "rdp"),
    ("FL-TOP-DP r = 0.5 %, ε = 1", "table-5.5", "fl-top-dp_r0.005", None),
    ("FL-TOP-DP r = 0.5 %, ε = 1, σ by PLD", "table-5.5", "fl-top-dp_r0.005", "pld"),
    ("FL-CS-DP r = 0.05, ε = 1, setting B (λ = noise)", "table-5.3", "fl-cs-dp_r0.05", None),
    ("FL-CS-DP r = 0.05, ε = 1, setting B, σ by PLD", "table-5.3", "fl-cs-dp_r0.05", "pld"),
    ("FL-CS-DP r = 0.05, ε = 1, setting D (S = 0.57)", "table-5.5", "fl-cs-dp_r0.05", None),
    ("FL-CS-DP r = 0.05, ε = 1, setting D, σ by PLD", "table-5.5", "fl-cs-dp_r0.05", "pld"),
    ("random update σ_Adv = 200, FL-STD, 10 % attackers", "table-6.1-fmnist", "fl-std-10", None),
    ("random update σ_Adv = 200, FL-SIGN, 20 % attackers", "table-6.1-fmnist", "fl-sign-20", None),
    ("colluding gradient ascent, FL-STD, 10 %", "table-6.3-fmnist", "fl-std-10", None),
    ("colluding gradient ascent, FL-SIGN, 20 %", "table-6.3-fmnist", "fl-sign-20", None),
    ("out-backdoor T-shirt → Trouser, FL-SIGN, 10 %", "table-6.12", "fl-sign-10", None),
    ("out-backdoor, FL-SIGN-DP ε = 1, 10 %", "table-6.12", "fl-sign-dp-eps1-10", None),
    ("in-backdoor Sandal → Sneaker, FL-SIGN, 10 %", "table-6.10", "fl-sign-10", None),
    ("in-backdoor, FL-SIGN, 20 %", "table-6.10", "fl-sign-20", None),
    ("in-backdoor, FL-SIGN-DP ε = 1, 10 %", "table-6.10", "fl-sign-dp-eps1-10", None),
)

EXTRA_LABELS = {"step_up_bits_per_value": ("bits/param", "bits"), "source_accuracy": ("source acc.", "source_accuracy"),
                "attack_success": ("attack success", "attack_success")}


# Records of committed configs that are not thesis rows: records/<folder>/<config stem>/ holds the run of
# dpfl/experiments/configs/<folder>/<config stem>.toml; its block (named <folder>) goes into the doc given.
CONFIG_RUNS = {"record-dp": "docs/record-dp.md"}

# Committed privacy audits (`dpfl audit`): docs/audit/<run>/audit.json, tabled in docs/audit.md (block `audit`).
AUDIT_RUNS, AUDIT_DOC = "docs/audit", "docs/audit.md"


# ---- records -------------------------------------------------------------------------------------

def record_tables(records: Path) -> dict[str, list[str | None]]:
    """table id -> the accountant variants on record (None: the table as configured), for every
    `records/<table>[-<accountant>]/<row>/metrics.jsonl`."""
    from dpfl.experiments.reproduce import list_tables
    from dpfl.privacy import ACCOUNTANTS

    known = list_tables()
    out: dict[str, list[str | None]] = {}
    for d in sorted(p for p in Path(records).iterdir() if p.is_dir()):
        if d.name in CONFIG_RUNS or d.name == BEST or not any(d.glob("*/metrics.jsonl")):
            continue
        acct = next((a for a in ACCOUNTANTS if d.name.endswith(f"-{a}") and d.name[: -len(a) - 1] in known), None)
        table = d.name[: -len(acct) - 1] if acct else d.name
        if table not in known:
            raise ConfigError(f"{d}: no thesis table {table!r} (tables: {', '.join(known)})")
        out.setdefault(table, []).append(acct)
    return {t: sorted(v, key=lambda a: (a is not None, a or "")) for t, v in sorted(out.items(), key=_table_key)}


def _table_key(item) -> tuple:
    """Thesis tables in number order (4.2 before 4.10), then tables named otherwise (correlated-noise)."""
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x)
                 for x in re.split(r"[.-]", item[0].removeprefix("table-")))


def _dir_name(table: str, acct: str | None) -> str:
    return f"{table}-{acct}" if acct else table


def row_order(table: str) -> tuple[dict, dict[str, Path], list[str]]:
    """(thesis, row -> config, the rows in the thesis's order, then the rows it has no number for)."""
    from dpfl.experiments.reproduce import table_rows

    thesis, all_rows = table_rows(table)
    return thesis, all_rows, [r for r in thesis if r in all_rows] + [r for r in all_rows if r not in thesis]


def table_entries(records: Path, table: str, variants: list[str | None]) -> tuple[dict, list[dict], list[str]]:
    """(thesis, one entry per record in thesis row order, rows with no record in any variant). An entry
    holds the `compare_rows` dict plus the record's config, summary, metrics, accountant and σ."""
    from dpfl.config import load_config
    from dpfl.experiments.reproduce import collect_runs, compare_rows

    thesis, _, order = row_order(table)
    entries = []
    for acct in variants:
        results, _ = collect_runs(table, Path(records) / _dir_name(table, acct), order)
        for res, cmp in zip(results, compare_rows(thesis, results)):
            cfg = load_config(Path(res["dir"]) / "config.toml")
            m = re.search(r"σ=([0-9.]+)", res["summary"].get("describe", ""))
            entries.append({**cmp, "acct": acct, "cfg": cfg, "summary": res["summary"], "metrics": res["metrics"],
                            "sigma": float(m.group(1)) if m else None, "table": table,
                            "command": command(table, res["row"], acct, cfg)})
    entries.sort(key=lambda e: (order.index(e["row"]), e["acct"] is not None, e["acct"] or ""))
    missing = [r for r in order if r not in {e["row"] for e in entries}]
    return thesis, entries, missing


def command(table: str, row: str, acct: str | None, cfg=None) -> str:
    """The `dpfl reproduce` command that runs a row exactly as recorded: the overrides are what its
    config differs in from the row's config."""
    from dpfl.config import load_config
    from dpfl.experiments.report import config_diff
    from dpfl.experiments.reproduce import table_rows

    sets = []
    if cfg is not None:
        sets = [s for s in config_diff(load_config(table_rows(table)[1][row]), cfg)
                if not (acct and s.startswith("privacy.accountant="))]
    parts = [f"dpfl reproduce {table} --row {row}"] + ([f"--accountant {acct}"] if acct else [])
    parts += [f"--set '{s}'" if re.search(r"[\"' ()]", s) else f"--set {s}" for s in sets]
    return " ".join(parts + ["--out records"])


# ---- formatting ----------------------------------------------------------------------------------

def _cost(v: float | None, unit: str) -> str | None:
    from dpfl.compression.costs import human_bytes
    from dpfl.experiments.reproduce import UNITS

    if v is None:
        return None
    return human_bytes(v * UNITS[unit]) if unit == "B" else f"{v:,.2f} {unit}"


def _thesis_acc(e: dict, rounds: bool = True) -> str:
    ref, mnist = e["thesis"], e["thesis_dataset"] == "mnist"
    if ref is None:
        text = "does not converge" if e["thesis_converged"] is False else "—"
    else:
        text = f"{ref:.2f}" + (f" ({e['thesis_round']})" if rounds and e["thesis_round"] else "")
    return f"MNIST: {text}" if mnist else text


def _rounds(e: dict) -> str:
    ran, planned = e["rounds_run"], e.get("rounds_full")
    text = f"{ran}/{planned}" if planned else str(ran)
    if not e["complete"]:
        text += ", cut short" + (f" ({e['stopped']})" if e["stopped"] else "")
    return text


def _delta(e: dict) -> str:
    if e["delta"] is not None:
        return f"{e['delta']:+.4f} ‡" if _at_the_line(e) else f"{e['delta']:+.3f}"
    if e.get("diverged"):
        return "— (diverged)"
    if not e["complete"]:
        return "— (cut short)"
    return "— (MNIST)" if e["thesis_dataset"] == "mnist" else "—"


def epsilon_sampling(e: dict) -> str:
    """How the row's ε accounts client selection: its summary's `epsilon_sampling`, or for a run cut
    short before it wrote one, the rule of `DPOptions.accounted_sampling` on its config (local and
    correlated noise: none; else the config's accounted sampling)."""
    got = e["summary"].get("epsilon_sampling")
    if got is not None:
        return got
    opts = e["cfg"].scheme.options
    return "none" if opts.get("noise") == "local" or opts.get("correlated") else e["cfg"].accounted_sampling()


def _sampling(e: dict) -> str:
    cfg = e["cfg"]
    n, k, q = cfg.data.n_clients, cfg.cohort_size(), cfg.sampling_rate()
    how = epsilon_sampling(e)
    if cfg.federation.sampling == "poisson":
        return f"Poisson q = {q:.5g} (as accounted)"
    drawn = f"fixed {k:,} of {n:,} a round"
    fed = cfg.federation
    if fed.participation == "cyclic":
        drawn += f", cyclic in {fed.groups} groups"
    elif fed.participation == "min-separation":
        drawn += f", rounds ≥ {fed.separation} apart"
    if how == "poisson":
        return f"{drawn}; ε assumes Poisson q = {q:.5g}"
    if how == "without-replacement":
        return f"{drawn}; ε as drawn (without replacement, replace-one neighbours)"
    return f"{drawn}; ε without amplification by sampling"


def _timing(e: dict) -> str:
    """Median wall time of a round (it shared its cores at times: an upper bound) and the machine."""
    import statistics

    secs = [m["round_seconds"] for m in e["metrics"] if "round_seconds" in m]
    text = f"{statistics.median(secs):.1f} s" if secs else "—"
    machine = e["summary"].get("machine")
    if machine:
        t = machine.get("threads")
        text += f", {machine.get('cpu', '?')}" + (f", {t} thread{'s' if t != 1 else ''}" if t else "")
        if machine.get("gpu"):
            text += f", {machine['gpu']}"
    parts = [c for c in e["summary"].get("code") or [] if isinstance(c, dict)]
    last = parts[-1].get("ran_on") if parts else None
    moved = [(c, nxt) for c, nxt in itertools.pairwise(parts) if c.get("ran_on") and c["ran_on"] != last]
    if moved:  # a run resumed on another machine: say which rounds ran where
        text += "; " + "; ".join(f"rounds {c['from_round']}–{nxt['from_round'] - 1} on {c['ran_on']}"
                                 for c, nxt in moved)
    return text


def _with_thesis(mine: str | None, theirs: str | None) -> str:
    if mine is None:
        return "—" if theirs is None else f"— (thesis {theirs})"
    return mine if theirs is None else f"{mine} (thesis {theirs})"


# ---- what the tables flag: shared runs, diverged models, Δ at the ±0.03 line, the cost formula's width ------

WITHIN = 0.03  # "within ±0.03 of the thesis", the scoreboard's line


def _config_print(d: Path) -> str:
    """A record's config as comparable text, without its name and its run resources (threads, device, engine,
    checkpoints: how it ran, not what)."""
    from dpfl.config import load_config

    return json.dumps(load_config(d / "config.toml").model_dump(mode="json", exclude={"name", "run"}), sort_keys=True)


def _metrics_print(d: Path) -> str:
    """A record's metrics as comparable text, every line without its wall times."""
    from dpfl.experiments.report import load_run

    _, metrics = load_run(d)
    return json.dumps([{k: v for k, v in m.items() if not k.endswith("_seconds")} for m in metrics], sort_keys=True)


def shared_runs(records: Path) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    """(record folder, row), e.g. ("table-5.3-pld", "fl-std-dp_r1.0") -> [(folder, row, how)] of the other table
    rows on record whose run it shares, found from the records themselves: `how` is "reads" (this row reads
    that row's record: a `same_run` row of thesis.json), "read by" (that row reads this row's record), "same"
    (both read one record that neither owns, or two records with the same config and the same metrics, wall
    times aside) or "config" (the same config, name and run resources aside, but metrics of its own: the same
    experiment run separately)."""
    from dpfl.experiments.reproduce import configs_root  # the tables' folder (a test may point it elsewhere)

    records = Path(records)
    files = tuple(sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in records.glob("*/*/*")
                         if p.name in ("config.toml", "metrics.jsonl")))
    return _shared_runs(records.resolve(), str(configs_root()), files)


@functools.lru_cache(maxsize=4)
def _shared_runs(records: Path, _configs: str, _files: tuple) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    from dpfl.experiments.reproduce import row_dir

    readers: dict[Path, list[tuple[str, str]]] = {}  # record directory -> the table rows read from it
    for table, variants in record_tables(records).items():
        order = row_order(table)[2]
        for acct in variants:
            base = records / _dir_name(table, acct)
            for row in order:
                d = row_dir(table, row, base)
                if (d / "metrics.jsonl").is_file():
                    readers.setdefault(d, []).append((base.name, row))
    by_config: dict[str, list[Path]] = {}
    for d in readers:
        by_config.setdefault(_config_print(d), []).append(d)
    metrics = {d: _metrics_print(d) for group in by_config.values() if len(group) > 1 for d in group}
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for group in by_config.values():
        for d in group:
            owner = (d.parent.name, d.name)
            for own in readers[d]:
                found = [(*r, "reads" if r == owner else "read by" if own == owner else "same")
                         for r in readers[d] if r != own]
                for other in group:
                    if other != d:
                        how = "same" if metrics[other] == metrics[d] else "config"
                        found += [(*r, how) for r in readers[other]]
                out[own] = found
    return out


def _shared_notes(shared: list[tuple[str, str, str]]) -> list[str]:
    text = {"reads": "the same run as {} {}", "read by": "also {} {}: the same run",
            "same": "the same run as {} {}: the same config and metrics",
            "config": "the same config as {} {}, run separately"}
    return [text[how].format(t, r) for t, r, how in shared]


def _loss_not_finite(m: dict) -> bool:
    loss = m.get("loss")
    return isinstance(loss, float) and not math.isfinite(loss)


def _divergence(e: dict) -> str:
    """For a row whose best round read a diverged model: from which round its evaluation loss was NaN (or ±inf)."""
    first = next(m for m in e["metrics"] if _loss_not_finite(m))
    return f"loss {'NaN' if math.isnan(first['loss']) else first['loss']} from round {first['round']}"


def _test_images(metrics: list[dict]) -> int | None:
    """How many test images the accuracies of a record count (every accuracy is k/n): the least common
    denominator of the evaluated accuracies; None when they are not such fractions (e.g. a balanced accuracy)."""
    n = 1
    for m in metrics:
        if "accuracy" in m:
            f = Fraction(m["accuracy"]).limit_denominator(1_000_000)
            if abs(float(f) - m["accuracy"]) > 1e-12:
                return None
            n = math.lcm(n, f.denominator)
            if n > 1_000_000:
                return None
    return n


def _at_the_line(e: dict) -> int | None:
    """The number of test images of a row whose Δ is within one test image of the ±0.03 line (on either side,
    so one image more or less would move it across), else None."""
    if e["delta"] is None or e["metric"] != "accuracy":
        return None
    n = _test_images(e["metrics"])
    return n if n and abs(abs(e["delta"]) - WITHIN) <= 1 / n + 1e-9 else None


def _formula_widths(e: dict) -> tuple[float, float, list[float]] | None:
    """The thesis's cost formula (values sent × bits / 8, per client of the population, cumulative) at the best
    round, upstream, in bytes: at the width b each round's masked values were sent at (the record's
    `formula_up_bytes_per_client`) and at 32 bits, as float32; with the widths b. None for a row that sent no
    masked integers (no `step_secagg_bits` in a round that sent something)."""
    at_b = at_32 = prev = 0.0
    bits = []
    for m in e["metrics"]:
        if m["round"] > e["round"] or "formula_up_bytes_per_client" not in m:
            break
        step, prev = m["formula_up_bytes_per_client"] - prev, m["formula_up_bytes_per_client"]
        if step <= 0:  # an aborted round sent nothing
            continue
        b = m.get("step_secagg_bits")
        if not b:
            return None
        at_b, at_32 = at_b + step, at_32 + step * 32 / b
        if b not in bits:
            bits.append(b)
    return (at_b, at_32, bits) if bits else None


def _formula_cell(e: dict, unit: str) -> str:
    from dpfl.experiments.reproduce import UNITS

    w = _formula_widths(e)
    if w is None:
        return "—"
    at_b, at_32, bits = w
    b = f"{bits[0]:g}" if len(bits) == 1 else f"{min(bits):g}–{max(bits):g}"
    return f"{_cost(at_b / UNITS[unit], unit)} at b = {b} bits; {_cost(at_32 / UNITS[unit], unit)} at 32 bits"


# ---- the best faithful reading beside the literal one (records/best, dpfl.experiments.best) ------------------

BEST_COLUMN = "best faithful reading: best accuracy (round), Δ; the one setting changed"


def _miss(e: dict) -> bool:
    """More than 0.03 below the thesis (a full-length row on the thesis's dataset)."""
    return e.get("delta") is not None and e["delta"] < -WITHIN


def best_entries(records: Path, table: str, thesis: dict) -> dict[str, dict]:
    """row -> the `compare_rows` dict of its best-reading run under records/best (finished or not), with its
    metrics, summary and Reading."""
    from dpfl.experiments.best import best_runs
    from dpfl.experiments.reproduce import compare_rows

    runs = list(best_runs(records, table).values())
    return {r["row"]: {**cmp, "metrics": r["metrics"], "summary": r["summary"], "reading": r["reading"]}
            for r, cmp in zip(runs, compare_rows(thesis, runs))}


def _owner(e: dict) -> tuple[str, str]:
    """(table, row) whose record a literal entry reads: itself, or the row its `same_run` names."""
    d = Path(e["dir"])
    return d.parent.name, d.name


def _best_state(records: Path, e: dict, best: dict[str, dict]) -> tuple[str, dict | None]:
    """Where a literal row stands in the best-reading column: "literal" (it does not miss: the literal reading
    stands), "run" (a full-length best-reading run, the dict), "not run" (a reading is named, no full-length run
    yet), "none" (readings.toml says why no reading is run: the literal stands) or "unchosen" (no reading named)."""
    from dpfl.experiments.best import load_readings

    b = best.get(e["row"])
    if b is not None and b["complete"]:
        return "run", b
    if not _miss(e):
        return "literal", b
    reading = load_readings(records).get(_owner(e))
    if reading is None:
        return "unchosen", b
    return ("none" if reading.set is None else "not run"), b


def _best_text(b: dict) -> str:
    if b.get("measured") is None:  # a reading started that has not finished a round
        return f"no round yet, {_rounds(b)}"
    acc = f"diverged ({_divergence(b)})" if b.get("diverged") else f"{b['measured']:.4f} ({b['round']})"
    return acc + (f", Δ {_delta(b)}" if b["complete"] else f", {_rounds(b)}")


def _best_cell(records: Path, table: str, e: dict, best: dict[str, dict], rel: str) -> str:
    if e["acct"] is not None:
        return "—"
    state, b = _best_state(records, e, best)
    if state == "literal" and b is None:
        return "—"
    if state == "unchosen":
        return "no reading chosen yet"
    if state == "none":
        return "none run (the literal reading stands)"
    if b is None:
        from dpfl.experiments.best import load_readings

        return f"not run (`{load_readings(records)[_owner(e)].set}`)"
    d = Path(b["dir"])
    text = f"[{_best_text(b)}]({rel}/{BEST}/{d.parent.name}/{d.name}); `{b['reading'].set}`"
    return text if state == "run" else f"not run to full length: {text}"


def table_block(records: Path, table: str, variants: list[str | None], rel: str, figure: str | None) -> str:
    thesis, entries, missing = table_entries(records, table, variants)
    meta = thesis.get("_table", {})
    unit = meta.get("unit", "KB")
    dp = any(e["epsilon"] is not None for e in entries)
    extras = [k for k in EXTRA_LABELS if any(e.get(k) is not None for e in entries)]
    shared = shared_runs(records)
    best_of = best_entries(records, table, thesis)
    head = ["row", "rounds", "best accuracy (round)", "thesis (round)", "Δ", BEST_COLUMN, "upstream / client",
            "downstream / client"]
    if dp:
        head += ["cost formula up / client: at the masked width b; at 32 bits", "accountant, σ", "ε at that round",
                 "sampling"]
    head += [EXTRA_LABELS[k][0] for k in extras] + ["median round, machine"]
    intro = (f"{meta.get('description', table)}. Costs: cumulative per client of the population at the best "
             "round; Δ only for rows run to their full length on the thesis's dataset")
    if any(e["delta"] is not None and _at_the_line(e) for e in entries):
        intro += ("; ‡: |Δ| is within one test image (1/n of the n test images) of 0.03, so one image decides "
                  "whether the row is within ±0.03 of the thesis; Δ then to 4 decimals")
    if any(e.get("diverged") for e in entries):
        intro += ("; diverged: the evaluation loss is NaN at the best round (from the round named on), so no "
                  "accuracy (the constant output's) and no Δ")
    intro += ("; best faithful reading: for a row more than 0.03 below the thesis, the full-length run of the row "
              "with the one setting named changed, as a reading of the thesis allows (why: \"Best faithful "
              "readings\" below the scoreboard), or \"not run\" while it has no full-length run; — where the row "
              "does not miss")
    if dp:
        intro += ("; cost formula: the thesis's (values sent × bits, per client of the population) at the width b "
                  "of the masked integers the row sent (the record's `formula_up_bytes_per_client`) and at 32 bits "
                  "(float32)")
    lines = [intro + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        d = Path(e["dir"])
        path = f"{rel}/{d.parent.name}/{d.name}"
        notes = [f"{e['acct']} σ"] if e["acct"] else []
        notes += _shared_notes(shared.get((_dir_name(table, e["acct"]), e["row"]), []))
        label = f"[{e['row']}]({path})" + (f" ({', '.join(notes)})" if notes else "")
        best = "—" if e["measured"] is None else f"{e['measured']:.4f} ({e['round']})"
        if e.get("diverged"):
            best = f"diverged ({_divergence(e)})"
        elif e["metric"] != "accuracy":
            best += f" {e['metric']}"
        cells = [label, _rounds(e), best,
                 _thesis_acc(e), _delta(e), _best_cell(records, table, e, best_of, rel),
                 _with_thesis(_cost(e["up"], unit), _cost(e["thesis_up"], unit)),
                 _with_thesis(_cost(e["down"], unit), _cost(e["thesis_down"], unit))]
        if dp:
            private = e["epsilon"] is not None
            acct = e["cfg"].privacy.accountant
            cells += [_formula_cell(e, unit),
                      (f"{acct}, σ = {e['sigma']:.4f}" if e["sigma"] else acct) if private else "—",
                      _with_thesis(f"{e['epsilon']:.3f}" if private else None,
                                   None if e["thesis_epsilon"] is None else f"{e['thesis_epsilon']:g}"),
                      _sampling(e) if private else "—"]
        for k in extras:
            tv = e.get(f"thesis_{EXTRA_LABELS[k][1]}")
            cells.append(_with_thesis(None if e.get(k) is None else f"{e[k]:.3f}" if k != "step_up_bits_per_value"
                                      else f"{e[k]:.2f}", None if tv is None else f"{tv:g}"))
        cells.append(_timing(e))
        lines.append("| " + " | ".join(cells) + " |")
    if missing:
        lines += ["", "No record yet: " + ", ".join(f"`{r}`" for r in missing) + "."]
    untwinned = _untwinned(table, entries)
    if untwinned:
        lines += ["", "No full-length record with σ re-calibrated by a tighter accountant yet (`--accountant pld`; "
                  "FL-SIGN-DP, which refuses PLD, `--accountant rdp`): " + ", ".join(f"`{r}`" for r in untwinned) + "."]
    if figure:
        lines += ["", f"![{table}: accuracy per round and per upstream byte, from the records]({figure})"]
    return "\n".join(lines)


def _untwinned(table: str, entries: list[dict]) -> list[str]:
    """The DP rows of a TWINNED table with no full-length record under a `--accountant` variant."""
    if table not in TWINNED:
        return []
    from dpfl.config import load_config
    from dpfl.schemes.index import PRIVATE

    _, all_rows, order = row_order(table)
    twinned = {e["row"] for e in entries if e["acct"] is not None and e["complete"]}
    return [r for r in order if r not in twinned and load_config(all_rows[r]).scheme.name in PRIVATE]


def headline_block(records: Path, rel: str = "records") -> str:
    from dpfl.experiments.reproduce import table_rows

    lines = ["| run | measured (best round) | thesis | record | command |", "|---|---|---|---|---|"]
    cache: dict = {}
    for label, table, row, acct in HEADLINE:
        if row not in table_rows(table)[1]:
            raise ConfigError(f"headline {label!r}: table {table} has no row {row}")
        if (table, acct) not in cache:
            variants = [acct] if (Path(records) / _dir_name(table, acct)).is_dir() else []
            thesis, entries, _ = table_entries(records, table, variants)
            cache[(table, acct)] = (thesis, {e["row"]: e for e in entries})
        thesis, by_row = cache[(table, acct)]
        unit = thesis.get("_table", {}).get("unit", "KB")
        th = thesis.get(row, {})
        th_text = _thesis_text(th, unit)
        e = by_row.get(row)
        if e is None:
            lines.append(f"| {label} | no record yet | {th_text} | — | `{command(table, row, acct)}` |")
            continue
        text = f"diverged ({_divergence(e)})" if e.get("diverged") else f"{e['measured']:.4f} at round {e['round']}"
        if not e["complete"]:
            text += f" ({_rounds(e)})"
        up = _cost(e["up"], unit)
        if up:
            text += f", {up} up"
        if e["epsilon"] is not None:
            text += f", ε {e['epsilon']:.3f} ({e['cfg'].privacy.accountant}" + (
                f", σ = {e['sigma']:.4f})" if e["sigma"] else ")")
        for k, (name, _) in EXTRA_LABELS.items():
            if e.get(k) is not None:
                text += f", {name} {e[k]:.2f}" if k == "step_up_bits_per_value" else f", {name} {e[k]:.3f}"
        d = Path(e["dir"])  # a same_run row's record lies under the row it names
        where = f"{d.parent.name}/{d.name}"
        lines.append(f"| {label} | {text} | {th_text} | [{where}]({rel}/{where}) | "
                     f"`{e['command']}` |")
    return "\n".join(lines)


# DP tables whose rows are also run with σ re-calibrated by a tighter accountant (`--accountant pld`/`rdp`).
TWINNED = ("table-5.1", "table-5.3", "table-5.5")
SCORED = ("table-4.1", "table-4.2", "table-4.4", "table-5.1", "table-5.3", "table-5.5", "table-6.1-fmnist",
          "table-6.3-fmnist", "table-6.10", "table-6.12")


def scoreboard_block(records: Path, scored: tuple[str, ...] = SCORED) -> str:
    """Per thesis table: its rows, those with a full-length record, how many of those are within ±0.03 of
    the thesis, above it, or more than 0.03 below, in two columns: the literal reading (the rows as configured)
    and the best faithful reading (a miss's full-length best-reading run where it has one; the literal row
    where it does not miss or where no reading is run; misses whose reading has no full-length run yet, or
    that have no reading named, counted apart); and, for DP tables, the mean accuracy gain of the rows'
    tighter-accountant records over the same rows as configured (moments σ): `-pld`, or `-rdp` where a row
    has no `-pld` record (FL-SIGN-DP refuses PLD)."""
    from dpfl.experiments.reproduce import table_rows

    head = ["table", "rows", "full-length record", "diverged (loss NaN: no accuracy, no Δ)",
            "no Δ (no thesis number or other dataset)", "literal: within ±0.03", "literal: above thesis",
            "literal: more than 0.03 below", "best reading: within ±0.03", "best reading: above thesis",
            "best reading: more than 0.03 below", "best reading: not run (no full-length run yet)",
            "best reading: none chosen yet", "PLD/RDP-σ record (within ±0.03, above)",
            "PLD/RDP σ − moments σ (rows, mean)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tables = record_tables(records)
    shared = shared_runs(records)
    pairs = {}  # (moments record, twin record) -> gain: a same_run row shares both with the table it names
    one_run, one_config, diverged, at_line, best = [], {}, [], [], {}
    totals = {"rows": 0, "literal below": 0, "best below": 0, "not run": 0, "unchosen": 0}
    for table in scored:
        rows = table_rows(table)[1]
        variants = tables.get(table, [])
        thesis, entries, _ = table_entries(records, table, variants) if variants else ({}, [], [])
        for e in entries:
            own = (_dir_name(table, e["acct"]), e["row"])
            best[own] = e["measured"]
            for t, r, how in shared.get(own, []):
                if how == "reads" or (how == "same" and own < (t, r)):
                    one_run.append(f"{own[0]} {own[1]} = {t} {r}")
                elif how == "config":
                    one_config[tuple(sorted([own, (t, r)]))] = None  # each pair once, in table order
            if e["complete"] and e.get("diverged"):
                diverged.append(f"{own[0]} {own[1]} ({_divergence(e)})")
            n = e["complete"] and _at_the_line(e)
            if n:
                side = "within" if abs(e["delta"]) <= WITHIN else "outside"
                at_line.append(f"{own[0]} {own[1]} (Δ {e['delta']:+.4f}: {side} by one of {n:,} test images)")
        base = {e["row"]: e for e in entries if e["acct"] is None and e["complete"]}
        deltas = [e["delta"] for e in base.values() if e["delta"] is not None]
        n_div = sum(bool(e.get("diverged")) for e in base.values())
        best_of = best_entries(records, table, thesis) if variants else {}
        best_d, not_run, unchosen = [], 0, 0  # the best-reading column: each row with a literal Δ once
        for e in base.values():
            if e["delta"] is None:
                continue
            state, b = _best_state(records, e, best_of)
            if state == "run":
                best_d.append(b["delta"] if b["delta"] is not None else -math.inf)  # a diverged run: a miss
            elif state in ("literal", "none"):
                best_d.append(e["delta"])
            else:
                not_run += state == "not run"
                unchosen += state == "unchosen"
        totals["rows"] += len(deltas)
        totals["literal below"] += sum(d < -WITHIN for d in deltas)
        totals["best below"] += sum(d < -WITHIN for d in best_d)
        totals["not run"] += not_run
        totals["unchosen"] += unchosen
        pld = {e["row"]: e for e in entries if e["acct"] == "rdp" and e["complete"]}
        pld.update({e["row"]: e for e in entries if e["acct"] == "pld" and e["complete"]})  # PLD first
        both = [r for r in pld if r in base and None not in (pld[r]["measured"], base[r]["measured"])]
        gains = [pld[r]["measured"] - base[r]["measured"] for r in both]
        pairs.update({(base[r]["dir"], pld[r]["dir"]): g for r, g in zip(both, gains)})
        gain = f"{len(gains)}, {sum(gains) / len(gains):+.4f}" if gains else "—"
        pld_d = [e["delta"] for e in pld.values() if e["delta"] is not None]
        pld_text = f"{len(pld)} ({sum(abs(d) <= 0.03 for d in pld_d)}, {sum(d > 0 for d in pld_d)})" if pld else "—"
        lines.append(f"| {table} | {len(rows)} | {len(base)} | {n_div} | {len(base) - len(deltas) - n_div} | "
                     f"{sum(abs(d) <= WITHIN for d in deltas)} | {sum(d > 0 for d in deltas)} | "
                     f"{sum(d < -WITHIN for d in deltas)} | {sum(abs(d) <= WITHIN for d in best_d)} | "
                     f"{sum(d > 0 for d in best_d)} | {sum(d < -WITHIN for d in best_d)} | {not_run} | {unchosen} | "
                     f"{pld_text} | {gain} |")
    n = totals["rows"]
    if n:
        lit_ok = n - totals["literal below"]
        best_ok = n - totals["best below"] - totals["not run"] - totals["unchosen"]
        lines += ["", (f"All tables, {n} rows with a Δ (a row two tables share counted in each): within ±0.03 of the "
                       f"thesis or above it, {lit_ok} ({lit_ok / n:.1%}) in the literal reading and {best_ok} "
                       f"({best_ok / n:.1%}) in the best faithful reading, where {totals['best below']} are more "
                       f"than 0.03 below, {totals['not run']} not run yet and {totals['unchosen']} have no reading "
                       "chosen yet.")]
    if pairs:
        mean = sum(pairs.values()) / len(pairs)
        lines += ["", (f"PLD/RDP σ − moments σ over all {len(pairs)} distinct pairs of runs (a run two tables share "
                       f"counted once): mean {mean:+.4f}.")]

    def acc(row):
        return "—" if best.get(row) is None else f"{best[row]:.4f}"

    notes = []
    if one_run:
        notes.append("One run is two tables' row (one record read by both, so counted in both tables' columns): "
                     + "; ".join(one_run) + ".")
    if one_config:
        notes.append("The same config (name and run resources aside) is two tables' row, each run separately with "
                     "a record of its own, both counted (best accuracy of each): " + "; ".join(
                         f"{a[0]} {a[1]} / {b[0]} {b[1]} ({acc(a)} / {acc(b)})" for a, b in one_config) + ".")
    if diverged:
        notes.append("Diverged (loss NaN at the best round: the accuracy read there is a constant output's, not a "
                     "trained model's; counted in no accuracy column, only in the diverged one): "
                     + "; ".join(diverged) + ".")
    if at_line:
        notes.append("Δ within one test image of the ±0.03 line (‡ in the tables): " + "; ".join(at_line) + ".")
    return "\n\n".join(["\n".join(lines), *notes])


def best_readings_block(records: Path, rel: str, rel_probes: str, scored: tuple[str, ...] = SCORED) -> str:
    """Every row more than 0.03 below the thesis, and every row records/best/readings.toml names: its literal Δ,
    the one setting its best faithful reading changes, why the thesis allows it, the probe it was chosen on, and
    the full-length run's result, or the command that runs it."""
    from dpfl.experiments.best import command, load_readings

    readings = load_readings(records)
    tables = record_tables(records)
    head = ["row", "thesis", "literal reading: best accuracy (round), Δ", "the one setting changed",
            "why the thesis allows it", "chosen on", "best faithful reading: best accuracy (round), Δ"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    said = None  # the reason given last: the same reason on the next row reads "as above"
    for table in scored:
        if not tables.get(table):
            continue
        thesis, entries, _ = table_entries(records, table, tables[table])
        best_of = best_entries(records, table, thesis)
        for e in entries:
            reading = readings.get(_owner(e)) if e["acct"] is None else None
            if e["acct"] is not None or not (_miss(e) or reading is not None or e["row"] in best_of):
                continue
            d = Path(e["dir"])
            literal = (f"[{e['measured']:.4f} ({e['round']})]({rel}/{d.parent.name}/{d.name}), Δ {_delta(e)}"
                       if e["measured"] is not None else _delta(e))
            state, b = _best_state(records, e, best_of)
            if reading is None:
                setting, why, probe, result = "—", "—", "—", "no reading chosen yet"
            elif reading.set is None:
                setting, why, probe, result = "none", reading.reason, "—", "none run: the literal reading stands"
            else:
                setting, why = f"`{reading.set}`", "as above" if reading.reason == said else reading.reason
                said = reading.reason
                probe = (f"[{reading.probe}]({rel_probes}/{reading.probe})" if reading.probe
                         else "this run (a probe run to full length)")
                if b is None:
                    result = f"not run: `{command(records, reading)}`"
                else:
                    bd = Path(b["dir"])
                    result = f"[{_best_text(b)}]({rel}/{BEST}/{bd.parent.name}/{bd.name})"
                    if state != "run":
                        result = f"not run to full length ({result}); resume: `{command(records, reading)}`"
            lines.append(f"| {table} [{e['row']}]({rel}/{d.parent.name}/{d.name}) | {_thesis_acc(e)} | {literal} | "
                         f"{setting} | {why} | {probe} | {result} |")
    return "\n".join(lines)


def _thesis_text(th: dict, unit: str) -> str:
    if not th:
        return "—"
    acc = th.get("accuracy")
    text = ("does not converge" if th.get("converged") is False else "—") if acc is None else f"{acc:.2f}"
    if th.get("round"):
        text += f" at round {th['round']}"
    if th.get("up") is not None:
        text += f", {_cost(th['up'], unit)} up"
    if th.get("epsilon") is not None:
        text += f", ε {th['epsilon']:g}"
    for name, tk in EXTRA_LABELS.values():
        if th.get(tk) is not None:
            text += f", {name} {th[tk]:g}"
    return f"MNIST: {text}" if th.get("dataset") == "mnist" else text


# ---- figures -------------------------------------------------------------------------------------

def table_figure(records: Path, table: str, variants: list[str | None], path: Path) -> Path:
    """Accuracy vs round and vs cumulative upstream bytes per client for every record of the table;
    ★ best round; the thesis's accuracy (on this dataset) as ◇ at its best round, or dotted without one."""
    from dpfl.experiments.report import plot_curves, pyplot, save_figure
    from dpfl.experiments.reproduce import UNITS

    plt = pyplot()
    thesis, entries, _ = table_entries(records, table, variants)
    scale = UNITS[thesis.get("_table", {}).get("unit", "KB")]
    curves = [(e["row"] + (f" ({e['acct']} σ)" if e["acct"] else "") + ("" if e["complete"] else ", cut short")
               + (", diverged" if e.get("diverged") else ""), e["metrics"]) for e in entries]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, xkey, xlabel in ((axes[0], "round", "round"),
                             (axes[1], "cum_up_bytes_per_client", "cumulative upstream per client")):
        plot_curves(ax, curves, xkey, annotate=False)
        drawn = set()  # one thesis mark per row, in the colour of its first record
        for i, e in enumerate(entries):
            if e["thesis"] is None or e["thesis_dataset"] == "mnist" or e["row"] in drawn:
                continue
            drawn.add(e["row"])
            x = e["thesis_round"] if xkey == "round" else (None if e["thesis_up"] is None else e["thesis_up"] * scale)
            if x is not None:
                ax.plot([x], [e["thesis"]], marker="D", ms=7, mfc="none", mec=f"C{i % 10}", mew=1.5, ls="none")
            else:
                ax.axhline(e["thesis"], color=f"C{i % 10}", ls=":", lw=1)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{table} from records/: ★ best round; thesis: ◇ at its best round, dotted where it gives no round",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    plt.close(fig)
    return path


def config_runs(records: Path, folder: str) -> list[tuple[Path, Path, RunConfig]]:
    """(run directory, committed config file, its RunConfig) for every record under records/<folder>; a
    record whose config is not committed, or differs from it, is a ConfigError."""
    from dpfl.config import load_config
    from dpfl.experiments import configs_root
    from dpfl.experiments.report import config_diff

    out = []
    for d in sorted(p.parent for p in (Path(records) / folder).glob("*/metrics.jsonl")):
        src = configs_root() / folder / f"{d.name}.toml"
        if not src.is_file():
            raise ConfigError(f"{d}: no committed config {src.name} in dpfl/experiments/configs/{folder}")
        cfg = load_config(src)
        diff = config_diff(cfg, load_config(d / "config.toml"))
        if diff:
            raise ConfigError(f"{d}: run with a config that differs from {src.name} ({', '.join(diff)})")
        out.append((d, src, cfg))
    return out


def record_dp_block(records: Path, rel: str) -> str:
    """Record-level DP-SGD runs of the committed configs: σ, ε reached, accuracy."""
    from dpfl.experiments.report import load_run

    lines = [("| config | record-level ε target (δ) | σ | noise std per weight per round | ε max / median reached | "
              "clients spent | best accuracy (round) | last accuracy (round) | rounds | machine | record |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d, src, cfg in config_runs(records, "record-dp"):
        summary, metrics = load_run(d)
        planned, done, best, end = cfg.federation.rounds, len(metrics), summary["best"], metrics[-1]
        last = next(m for m in reversed(metrics) if "accuracy" in m)
        rounds = f"{done} of {planned}" + ("" if done == planned else " (cut short)")
        if summary.get("stopped"):
            rounds += f", stopped: {summary['stopped']}"
        rl = summary.get("record_level", {})  # written when the run ends
        sigma = f"{rl['noise_multiplier']:.4f}" if rl else "(in the checkpoint)"
        t = cfg.train  # what each weight receives a round: η·σC/B per step, T steps, mean of |K| (plain SGD)
        noise = "—"
        if rl and t.optimizer == "sgd" and not t.momentum:
            per_round = t.lr * rl["noise_multiplier"] * rl["clip"] / t.batch_size * math.sqrt(t.steps)
            noise = f"{per_round / math.sqrt(cfg.federation.clients_per_round):.4f}"
        mach = summary.get("machine", {})
        where = (mach.get("gpu") or f"{mach['cpu']}, {mach['threads']} thread(s)") if mach else "—"
        dp = cfg.train.dpsgd
        lines.append(f"| `{src.name}` | {dp.target_epsilon:g} ({dp.delta:g}) | {sigma} | {noise} | "
                     f"{end['record_epsilon_max']:.4f} / {end['record_epsilon_median']:.4f} | "
                     f"{end['record_clients_spent']} | {best['accuracy']:.4f} ({best['round']}) | "
                     f"{last['accuracy']:.4f} ({last['round']}) | {rounds} | {where} | "
                     f"[{d.name}]({rel}/record-dp/{d.name}) |")
    if len(lines) == 2:
        raise ConfigError("records/record-dp holds no run")
    return "\n".join(lines)


# ---- probes -------------------------------------------------------------------------------------

# docs/probes/probes.toml names, for each probe folder, the record it tests: `[NAME] record = "TABLE/ROW"`.
PROBES = "docs/probes/probes.toml"
_RUN_KEYS_SHOWN = {"run.device"}  # of the run.* resources, the one a reader may want to see


def config_changes(probe: RunConfig, record: RunConfig) -> list[str]:
    """What a probe's config sets differently from its record's, in `--set` syntax (the planned rounds
    and the run.* resources other than run.device left out), with the record's value."""
    from dpfl.experiments.report import config_diff

    theirs = dict(s.split("=", 1) for s in config_diff(probe, record))
    out = []
    for s in config_diff(record, probe):
        k = s.split("=", 1)[0]
        if k == "federation.rounds" or (k.startswith("run.") and k not in _RUN_KEYS_SHOWN):
            continue
        out.append(f"`{s}`" + (f" (record: {theirs[k]})" if theirs.get(k, "(unset)") != "(unset)" else ""))
    return out


def probes_block(root: Path, rel_probes: str, rel_records: str) -> str:
    """Each probe under docs/probes beside the record it tests: what its config changes, and its last
    accuracy against the record's at the same round and over the record's whole run."""
    import tomllib

    from dpfl.config import load_config
    from dpfl.experiments.report import load_run

    root = Path(root)
    index_file = root / PROBES
    try:
        index = tomllib.loads(index_file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{index_file}: {e}") from None
    folders = sorted(p.name for p in index_file.parent.iterdir() if p.is_dir())
    if sorted(index) != folders:
        raise ConfigError(f"{index_file} must name every probe folder once: folders without an entry "
                          f"{sorted(set(folders) - set(index)) or '[]'}, entries without a folder "
                          f"{sorted(set(index) - set(folders)) or '[]'}")
    lines = [("| probe | record it tests | changes against the record | rounds | probe accuracy (round) | "
              "record at that round | record's best by then (round) | record first reaches it | "
              "record's best (round), rounds run |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for name in folders:
        entry = index[name]
        rec = entry.get("record") if isinstance(entry, dict) else None
        if set(entry if isinstance(entry, dict) else ()) != {"record"} or not isinstance(rec, str):
            raise ConfigError(f"{index_file}: [{name}] must hold exactly one key, record = \"TABLE/ROW\"")
        pdir, rdir = index_file.parent / name, root / "records" / rec
        for d in (pdir, rdir):
            if not (d / "metrics.jsonl").is_file() or not (d / "config.toml").is_file():
                raise ConfigError(f"{index_file}: [{name}]: {d} has no config.toml and metrics.jsonl")
        _, pm = load_run(pdir)
        _, rm = load_run(rdir)
        pcfg, rcfg = (load_config(d / "config.toml") for d in (pdir, rdir))
        last = next((m for m in reversed(pm) if "accuracy" in m), None)
        if last is None:
            raise ConfigError(f"{pdir}: no round was evaluated")
        planned = pcfg.federation.rounds
        rounds = f"{len(pm)} of {planned}" + (", cut short" if len(pm) < planned else "")
        if planned != rcfg.federation.rounds:
            rounds += f" (record: {rcfg.federation.rounds})"
        at = next((m for m in rm if m["round"] == last["round"] and "accuracy" in m), None)
        first = next((m for m in rm if m.get("accuracy", -1.0) >= last["accuracy"]), None)
        revals = [m for m in rm if "accuracy" in m]
        if not revals:
            raise ConfigError(f"{rdir}: no round was evaluated")
        best = max(revals, key=lambda m: m["accuracy"])
        by_then = max((m for m in revals if m["round"] <= last["round"]), key=lambda m: m["accuracy"], default=None)
        changes = "; ".join(config_changes(pcfg, rcfg)) or "none"
        lines.append(
            f"| [{name}]({rel_probes}/{name}) | [{rec}]({rel_records}/{rec}) | {changes} | {rounds} | "
            f"{last['accuracy']:.4f} ({last['round']}) | "
            + (f"{at['accuracy']:.4f}" if at else "not evaluated") + " | "
            + (f"{by_then['accuracy']:.4f} ({by_then['round']})" if by_then else "—") + " | "
            + (f"round {first['round']}" if first else "never") + " | "
            f"{best['accuracy']:.4f} ({best['round']}), {len(rm)} |")
    return "\n".join(lines)


# ---- splicing ------------------------------------------------------------------------------------

def splice(text: str, name: str, body: str, source: str) -> str:
    begin = BEGIN.format(name)
    i = text.find(begin)
    j = text.find(END, i) if i >= 0 else -1
    if i < 0 or j < 0:
        raise ConfigError(f"{source} has no generated block {name!r}: add the lines `{begin}` and `{END}` "
                          "where it goes")
    return text[: i + len(begin)] + "\n" + body + "\n" + text[j:]


def block_names(text: str) -> list[str]:
    return re.findall(r"<!-- BEGIN generated: (\S+) -->", text)


def generated(root: Path) -> dict[Path, str]:
    """The full new text of README.md and docs/RESULTS.md: every block regenerated from root/records (and
    docs/audit.md's table from the audit runs under docs/audit)."""
    from dpfl.audit.table import audit_block

    root = Path(root)
    records = root / "records"
    tables = record_tables(records)
    out = {}
    for doc, blocks in (
            (root / "README.md", {"headline": lambda: headline_block(records, "records")}),
            (root / "docs" / "RESULTS.md",
             {"scoreboard": lambda: scoreboard_block(records),
              "best-readings": lambda: best_readings_block(records, "../records", "probes"),
              **{t: (lambda t=t, v=v: table_block(records, t, v, "../records", f"figures/{t}.png"))
                 for t, v in tables.items()},
              **({"probes": lambda: probes_block(root, "probes", "../records")} if (root / PROBES).is_file()
                 else {})}),
            *[(root / CONFIG_RUNS["record-dp"], {"record-dp": lambda: record_dp_block(records, "../records")})]
            * (records / "record-dp").is_dir(),
            *[(root / AUDIT_DOC, {"audit": lambda: audit_block(root / AUDIT_RUNS, "audit")})]
            * (root / AUDIT_RUNS).is_dir()):
        if not doc.is_file():
            raise ConfigError(f"{doc} is missing: it holds generated blocks ({', '.join(blocks)})")
        text = doc.read_text()
        stale = [n for n in block_names(text) if n not in blocks]
        if stale:
            raise ConfigError(f"{doc}: generated block(s) {', '.join(stale)} have no records any more; "
                              "remove them")
        for name, make in blocks.items():
            text = splice(text, name, make(), str(doc))
        out[doc] = text
    return out


def publish(root: Path, console: Console, check: bool = False, figures: bool = True) -> list[Path]:
    """Write the generated blocks (and figures); with `check`, write nothing and return the files whose
    blocks differ from the records."""
    root = Path(root)
    new = generated(root)
    changed = [p for p, text in new.items() if p.read_text() != text]
    if check:
        for p in changed:
            console.print(f"{p}: generated blocks differ from records/; run `dpfl publish`", highlight=False)
        return changed
    for p in changed:
        p.write_text(new[p])
        console.print(f"wrote {p}", highlight=False)
    if figures:
        for table, variants in record_tables(root / "records").items():
            path = table_figure(root / "records", table, variants, root / "docs" / "figures" / f"{table}.png")
            console.print(f"wrote {path}", highlight=False)
    return changed
