"""Best faithful readings: for a thesis row that misses (more than 0.03 below the thesis), the one setting a
reading of the thesis changes, and the full-length run of the row with it.

`records/best/readings.toml` names, per row (`["TABLE/ROW"]`), either

    set = "KEY=VALUE"   the one setting the reading changes, in `--set` syntax, against the row's
                        literal record (`records/TABLE/ROW/config.toml`)
    reason = "..."      why the thesis allows it: the passage it reads
    probe = "NAME"      the probe (`docs/probes/NAME`) it was chosen on; omitted only where the run
                        under records/best is itself that probe, run to full length

or `none = "..."`: why no faithful reading is run for the row (the literal reading stands).

`records/best/TABLE/ROW/` holds the run of that reading, laid out as every record (`config.toml`,
`metrics.jsonl`, `summary.json`); its config must be the literal record's with that one setting
changed (name and run resources aside), or `dpfl publish` refuses it. `dpfl publish` puts the result
beside the literal reading in every table and counts both in the scoreboard.

`python -m dpfl.experiments.best plan` prints the command of every reading not yet run;
`python -m dpfl.experiments.best batch ROW... --out DIR --budget SECONDS` runs rows in parallel (one
process each, on CUDA by default) until done or the budget is spent (then each row finishes its round,
saves a checkpoint and stops), and packs the run directories into DIR as at most 8 files, none over
16 MiB: `best-records.tgz` and `best-ckpt-N.tar` unpack with `tar -xf FILE -C records/best`,
`best-logs.tgz` holds each row's output. `plan --json ROWS > FILE` and `batch --plan FILE` run a batch
on a host without records/.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dpfl.errors import ConfigError

BEST = "best"  # records/best/<table>/<row>/: the runs of the best faithful readings
READINGS = "readings.toml"  # records/best/readings.toml
PROBES_DIR = "docs/probes"


@dataclass(frozen=True)
class Reading:
    table: str
    row: str
    set: str | None  # the one setting changed, `key=value`; None: no faithful reading is run (see `reason`)
    reason: str  # the thesis passage that allows the reading, or why none is run
    probe: str | None  # the docs/probes folder it was chosen on

    @property
    def key(self) -> str:
        return self.set.split("=", 1)[0] if self.set else ""


def readings_file(records: Path) -> Path:
    return Path(records) / BEST / READINGS


def load_readings(records: Path, probes: bool = True) -> dict[tuple[str, str], Reading]:
    """(table, row) -> its Reading, from records/best/readings.toml ({} without the file). A key that is no
    table row, a row that reads another row's record (`same_run`: name that row), an entry with unknown or
    missing keys, a `set` that is not one `key=value` the row's config takes, or (with `probes`) a probe folder
    that does not exist is a ConfigError."""
    from dpfl.experiments.reproduce import same_run, table_rows

    path = readings_file(records)
    if not path.is_file():
        return {}
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None
    out = {}
    for key, entry in raw.items():
        where = f"{path}: [{key!r}]"
        table, _, row = key.partition("/")
        try:
            rows = table_rows(table)[1]
        except ConfigError:
            rows = {}
        if row not in rows:
            raise ConfigError(f"{where}: no thesis table row {key!r} (give \"TABLE/ROW\")")
        owner = same_run(table, row)
        if owner != (table, row):
            raise ConfigError(f"{where}: this row reads the record of {'/'.join(owner)}; name that row")
        if not isinstance(entry, dict) or not all(isinstance(v, str) and v.strip() for v in entry.values()):
            raise ConfigError(f"{where}: every value must be a non-empty string")
        if "none" in entry:
            if set(entry) != {"none"}:
                raise ConfigError(f"{where}: `none` (why no reading is run) stands alone")
            out[(table, row)] = Reading(table, row, None, entry["none"], None)
            continue
        if not {"set", "reason"} <= set(entry) <= {"set", "reason", "probe"}:
            raise ConfigError(f"{where}: give set = \"KEY=VALUE\", reason and probe (or none = \"why\"); "
                              f"got {', '.join(sorted(entry)) or 'nothing'}")
        if not re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+=\S.*", entry["set"]):
            raise ConfigError(f"{where}: set must be one KEY=VALUE in --set syntax, got {entry['set']!r}")
        probe = entry.get("probe")
        if probes and probe is not None and not (Path(records).parent / PROBES_DIR / probe / "metrics.jsonl").is_file():
            raise ConfigError(f"{where}: probe {probe!r} is no folder of {PROBES_DIR} with a metrics.jsonl")
        reading = Reading(table, row, entry["set"], entry["reason"], probe)
        reading_config(records, reading)  # the setting must apply to the row
        out[(table, row)] = reading
    return out


def literal_dir(records: Path, table: str, row: str) -> Path:
    """The row's literal record: records/<table>/<row>, or that of the row it reads (`same_run`)."""
    from dpfl.experiments.reproduce import row_dir

    return row_dir(table, row, Path(records) / table)


