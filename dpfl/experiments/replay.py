"""`dpfl reproduce TABLE --replay N --out records`: run the first N rounds of every recorded row again,
from its own `config.toml`, and compare each metrics line with the record's, value for value.

A before/after check for changes that must not change results: the same seed on the same machine
gives the same accuracy, bytes and ε, so any difference is a change of behaviour (or of machine:
records name theirs in `summary.json`). Wall times (`*_seconds`) are not compared. The rows run in
a temporary directory; nothing under the records is written.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dpfl.errors import ConfigError


def recorded_rows(records: Path, table: str) -> list[Path]:
    """Run directories under `records` of `table` (its accountant variants included; "all": every table)."""
    from dpfl.experiments.publish import _dir_name, record_tables

    if not Path(records).is_dir():
        raise ConfigError(f"{records} is not a directory of run records")
    tables = record_tables(records)
    if table != "all" and table not in tables:
        raise ConfigError(f"{records} holds no records of {table!r}; it has: {', '.join(tables) or 'none'}")
    dirs = []
    for t, variants in tables.items():
        if table in ("all", t):
            for acct in variants:
                d = Path(records) / _dir_name(t, acct)
                dirs += sorted(p for p in d.iterdir() if (p / "metrics.jsonl").is_file() and (p / "config.toml").is_file())
    return dirs


def _comparable(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(m)).items() if not k.endswith("_seconds")}


def rerun(run_dir: Path, rounds: int) -> list[dict[str, Any]]:
    """The first `rounds` metrics lines of the row in `run_dir`, run afresh from its config.toml."""
    from dpfl.config import load_config
    from dpfl.engine.simulator import simulate
    from dpfl.run.state import Run

    cfg = load_config(run_dir / "config.toml")
    got: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        simulate(Run(cfg, Path(tmp) / "run", log=lambda s: None), lambda m: got.append(_comparable(m)), until=rounds)
    return got


def compare(want: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    """One line per metric that differs between two runs' metrics lines (wall times ignored)."""
    diffs = [] if len(want) == len(got) else [f"{len(want)} rounds on record, {len(got)} now"]
    for r, (a, b) in enumerate(zip(map(_comparable, want), got), 1):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diffs.append(f"round {r} {k}: record {a.get(k)!r}, now {b.get(k)!r}")
    return diffs


def replay_row(run_dir: Path, rounds: int, against: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rounds 1..`rounds` of the row in `run_dir`, run afresh and compared with its metrics.jsonl (or with
    `against`: the same rounds as another checkout of dpfl ran them, see `main`)."""
    from dpfl.experiments.report import load_run

    summary, recorded = load_run(run_dir) if against is None else ({}, against)
    want = recorded[:rounds]
    got = rerun(run_dir, len(want))
    keys = sorted({k for m in want for k in _comparable(m)})
    code = summary.get("code") if isinstance(summary, dict) else None  # None: unfinished, or older than `code`
    return {"dir": str(run_dir), "rounds": len(want), "keys": keys, "diffs": compare(want, got), "got": got,
            "code": code if isinstance(code, list) else None}


def _commit(e: dict[str, Any]) -> str:
    return f"{e.get('commit') or 'unknown'}{' (modified)' if e.get('modified') else ''}"


def code_note(code: list[dict[str, Any]] | None) -> str:
    """Which code made the record, beside the code replaying it: a difference may be a change of code."""
    from dpfl.run.state import code_version

    now = _commit(code_version())
    if not code:
        return f"  the record does not name the code that made it; this checkout is commit {now}"
    ran = ", ".join(f"{_commit(e)} from round {e.get('from_round')}" + (f" on {e['ran_on']}" if e.get("ran_on") else "")
                    for e in code if isinstance(e, dict))
    return f"  the record ran at commit {ran}; this checkout is {now}"


def replay(records: Path, table: str, rounds: int, console: Console) -> list[dict[str, Any]]:
    """Replay every recorded row of `table`; prints one line per row and a table; returns the results."""
    if rounds < 1:
        raise ConfigError(f"--replay must be at least 1 round, got {rounds}")
    out = []
    for d in recorded_rows(records, table):
        res = replay_row(d, rounds)
        out.append(res)
        verdict = "same" if not res["diffs"] else f"{len(res['diffs'])} difference(s)"
        console.print(f"{d}: {res['rounds']} round(s), {len(res['keys'])} metrics compared: {verdict}",
                      highlight=False)
        for line in res["diffs"][:8]:
            console.print(f"  {line}", highlight=False, soft_wrap=True)
        if res["diffs"]:
            console.print(code_note(res["code"]), highlight=False, soft_wrap=True)
    t = Table(title=f"replay of {table}: first {rounds} round(s) vs the records")
    for c in ("row", "rounds", "metrics", "result"):
        t.add_column(c)
    for res in out:
        t.add_row(str(Path(res["dir"]).relative_to(records)), str(res["rounds"]), str(len(res["keys"])),
                  "same" if not res["diffs"] else f"{len(res['diffs'])} differ")
    console.print(t)
    return out


def main(argv: list[str] | None = None) -> None:
    """Before/after check across commits: `python replay.py RECORDS OUT.json --rounds N` saves what this
    checkout computes (the file only needs what dpfl had before `--replay` existed, so it runs on older
    commits too); `--against BEFORE.json` compares with such a file instead of the records."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("records", type=Path)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--table", default="all")
    ap.add_argument("--against", type=Path)
    a = ap.parse_args(argv)
    before = json.loads(a.against.read_text()) if a.against else None
    saved, differ = {}, 0
    for d in recorded_rows(a.records, a.table):
        key = str(d.relative_to(a.records))
        if before is not None:
            if key not in before:
                print(f"{key}: not in {a.against}")
                continue
            res = replay_row(d, a.rounds, before[key])
            differ += bool(res["diffs"])
            print(f"{key}: {'same' if not res['diffs'] else res['diffs'][:4]}", flush=True)
        if a.out:
            saved[key] = res["got"] if before is not None else rerun(d, a.rounds)
            a.out.write_text(json.dumps(saved, indent=1))
            print(f"{key}: saved", flush=True)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
