"""Best faithful readings (issue 42): a second, generated column beside the literal reading in every thesis
table, counted in the scoreboard, read from full-length runs under records/best that change ONE setting
of their literal record; a miss without such a run says "not run" and is counted apart, never given a number."""

import json
import sys
import tarfile
from pathlib import Path

import pytest

from dpfl.config import dump_config, load_config
from dpfl.errors import ConfigError
from dpfl.experiments import best as bst
from dpfl.experiments import publish as pub
from dpfl.experiments.report import best_round, load_run

ROOT = Path(__file__).resolve().parents[2]
TABLE = "table-9.1"


def _cfg(row: str, seed: int, rounds: int = 3):
    return load_config(data={
        "name": row, "seed": seed,
        "data": {"dataset": "digits", "n_clients": 20},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
        "train": {"steps": 2, "batch_size": 8, "lr": 0.2},
        "federation": {"rounds": rounds, "clients_per_round": 5},
        "scheme": {"name": "fl-rnd", "options": {"ratio": 0.5}},
    })


def _record(d: Path, cfg, accs: list[float]) -> Path:
    """A run directory as a run writes it: config, one metrics line per round, a summary once finished."""
    d.mkdir(parents=True)
    (d / "config.toml").write_text(dump_config(cfg))
    lines = [{"round": r, "accuracy": a, "loss": 1.0, "cum_up_bytes_per_client": 1000.0 * r,
              "cum_down_bytes_per_client": 2000.0 * r, "round_seconds": 1.0} for r, a in enumerate(accs, 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    if len(accs) == cfg.federation.rounds:
        (d / "summary.json").write_text(json.dumps({"best": best_round(lines), "rounds_run": len(accs)}))
    return d


# row: (literal accuracies, thesis, reading in readings.toml, best-reading run's accuracies or None)
ROWS = {
    "a": ([0.5012, 0.6023, 0.7001], 0.71, None, None),  # within: the literal reading stands
    "b": ([0.4012, 0.5023, 0.6001], 0.70, "set", [0.5012, 0.6903, 0.6801]),  # a miss with a full-length run
    "c": ([0.4012, 0.5023, 0.6001], 0.70, "set", None),  # a miss whose reading is not run yet
    "d": ([0.4012, 0.5023, 0.6001], 0.70, None, None),  # a miss with no reading named
    "e": ([0.4012, 0.5023, 0.6001], 0.70, "none", None),  # a miss for which no reading is run, with the reason
    "f": ([0.4012, 0.5023, 0.6001], 0.70, "set", [0.5012, 0.6903]),  # a miss whose reading's run was cut short
}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A thesis table of six rows, their literal records, readings.toml and the best-reading runs."""
    import dpfl.experiments.reproduce as rp

    configs = tmp_path / "configs" / TABLE
    configs.mkdir(parents=True)
    thesis = {"_table": {"description": "a tiny table", "unit": "KB"}}
    for i, (row, (accs, th, _, _)) in enumerate(ROWS.items()):
        (configs / f"{row}.toml").write_text(dump_config(_cfg(row, i)))
        thesis[row] = {"accuracy": th}
    (configs / "thesis.json").write_text(json.dumps(thesis))
    monkeypatch.setattr(rp, "configs_root", lambda: tmp_path / "configs")
    records = tmp_path / "root" / "records"
    readings = []
    for i, (row, (accs, _, reading, best)) in enumerate(ROWS.items()):
        _record(records / TABLE / row, _cfg(row, i), accs)
        if reading == "set":
            readings.append(f'["{TABLE}/{row}"]\nset = "train.lr=0.3"\nreason = "§9: η from the grid"\n'
                            + ('probe = "lr0.3"\n' if best is None else ""))
        elif reading == "none":
            readings.append(f'["{TABLE}/{row}"]\nnone = "no reading of §9 is left to run"\n')
        if best is not None:
            _record(records / "best" / TABLE / row, load_config(records / TABLE / row / "config.toml",
                                                               ["train.lr=0.3"]), best)
    (records / "best" / "readings.toml").write_text("\n".join(readings))
    _record(tmp_path / "root" / "docs" / "probes" / "lr0.3", _cfg("c", 2, 2), [0.5012, 0.6023])
    return records


def _cells(block: str, row: str) -> list[str]:
    line = next(ln for ln in block.splitlines() if ln.startswith(f"| [{row}]("))
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_every_table_gets_a_best_reading_column_beside_the_literal_one(tree):
    block = pub.table_block(tree, TABLE, [None], "../records", None)
    head = [c.strip() for c in block.splitlines()[2].strip("|").split("|")]
    col = head.index(pub.BEST_COLUMN)
    assert head[col - 1] == "Δ"  # beside the literal reading's Δ
    assert _cells(block, "a")[col] == "—"  # within ±0.03: nothing to read differently
    assert _cells(block, "b")[col] == ("[0.6903 (2), Δ -0.010](../records/best/table-9.1/b); `train.lr=0.3`")
    assert _cells(block, "b")[col - 1] == "-0.100"  # the literal column stays as it is
    assert _cells(block, "c")[col] == "not run (`train.lr=0.3`)"  # no number is made up
    assert _cells(block, "d")[col] == "no reading chosen yet"
    assert _cells(block, "e")[col] == "none run (the literal reading stands)"
    assert _cells(block, "f")[col].startswith("not run to full length: [0.6903 (2), 2/3, cut short](")


def test_the_scoreboard_counts_both_columns_and_the_misses_not_run_apart(tree):
    board = pub.scoreboard_block(tree, scored=(TABLE,)).splitlines()
    head = [c.strip() for c in board[0].strip("|").split("|")]
    row = dict(zip(head, (c.strip() for c in board[2].strip("|").split("|"))))
    assert (row["literal: within ±0.03"], row["literal: above thesis"], row["literal: more than 0.03 below"]) == \
        ("1", "0", "5")
    assert (row["best reading: within ±0.03"], row["best reading: above thesis"],
            row["best reading: more than 0.03 below"]) == ("2", "0", "1")  # a, b within; e's literal stands
    assert row["best reading: not run (no full-length run yet)"] == "2"  # c, and f cut short
    assert row["best reading: none chosen yet"] == "1"  # d
    total = next(ln for ln in board if ln.startswith("All tables"))
    assert "6 rows with a Δ" in total and "1 (16.7%) in the literal reading" in total
    assert "2 (33.3%) in the best faithful reading, where 1 are more than 0.03 below, 2 not run yet and 1 have no " \
           "reading chosen yet" in total


def test_the_best_readings_block_names_setting_reason_probe_and_result_of_each_miss(tree):
    block = pub.best_readings_block(tree, "../records", "probes", scored=(TABLE,))
    rows = {ln.split("[")[1].split("]")[0]: [c.strip() for c in ln.strip().strip("|").split("|")]
            for ln in block.splitlines()[2:]}
    assert set(rows) == {"b", "c", "d", "e", "f"}  # a does not miss
    assert rows["b"][3:] == ["`train.lr=0.3`", "§9: η from the grid", "this run (a probe run to full length)",
                             "[0.6903 (2), Δ -0.010](../records/best/table-9.1/b)"]
    assert rows["c"][4:6] == ["as above", "[lr0.3](probes/lr0.3)"]
    assert rows["c"][6] == "not run: `dpfl reproduce table-9.1 --row c --set train.lr=0.3 --set run.threads=1 " \
                           "--out records/best`"
    assert rows["d"][3:] == ["—", "—", "—", "no reading chosen yet"]
    assert rows["e"][3:5] == ["none", "no reading of §9 is left to run"]
    assert rows["f"][6].startswith("not run to full length ([0.6903 (2), 2/3, cut short]")


def test_the_published_command_rebuilds_the_best_reading_config(tree):
    import shlex

    reading = bst.load_readings(tree)[(TABLE, "b")]
    args = shlex.split(bst.command(tree, reading))
    assert args[:5] == ["dpfl", "reproduce", TABLE, "--row", "b"] and args[-2:] == ["--out", "records/best"]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    rebuilt = load_config(tree.parent.parent / "configs" / TABLE / "b.toml", sets)
    assert bst._experiment(rebuilt) == bst._experiment(load_config(tree / "best" / TABLE / "b" / "config.toml"))


def test_a_best_reading_run_must_change_exactly_its_one_setting(tree):
    d = tree / "best" / TABLE / "b"
    cfg = load_config(d / "config.toml")
    (d / "config.toml").write_text(dump_config(cfg.model_copy(update={"seed": 99})))
    with pytest.raises(ConfigError, match=r"not the literal record's config with only train.lr=0.3 changed "
                                          r"\(it also differs in seed=99\)"):
        pub.table_block(tree, TABLE, [None], "../records", None)
    (d / "config.toml").write_text(dump_config(cfg.model_copy(update={"run": cfg.run.model_copy(
        update={"threads": 3, "device": "cpu"})})))  # run resources: how it ran, not what
    pub.table_block(tree, TABLE, [None], "../records", None)


def test_a_best_reading_run_needs_its_entry(tree):
    _record(tree / "best" / TABLE / "a", load_config(tree / TABLE / "a" / "config.toml", ["train.lr=0.3"]),
            [0.5, 0.6, 0.7])
    with pytest.raises(ConfigError, match=r'no entry \["table-9.1/a"\] in .*readings.toml naming its reading'):
        pub.scoreboard_block(tree, scored=(TABLE,))
    _record(tree / "best" / TABLE / "zz", _cfg("zz", 0), [0.5, 0.6, 0.7])
    with pytest.raises(ConfigError, match="zz is no row of table-9.1"):
        pub.table_block(tree, TABLE, [None], "../records", None)


@pytest.mark.parametrize("entry,words", [
    ('["table-9.1/b"]\nset = "train.lr=0.3"\nreason = "r"\nwhy = "x"\n', "give set"),
    ('["table-9.1/b"]\nset = "train.lr=0.3 seed=2"\nreason = "r"\n', "train.lr"),
    ('["table-9.1/b"]\nset = "train.lr=0.2"\nreason = "r"\n', "is what the literal record already runs"),
    ('["table-9.1/zz"]\nset = "train.lr=0.3"\nreason = "r"\n', "no thesis table row 'table-9.1/zz'"),
    ('["table-9.1/c"]\nset = "train.lr=0.3"\nreason = "r"\nprobe = "nope"\n', "probe 'nope' is no folder"),
    ('["table-9.1/e"]\nnone = "why"\nset = "train.lr=0.3"\n', "`none` .* stands alone"),
    ('["table-9.1/c"]\nset = "train.lr=0.3"\nreason = ""\n', "non-empty string"),
])
def test_a_wrong_reading_is_refused_with_one_line(tree, entry, words):
    bst.readings_file(tree).write_text(entry)
    with pytest.raises(ConfigError, match=words):
        bst.load_readings(tree)


def test_the_batch_stops_rows_at_the_budget_and_packs_records_and_checkpoints(tmp_path):
    """Each row a process; at the budget a row ends its round, saves its checkpoint and exits 130 (as `dpfl
    reproduce` does on SIGTERM); the packed files unpack into records/best."""
    fake = (
        "import json, signal, sys, time, pathlib\n"
        "d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True); n = int(sys.argv[2])\n"
        "stop = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
        "for r in range(1, n + 1):\n"
        "    with open(d / 'metrics.jsonl', 'a') as f: f.write(json.dumps({'round': r, 'accuracy': 0.5}) + '\\n')\n"
        "    (d / 'checkpoint.pt').write_bytes(b'x' * 1000)\n"
        "    if stop: sys.exit(130)\n"
        "    time.sleep(0.3 if n > 3 else 0)\n"
        "(d / 'summary.json').write_text('{}')\n")

    def argv(table, row, sets, parent):
        return [sys.executable, "-c", fake, str(parent / table / row), "3" if row == "quick" else "1000"]

    plan = [{"table": "table-9.1", "row": "quick", "sets": ["x=1"], "rounds": 3},
            {"table": "table-9.1", "row": "slow", "sets": ["x=1"], "rounds": 1000}]
    out = tmp_path / "out"
    status = bst.batch(tmp_path, [], out, budget=2, device="cpu", cores=4, work=tmp_path / "work",
                       log=lambda s: None, argv=argv, plan=plan)
    assert status["table-9.1/quick"] == "done"
    assert status["table-9.1/slow"].startswith("cut at ") and status["table-9.1/slow"].endswith("/1000")
    assert sorted(p.name for p in out.iterdir()) == ["best-ckpt-1.tar", "best-logs.tgz", "best-records.tgz"]
    with tarfile.open(out / "best-records.tgz") as tar:
        names = set(tar.getnames())
    assert {"table-9.1/quick/summary.json", "table-9.1/slow/metrics.jsonl"} <= names
    assert not any(n.endswith(".pt") for n in names)
    with tarfile.open(out / "best-ckpt-1.tar") as tar:
        assert tar.getnames() == ["table-9.1/slow/checkpoint.pt"]  # only the unfinished row's
    with tarfile.open(out / "best-logs.tgz") as tar:
        assert "batch-status.json" in tar.getnames()


@pytest.mark.parametrize("run_dir", sorted(p.parent for p in (ROOT / "records" / "best").glob("*/*/metrics.jsonl")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_best_reading_records_are_consistent_one_setting_runs(run_dir):
    """Each committed best-reading run: named in readings.toml, the literal record's config with only that one
    setting changed, its rounds consecutive up to the row's full length (an unfinished one may be committed
    with its checkpoint, as records/README.md says) and its summary's best its metrics' best."""
    from dpfl.experiments.reproduce import full_rounds

    records = ROOT / "records"
    table, row = run_dir.parent.name, run_dir.name
    reading = bst.load_readings(records)[(table, row)]
    bst.check_record(records, reading, run_dir)
    summary, metrics = load_run(run_dir)
    assert [m["round"] for m in metrics] == list(range(1, len(metrics) + 1))
    assert len(metrics) <= full_rounds(table, row) == load_config(run_dir / "config.toml").federation.rounds
    assert summary.get("rounds_run", len(metrics)) == len(metrics)
    best, recomputed = summary["best"], best_round(metrics)
    assert (best["round"], best["accuracy"]) == (recomputed["round"], recomputed["accuracy"])


def test_every_committed_miss_has_a_reading_or_says_why_not():
    """The rows more than 0.03 below the thesis in the literal column: each is in the best-readings block, with a
    reading, "none" and its reason, or said to have none chosen yet."""
    records = ROOT / "records"
    block = pub.best_readings_block(records, "../records", "probes")
    listed = {tuple(ln.split(" [")[0].strip("| ").split()) + (ln.split("[")[1].split("]")[0],)
              for ln in block.splitlines()[2:]}
    misses = set()
    tables = pub.record_tables(records)
    for table in pub.SCORED:
        _, entries, _ = pub.table_entries(records, table, tables[table])
        misses |= {(table, e["row"]) for e in entries if e["acct"] is None and pub._miss(e)}
    assert {(t, r) for t, r in listed} >= misses and len(misses) == 29


def test_the_plan_orders_every_table_thesis_and_not():
    """`best plan` sorts the tables by number; a table named otherwise (correlated-noise) sorts last,
    not a TypeError."""
    from dpfl.experiments import best
    from dpfl.experiments.reproduce import list_tables

    order = best._tables()
    assert sorted(order) == sorted(list_tables())
    assert order.index("table-4.1") < order.index("table-4.2") < order.index("table-6.10")
    assert order.index("table-6.3-fmnist") < order.index("table-6.10") < order.index("correlated-noise")


def test_a_reading_that_has_not_finished_a_round_yet_is_shown_as_such(tree):
    (tree / "best" / TABLE / "f" / "metrics.jsonl").write_text("")  # just started: config, no round yet
    block = pub.table_block(tree, TABLE, [None], "../records", None)
    head = [c.strip() for c in block.splitlines()[2].strip("|").split("|")]
    assert _cells(block, "f")[head.index(pub.BEST_COLUMN)].startswith("not run to full length: [no round yet, 0/3")