def _literal_config(records: Path, table: str, row: str):
    from dpfl.config import load_config

    d = literal_dir(records, table, row)
    if not (d / "config.toml").is_file():
        raise ConfigError(f"{table}/{row}: no literal record at {d} to change one setting of")
    return load_config(d / "config.toml")


def reading_config(records: Path, reading: Reading):
    """The literal record's config with the reading's one setting changed."""
    from dpfl.config import load_config

    d = literal_dir(records, reading.table, reading.row)
    _literal_config(records, reading.table, reading.row)
    cfg = load_config(d / "config.toml", [reading.set])
    if _experiment(cfg) == _experiment(_literal_config(records, reading.table, reading.row)):
        raise ConfigError(f"{readings_file(records)}: [{reading.table}/{reading.row!r}]: {reading.set} is what the "
                          "literal record already runs")
    return cfg


def _experiment(cfg) -> dict:
    """A config without its name and run resources (threads, device, engine, checkpoints: how, not what)."""
    return cfg.model_dump(mode="json", exclude={"name", "run"})


def check_record(records: Path, reading: Reading, run_dir: Path) -> None:
    """A best-reading record must run the literal record's config with the reading's one setting changed."""
    from dpfl.config import load_config
    from dpfl.experiments.report import config_diff

    if reading.set is None:
        raise ConfigError(f"{run_dir}: {readings_file(records).name} says no reading is run for "
                          f"{reading.table}/{reading.row}")
    want = reading_config(records, reading)
    got = load_config(Path(run_dir) / "config.toml")
    if _experiment(want) != _experiment(got):
        diff = [s for s in config_diff(want, got) if not s.startswith("run.")]
        raise ConfigError(f"{run_dir}: not the literal record's config with only {reading.set} changed "
                          f"(it also differs in {', '.join(diff)})")


def best_runs(records: Path, table: str) -> dict[str, dict]:
    """row -> the run of its best reading under records/best/<table> (finished or not), with the Reading: the
    `collect_runs` dict plus `reading`. A run directory without a reading, or whose config is not the reading's,
    is a ConfigError."""
    from dpfl.experiments.reproduce import collect_runs

    base = Path(records) / BEST / table
    if not base.is_dir():
        return {}
    readings = load_readings(records)
    rows = row_order(table)
    found = {d.name for d in base.iterdir() if (d / "metrics.jsonl").is_file()}
    stray = sorted(found - set(rows))
    if stray:
        raise ConfigError(f"{base}: {', '.join(stray)} is no row of {table}")
    out = {}
    results, _ = collect_runs(table, base, [r for r in rows if (table, r) in readings or r in found])
    for res in results:
        d = Path(res["dir"])
        t, r = d.parent.name, d.name  # a same_run row: the run of the row it reads
        reading = readings.get((t, r))
        if reading is None:
            raise ConfigError(f"{d}: no entry [\"{t}/{r}\"] in {readings_file(records)} naming its reading")
        check_record(records, reading, d)
        out[res["row"]] = {**res, "reading": reading}
    return out


# ---- commands ------------------------------------------------------------------------------------

def overrides(records: Path, reading: Reading) -> list[str]:
    """The `--set`s that make the table row's config the reading's: the literal record's own and the reading's
    setting; of the run resources only `run.max_cohort` (without which signSGD's 6,000-client round would
    need 40 GB)."""
    from dpfl.config import load_config
    from dpfl.experiments.report import config_diff
    from dpfl.experiments.reproduce import table_rows

    base = load_config(table_rows(reading.table)[1][reading.row])
    return [s for s in config_diff(base, reading_config(records, reading))
            if not s.startswith("run.") or s.startswith("run.max_cohort=")]


def _quote(s: str) -> str:
    return f"--set '{s}'" if re.search(r"[\"' ()]", s) else f"--set {s}"


def command(records: Path, reading: Reading, resources: tuple[str, ...] = ("run.threads=1",)) -> str:
    """The `dpfl reproduce` command that runs (or resumes) the reading into records/best."""
    sets = [*overrides(records, reading), *resources]
    return " ".join([f"dpfl reproduce {reading.table} --row {reading.row}", *map(_quote, sets),
                     f"--out records/{BEST}"])


def pending(records: Path) -> list[Reading]:
    """Readings with a setting and no full-length run yet, in table order."""
    from dpfl.experiments.reproduce import collect_runs, full_rounds

    out = []
    for (table, row), reading in load_readings(records).items():
        if reading.set is None:
            continue
        results, _ = collect_runs(table, Path(records) / BEST / table, [row])
        s = results[0]["summary"] if results else {}
        if not (s.get("rounds_run") == full_rounds(table, row) and not s.get("stopped")):
            out.append(reading)
    order = {t: i for i, t in enumerate(_tables())}
    return sorted(out, key=lambda r: (order.get(r.table, len(order)), row_order(r.table).index(r.row)))


def row_order(table: str) -> list[str]:
    """The table's rows in the thesis's order, then the rows it has no number for."""
    from dpfl.experiments.reproduce import table_rows

    thesis, rows = table_rows(table)
    return [r for r in thesis if r in rows] + [r for r in rows if r not in thesis]


def _tables() -> list[str]:
    from dpfl.experiments.reproduce import list_tables

    return sorted(list_tables(), key=lambda t: tuple((0, int(x), "") if x.isdigit() else (1, 0, x)
                                                   for x in re.split(r"[.-]", t.removeprefix("table-"))))


# ---- the GPU batch -------------------------------------------------------------------------------

def reproduce_argv(table: str, row: str, sets: list[str], parent: Path) -> list[str]:
    """The process that runs (or resumes) one reading into parent/<table>/<row>."""
    import sys

    return [sys.executable, "-m", "dpfl.cli.main", "reproduce", table, "--row", row,
            *[x for s in sets for x in ("--set", s)], "--out", str(parent)]


def batch_plan(records: Path, rows: list[str]) -> list[dict]:
    """What `batch` runs for each "TABLE/ROW": {"table", "row", "sets" (its `overrides`), "rounds"} — as JSON
    (`plan --json ROWS`), a batch can run on a host that has no records/."""
    from dpfl.experiments.reproduce import full_rounds

    readings = load_readings(records, probes=False)  # a GPU host may carry records/ without docs/
    out = []
    for name in rows:
        t, _, r = name.partition("/")
        reading = readings.get((t, r))
        if reading is None or reading.set is None:
            raise ConfigError(f"{name}: no reading with a setting in {readings_file(records)}")
        out.append({"table": t, "row": r, "sets": overrides(records, reading), "rounds": full_rounds(t, r)})
    return out


def batch(root: Path, rows: list[str], out: Path, budget: float, device: str = "cuda", cores: int | None = None,
          checkpoint_every: int = 5, work: Path | None = None, log=print, argv=None,
          plan: list[dict] | None = None) -> dict[str, str]:
    """Run the readings of `rows` ("TABLE/ROW") in parallel, one `dpfl reproduce` process each, resuming any
    run (checkpoint) already under root/records/best. After `budget` seconds each process is sent SIGTERM: it
    finishes its round, saves a checkpoint and stops (SIGKILL 120 s later). Then `out` receives at most 8
    files, each under 16 MiB: `best-records.tgz` (every run directory without its checkpoint),
    `best-ckpt-N.tar` (the checkpoints of rows left unfinished, most advanced first, as many as fit in
    56 MiB; `tar -xf FILE -C records/best` unpacks each) and `best-logs.tgz` (each row's output and the
    status). `plan` (from `batch_plan`, or a `plan --json` file) spares the host records/: then only a run
    to resume is read from root/records/best. Returns row -> "done", "cut at R/T" or "failed (rc …) at R/T"."""
    import os
    import shutil
    import signal
    import subprocess
    import tarfile
    import tempfile
    import time

    root, out = Path(root).resolve(), Path(out)
    records = root / "records"
    if plan is None:
        plan = batch_plan(records, rows)
    if not plan:
        raise ConfigError("give the rows to run, TABLE/ROW")
    work = Path(work) if work else Path(tempfile.gettempdir()) / "dpfl-best-batch"
    argv = argv or reproduce_argv
    cores = cores or os.cpu_count() or 1
    threads = max(1, cores // len(plan))
    procs = {}
    t0 = time.monotonic()
    for item in plan:
        table, row = item["table"], item["row"]
        name = f"{table}/{row}"
        parent = work / f"{table}__{row}"
        run_dir = parent / table / row
        have = records / BEST / table / row
        if have.is_dir() and not run_dir.exists():  # resume what an earlier call (or a CPU) left
            shutil.copytree(have, run_dir)
        sets = [*item["sets"], f'run.device="{device}"', f"run.threads={threads}",
                f"run.checkpoint_every={checkpoint_every}"]
        cmd = argv(table, row, sets, parent)
        parent.mkdir(parents=True, exist_ok=True)
        logf = open(parent / "batch.log", "w")  # noqa: SIM115 (closed below)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        procs[name] = (subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=root),
                       logf, run_dir, item)
        log(f"started {name} ({threads} thread(s), {device}): {' '.join(map(str, cmd))}")
    deadline, killed_at, shown = t0 + budget, None, t0
    while any(p.poll() is None for p, *_ in procs.values()):
        now = time.monotonic()
        if now >= shown + 60:  # progress: rounds on record per row
            shown = now
            log(f"{now - t0:.0f} s: " + ", ".join(
                f"{n} {_rounds_done(d)}" for n, (_, _, d, _) in procs.items()))
        if now >= deadline and killed_at is None:
            log(f"budget of {budget:.0f} s spent: SIGTERM to the rows still running (each ends its round)")
            for p, *_ in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            killed_at = now
        if killed_at is not None and now >= killed_at + 120:
            for p, *_ in procs.values():
                if p.poll() is None:
                    p.kill()
        time.sleep(1)
    status = {}
    unfinished = []
    for name, (p, logf, run_dir, item) in procs.items():
        logf.close()
        ran, total = _rounds_done(run_dir), item["rounds"]
        done = (run_dir / "summary.json").is_file() and ran == total
        status[name] = "done" if done else f"cut at {ran}/{total}" if p.returncode in (0, 130) \
            else f"failed (rc {p.returncode}) at {ran}/{total}"
        if not done and (run_dir / "checkpoint.pt").is_file():
            unfinished.append((ran, run_dir))
        log(f"{name}: {status[name]} ({time.monotonic() - t0:.0f} s)")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "best-records.tgz", "w:gz") as tar:  # unpacks into records/best
        for _, _, run_dir, item in procs.values():
            if run_dir.is_dir():
                tar.add(run_dir, arcname=f"{item['table']}/{item['row']}",
                        filter=lambda ti: None if ti.name.endswith((".pt", ".pt.tmp", ".png")) else ti)
    status_file = work / "batch-status.json"
    status_file.write_text(json.dumps(status, indent=2))
    with tarfile.open(out / "best-logs.tgz", "w:gz") as tar:  # each row's output, and the status: not records
        for _, _, run_dir, item in procs.values():
            tar.add(run_dir.parent.parent / "batch.log", arcname=f"{item['table']}__{item['row']}.log")
        tar.add(status_file, arcname="batch-status.json")
    # the checkpoints of unfinished rows, most advanced first: at most 6 more files of < 16 MiB, 56 MiB in all
    groups: list[list[Path]] = []
    size = sent = 0
    for _, run_dir in sorted(unfinished, key=lambda x: -x[0]):
        s = (run_dir / "checkpoint.pt").stat().st_size
        new_group = not groups or size + s > 15.5 * 2**20
        if sent + s > 56 * 2**20 or (new_group and len(groups) == 6):
            log(f"{run_dir.parent.name}/{run_dir.name}: its checkpoint does not fit in what comes back; its "
                "progress stays on this host only")
            continue
        if new_group:
            groups.append([])
            size = 0
        groups[-1].append(run_dir)
        size += s
        sent += s
    for i, group in enumerate(groups, 1):
        _tar_checkpoints(out / f"best-ckpt-{i}.tar", group)
    return status


def _rounds_done(run_dir: Path) -> int:
    f = run_dir / "metrics.jsonl"
    return len(f.read_text().splitlines()) if f.is_file() else 0


def _tar_checkpoints(path: Path, run_dirs: list[Path]) -> None:
    import tarfile

    with tarfile.open(path, "w") as tar:
        for d in run_dirs:
            tar.add(d / "checkpoint.pt", arcname=f"{d.parent.name}/{d.name}/checkpoint.pt")


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from dpfl.errors import DpflError

    ap = argparse.ArgumentParser(prog="python -m dpfl.experiments.best", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    plan = sub.add_parser("plan", help="print the command of every reading not yet run at full length")
    plan.add_argument("rows", nargs="*", help="with --json: the TABLE/ROW readings to plan a batch of")
    plan.add_argument("--json", action="store_true", help="print a batch plan of ROWS (for `batch --plan`)")
    plan.add_argument("--root", type=Path, default=Path("."))
    run = sub.add_parser("batch", help="run readings in parallel, one process each, within a time budget")
    run.add_argument("rows", nargs="*", help="TABLE/ROW of each reading to run")
    run.add_argument("--plan", type=Path, default=None, help="a `plan --json` file instead of ROWS (no records/ needed)")
    run.add_argument("--root", type=Path, default=Path("."))
    run.add_argument("--out", type=Path, required=True, help="where the packed run directories go")
    run.add_argument("--budget", type=float, default=450.0, help="seconds before the rows are asked to stop")
    run.add_argument("--device", default="cuda")
    run.add_argument("--cores", type=int, default=None, help="host cores shared by the rows (default: all)")
    run.add_argument("--work", type=Path, default=None, help="where the rows run (default: TMPDIR/dpfl-best-batch)")
    args = ap.parse_args(argv)
    try:
        records = args.root / "records"
        if args.what == "plan":
            if args.json:
                print(json.dumps(batch_plan(records, args.rows), indent=1))
            else:
                for reading in pending(records):
                    print(command(records, reading))
            return 0
        if bool(args.rows) == (args.plan is not None):
            raise ConfigError("give either TABLE/ROW arguments or --plan FILE")
        plan_rows = None
        if args.plan is not None:
            try:
                plan_rows = json.loads(args.plan.read_text())
            except (OSError, ValueError) as e:
                raise ConfigError(f"{args.plan}: {e}") from None
        status = batch(args.root, args.rows, args.out, args.budget, args.device, args.cores, work=args.work,
                       plan=plan_rows)
    except DpflError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(status, indent=2))
    return 0 if all(not s.startswith("failed") for s in status.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
