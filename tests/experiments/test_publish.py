"""`dpfl publish`: README/RESULTS tables are the records' numbers, and nothing else."""

import json
import math
import re
import shlex
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.experiments import publish as pub
from dpfl.experiments.reproduce import table_rows
from dpfl.run.state import Run

ROOT = Path(__file__).resolve().parents[2]


def test_readme_and_results_are_exactly_what_the_records_generate():
    """Every generated block is regenerated from records/ and must equal the committed text: a number
    typed by hand, or left behind when a record changed, fails here."""
    for path, text in pub.generated(ROOT).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `dpfl publish`"


def test_every_table_on_record_has_its_block_and_figure():
    results = (ROOT / "docs" / "RESULTS.md").read_text()
    for table in pub.record_tables(ROOT / "records"):
        assert table in pub.block_names(results)
        assert (ROOT / "docs" / "figures" / f"{table}.png").is_file()


def _headline_rows():
    text = (ROOT / "README.md").read_text()
    block = text.split(pub.BEGIN.format("headline"))[1].split(pub.END)[0]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block.strip().splitlines()[2:]]


def test_headline_rows_each_point_at_an_existing_record():
    rows = _headline_rows()
    assert len(rows) == len(pub.HEADLINE)
    for label, measured, _, record, cmd in rows:
        link = re.fullmatch(r"\[(.+)\]\((.+)\)", record)
        if link is None:
            assert (measured, record) == ("no record yet", "—"), label
            continue
        run_dir = ROOT / link.group(2)
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        nan = re.match(r"diverged \(loss NaN from round (\d+)\)", measured)
        if nan:  # a diverged model: no accuracy, the first round whose loss is NaN
            losses = [m["loss"] for m in metrics]
            assert math.isnan(losses[int(nan.group(1)) - 1]), label
            assert not any(math.isnan(x) for x in losses[: int(nan.group(1)) - 1]), label
        else:
            value, rnd = re.match(r"(\d\.\d{4}) at round (\d+)", measured).groups()
            assert f"{metrics[int(rnd) - 1]['accuracy']:.4f}" == value, label
        assert f"--row {run_dir.name} " in cmd


@pytest.mark.parametrize("run_dir", sorted(p.parent for p in (ROOT / "records").glob("*/*/config.toml")
                                            if p.parent.parent.name not in pub.CONFIG_RUNS),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_published_command_rebuilds_the_recorded_config(run_dir):
    """The command next to a record, applied to the row's config, gives the record's config exactly."""
    tables = pub.record_tables(ROOT / "records")
    table = next(t for t, v in tables.items() if run_dir.parent.name in {pub._dir_name(t, a) for a in v})
    acct = run_dir.parent.name.removeprefix(table).removeprefix("-") or None
    recorded = load_config(run_dir / "config.toml")
    args = shlex.split(pub.command(table, run_dir.name, acct, recorded))
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    if "--accountant" in args:
        sets.append(f'privacy.accountant="{args[args.index("--accountant") + 1]}"')
    rebuilt = load_config(table_rows(table)[1][args[args.index("--row") + 1]], sets)
    assert rebuilt.model_dump(exclude={"name"}) == recorded.model_dump(exclude={"name"})


def test_a_number_edited_by_hand_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "records", tmp_path / "records")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "docs" / "RESULTS.md", tmp_path / "docs" / "RESULTS.md")
    for doc in pub.CONFIG_RUNS.values():
        shutil.copy(ROOT / doc, tmp_path / doc)
    shutil.copytree(ROOT / "docs" / "probes", tmp_path / "docs" / "probes")
    console = Console(record=True)
    assert pub.publish(tmp_path, console, check=True) == []
    text = (tmp_path / "docs" / "RESULTS.md").read_text()
    edited = text.replace("| 0.8505 (200) |", "| 0.8605 (200) |")
    assert edited != text
    (tmp_path / "docs" / "RESULTS.md").write_text(edited)
    assert pub.publish(tmp_path, console, check=True) == [tmp_path / "docs" / "RESULTS.md"]
    assert (tmp_path / "docs" / "RESULTS.md").read_text() == edited  # --check writes nothing


def _tiny(rounds):
    return load_config(data={
        "name": "tiny-rnd", "seed": 1,
        "data": {"dataset": "digits", "n_clients": 20},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
        "train": {"steps": 2, "batch_size": 8, "lr": 0.2},
        "federation": {"rounds": rounds, "clients_per_round": 5},
        "scheme": {"name": "fl-rnd", "options": {"ratio": 0.5}},
    })


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    records = tmp_path_factory.mktemp("records")
    simulate(Run(_tiny(3), records / "table-4.2" / "fl-rnd_r0.1", log=lambda s: None))
    partial = records / "table-4.2" / "fl-cs_r0.1"
    simulate(Run(_tiny(4), partial, log=lambda s: None))
    (partial / "summary.json").unlink()
    lines = (partial / "metrics.jsonl").read_text().splitlines()
    (partial / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    return records


def test_a_row_cut_short_is_labelled_and_gets_no_delta(tiny_records):
    """Full length is the table row's (200 rounds): a run stopped early, or one run shorter, is cut short."""
    block = pub.table_block(tiny_records, "table-4.2", [None], "../records", None)
    cut = next(ln for ln in block.splitlines() if ln.startswith("| [fl-cs_r0.1]"))
    short = next(ln for ln in block.splitlines() if ln.startswith("| [fl-rnd_r0.1]"))
    assert "| 2/200, cut short |" in cut and "| — (cut short) |" in cut
    assert "| 3/200, cut short |" in short and "| — (cut short) |" in short
    assert "No record yet: `fl-rnd_r0.05`" in block
    real = pub.table_block(ROOT / "records", "table-4.4", [None], "../records", None)
    full = next(ln for ln in real.splitlines() if ln.startswith("| [fl-top_r0.1]"))
    assert "| 200/200 |" in full and re.search(r"\| [+-]0\.\d{3} \|", full)
    head = pub.headline_block(tiny_records)
    assert "(2/200, cut short)" in next(ln for ln in head.splitlines() if ln.startswith("| FL-CS r = 0.1,"))
    assert next(ln for ln in head.splitlines() if ln.startswith("| FL-SIGN, setting A")).count("no record yet") == 1


def _probe_tree(tmp_path, records):
    root = tmp_path / "root"
    shutil.copytree(records, root / "records")
    cfg = _tiny(2).model_copy(update={"train": _tiny(2).train.model_copy(update={"lr": 0.3})})
    simulate(Run(cfg, root / "docs" / "probes" / "lr0.3", log=lambda s: None))
    (root / pub.PROBES).write_text('["lr0.3"]\nrecord = "table-4.2/fl-rnd_r0.1"\n')
    return root


def test_the_probes_block_reads_each_probe_against_its_record(tiny_records, tmp_path):
    """What the probe changed comes from the two configs, and every number from the two metrics files."""
    root = _probe_tree(tmp_path, tiny_records)
    line = pub.probes_block(root, "probes", "../records").splitlines()[2]
    probe = [json.loads(x) for x in (root / "docs/probes/lr0.3/metrics.jsonl").read_text().splitlines()]
    rec = [json.loads(x) for x in (root / "records/table-4.2/fl-rnd_r0.1/metrics.jsonl").read_text().splitlines()]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "[lr0.3](probes/lr0.3)" and cells[1] == "[table-4.2/fl-rnd_r0.1](../records/table-4.2/fl-rnd_r0.1)"
    assert cells[2] == "`train.lr=0.3` (record: 0.2)"
    assert cells[3] == "2 of 2 (record: 3)"
    assert cells[4] == f"{probe[1]['accuracy']:.4f} (2)" and cells[5] == f"{rec[1]['accuracy']:.4f}"
    best = max(rec, key=lambda m: m["accuracy"])
    assert cells[-1] == f"{best['accuracy']:.4f} ({best['round']}), 3"


def test_every_probe_folder_needs_one_entry_naming_its_record(tiny_records, tmp_path):
    root = _probe_tree(tmp_path, tiny_records)
    (root / "docs/probes/other").mkdir()
    with pytest.raises(ConfigError, match=r"folders without an entry \['other'\]"):
        pub.probes_block(root, "probes", "../records")
    (root / "docs/probes/other").rmdir()
    (root / pub.PROBES).write_text('["lr0.3"]\nrecord = "table-4.2/fl-rnd_r0.1"\nnote = 1\n')
    with pytest.raises(ConfigError, match="exactly one key"):
        pub.probes_block(root, "probes", "../records")
    (root / pub.PROBES).write_text('["lr0.3"]\nrecord = "table-4.2/nope"\n')
    with pytest.raises(ConfigError, match="has no config.toml and metrics.jsonl"):
        pub.probes_block(root, "probes", "../records")


@pytest.mark.parametrize("table", ["table-5.1", "table-4.2"])
def test_dp_rows_without_a_tighter_accountant_record_are_listed(table):
    """Every client-level DP row of tables 5.1/5.3/5.5 is also run with σ re-calibrated (PLD, or RDP for
    FL-SIGN-DP); the table's block lists those that have no full-length such record yet."""
    records = ROOT / "records"
    block = pub.table_block(records, table, pub.record_tables(records)[table], "../records", None)
    line = [ln for ln in block.splitlines() if ln.startswith("No full-length record with σ re-calibrated")]
    twins = set()
    for acct in ("pld", "rdp"):
        for d in (records / f"{table}-{acct}").glob("*"):
            if (d / "summary.json").is_file() and len((d / "metrics.jsonl").read_text().splitlines()) == \
                    load_config(d / "config.toml").federation.rounds:
                twins.add(d.name)
    rows = table_rows(table)[1]
    private = {r for r in rows if "-dp" in load_config(rows[r]).scheme.name}
    want = private - twins if table in pub.TWINNED else set()
    assert set(re.findall(r"`([a-z0-9_.-]+)`", line[0].split("):", 1)[1])) == want if want else line == []


def test_figures_are_byte_identical_when_regenerated(tiny_records, tmp_path):
    a = pub.table_figure(tiny_records, "table-4.2", [None], tmp_path / "a.png")
    b = pub.table_figure(tiny_records, "table-4.2", [None], tmp_path / "b.png")
    assert a.read_bytes() == b.read_bytes()


def test_missing_or_stale_markers_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="no generated block 'headline'"):
        pub.splice("no markers here", "headline", "x", "README.md")
    assert pub.splice("a\n<!-- BEGIN generated: t -->\nold\n<!-- END generated -->\nb", "t", "new", "f") == \
        "a\n<!-- BEGIN generated: t -->\nnew\n<!-- END generated -->\nb"
    (tmp_path / "docs").mkdir()
    (tmp_path / "records").mkdir()
    (tmp_path / "README.md").write_text(f"{pub.BEGIN.format('headline')}\n{pub.END}\n")
    (tmp_path / "docs" / "RESULTS.md").write_text(f"{pub.BEGIN.format('table-9.9')}\n{pub.END}\n")
    with pytest.raises(ConfigError, match="table-9.9 have no records"):
        pub.generated(tmp_path)


def test_cli_check_exits_1_on_a_stale_block_and_2_with_one_line_on_a_missing_marker(tmp_path):
    from typer.testing import CliRunner

    from dpfl.cli.main import app

    (tmp_path / "docs").mkdir()
    (tmp_path / "records").symlink_to(ROOT / "records")
    shutil.copy(ROOT / "docs" / "RESULTS.md", tmp_path / "docs" / "RESULTS.md")
    (tmp_path / "docs" / "probes").symlink_to(ROOT / "docs" / "probes")
    readme = (ROOT / "README.md").read_text()
    (tmp_path / "README.md").write_text(readme.replace("| 0.8505 at round 200,", "| 0.8605 at round 200,"))
    if (ROOT / "records" / "record-dp").is_dir():
        res = CliRunner().invoke(app, ["publish", "--check", "--root", str(tmp_path)])
        assert res.exit_code == 2 and "record-dp.md is missing" in " ".join(res.output.split())
        shutil.copy(ROOT / "docs" / "record-dp.md", tmp_path / "docs" / "record-dp.md")
    res = CliRunner().invoke(app, ["publish", "--check", "--root", str(tmp_path)])
    assert res.exit_code == 1 and "generated blocks differ from records/" in " ".join(res.output.split())
    (tmp_path / "README.md").write_text("no markers\n")
    res = CliRunner().invoke(app, ["publish", "--root", str(tmp_path), "--no-figures"])
    assert res.exit_code == 2 and res.output.startswith("error:") and "Traceback" not in res.output
    assert (tmp_path / "README.md").read_text() == "no markers\n"  # nothing written on error


def _record_dp_run(records: Path, stem: str, config_text: str, rounds: int) -> Path:
    d = records / "record-dp" / stem
    d.mkdir(parents=True)
    (d / "config.toml").write_text(config_text)
    lines = [{"round": r, "record_epsilon_max": 0.1 * r, "record_epsilon_median": 0.05 * r,
              "record_clients_spent": 100 * r, **({"accuracy": 0.1 + 0.01 * r} if r % 2 == 0 else {})}
             for r in range(1, rounds + 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return d


def test_record_dp_block_is_generated_from_the_runs_of_committed_configs(tmp_path):
    src = ROOT / "dpfl" / "experiments" / "configs" / "record-dp" / "setting-d-eps8.toml"
    d = _record_dp_run(tmp_path, "setting-d-eps8", src.read_text(), 6)
    block = pub.record_dp_block(tmp_path, "../records")
    row = block.splitlines()[2]
    # unfinished: no summary yet, so σ is only in the checkpoint; the last metrics line gives ε
    assert ("| `setting-d-eps8.toml` | 8 (1e-05) | (in the checkpoint) | — | 0.6000 / 0.3000 | 600 | "
            "0.1600 (6) | 0.1600 (6) | 6 of 200 (cut short) | — |") in row
    (d / "summary.json").write_text(json.dumps({
        "best": {"round": 4, "accuracy": 0.14}, "machine": {"cpu": "X", "threads": 1},
        "record_level": {"noise_multiplier": 4.5, "clip": 1.0, "delta": 1e-5}}))
    # setting D: η = 0.215, B = 10, T = 5, |K| = 100: 0.215 · 4.5 / 10 · √5 / 10 = 0.02163
    assert ("| 4.5000 | 0.0216 | 0.6000 / 0.3000 | 600 | 0.1400 (4) | 0.1600 (6) | 6 of 200 (cut short) | "
            "X, 1 thread(s) |") \
        in pub.record_dp_block(tmp_path, "../records")
    assert "record-dp" not in pub.record_tables(tmp_path)  # not a thesis table


def test_a_record_dp_run_must_be_a_committed_config_unchanged(tmp_path):
    src = ROOT / "dpfl" / "experiments" / "configs" / "record-dp" / "setting-d-eps8.toml"
    _record_dp_run(tmp_path, "setting-d-eps8", src.read_text().replace("rounds = 200", "rounds = 20"), 2)
    with pytest.raises(ConfigError, match="differs from setting-d-eps8.toml .federation.rounds=20"):
        pub.record_dp_block(tmp_path, "../records")
    _record_dp_run(tmp_path, "mine", src.read_text(), 2)
    with pytest.raises(ConfigError, match="no committed config mine.toml"):
        pub.config_runs(tmp_path, "record-dp")


def test_the_scoreboard_pld_mean_counts_each_pair_of_runs_once():
    """Recomputed from the record folders on disk (each row's pld run, else its rdp run, and its moments twin
    once), not through the tables, where a same_run row shows the same pair twice."""
    gains = []
    twins = {}
    for acct in ("rdp", "pld"):  # pld last: it wins where a row has both
        twins.update({(p.parent.parent.name.removesuffix(f"-{acct}"), p.parent.name): p
                      for p in (ROOT / "records").glob(f"*-{acct}/*/summary.json")})
    for (table, row), twin in sorted(twins.items()):
        moments = ROOT / "records" / table / row / "summary.json"
        if not moments.is_file():
            continue
        a, b = (json.loads(p.read_text()) for p in (twin, moments))
        full = load_config(moments.parent / "config.toml").federation.rounds
        if all(s["rounds_run"] == full and not s.get("stopped") for s in (a, b)):
            gains.append(a["best"]["accuracy"] - b["best"]["accuracy"])
    assert any("-rdp" in str(p) for p in twins.values())
    line = next(ln for ln in pub.scoreboard_block(ROOT / "records").splitlines()
                if ln.startswith("PLD/RDP σ − moments σ over all"))
    assert f"all {len(gains)} distinct pairs" in line and f"mean {sum(gains) / len(gains):+.4f}." in line


def test_the_machine_column_says_which_rounds_ran_elsewhere():
    """A row cut on a GPU host and resumed on a CPU names both, with the rounds each ran."""
    from dpfl.experiments.publish import _timing

    code = [{"dpfl": "0.1.0", "commit": None, "modified": None, "ran_on": "cuda: H100 on Xeon (AVX512)",
             "from_round": 1},
            {"dpfl": "0.1.0", "commit": "a" * 40, "modified": False, "ran_on": "cpu: EPYC (AVX2)", "from_round": 78}]
    e = {"metrics": [{"round_seconds": 2.0}], "summary": {"machine": {"cpu": "EPYC", "threads": 1}, "code": code}}
    assert _timing(e) == "2.0 s, EPYC, 1 thread; rounds 1–77 on cuda: H100 on Xeon (AVX512)"
    e["summary"]["code"] = [code[1]]
    assert _timing(e) == "2.0 s, EPYC, 1 thread"


# ---- the audit of issue 42: one run in two tables, diverged models, Δ at the ±0.03 line, the cost formula's width

def _row(block: str, row: str, nth: int = 0) -> list[str]:
    lines = [ln for ln in block.splitlines() if ln.startswith(f"| [{row}](")]
    return [c.strip() for c in lines[nth].strip().strip("|").split("|")]


def _block(table: str) -> str:
    records = ROOT / "records"
    return pub.table_block(records, table, pub.record_tables(records)[table], "../records", None)


def test_one_run_read_by_two_tables_is_said_on_both_rows_and_under_the_scoreboard():
    assert "(the same run as table-5.1 fl-std-dp_eps1)" in _row(_block("table-5.3"), "fl-std-dp_r1.0")[0]
    assert "(also table-5.3 fl-std-dp_r1.0: the same run)" in _row(_block("table-5.1"), "fl-std-dp_eps1")[0]
    assert "(pld σ, also table-5.3-pld fl-std-dp_r1.0: the same run)" in _row(_block("table-5.1"), "fl-std-dp_eps1", 1)[0]
    assert "(the same run as table-4.1 fl-sign)" in _row(_block("table-6.1-fmnist"), "fl-sign-00")[0]
    assert "(also table-6.1-fmnist fl-sign-00: the same run)" in _row(_block("table-4.1"), "fl-sign")[0]
    # the same config in two tables, run twice: said so, as two runs
    assert "(the same config as table-6.1-fmnist fl-std-00, run separately)" in _row(_block("table-4.1"), "fl-std")[0]
    board = pub.scoreboard_block(ROOT / "records")
    one_run = next(ln for ln in board.splitlines() if ln.startswith("One run is two tables' row"))
    for pair in ("table-5.3 fl-std-dp_r1.0 = table-5.1 fl-std-dp_eps1", "table-6.1-fmnist fl-sign-00 = table-4.1 fl-sign",
                 "table-5.3-pld fl-std-dp_r1.0 = table-5.1-pld fl-std-dp_eps1"):
        assert pair in one_run
    assert "table-4.1 fl-std / table-6.1-fmnist fl-std-00 (0.8819 / 0.8819)" in board


@pytest.mark.parametrize("pair", [("table-5.1", "fl-std-dp_eps1", "table-5.3", "fl-std-dp_r1.0"),
                                  ("table-4.1", "fl-sign", "table-6.1-fmnist", "fl-sign-00")])
def test_each_pair_said_to_be_one_run_is_one_config_and_one_record(pair):
    """The pairs the tables call one run: the configs equal but for the name, and one record serves both."""
    from dpfl.experiments.reproduce import row_dir

    t1, r1, t2, r2 = pair
    a, b = (load_config(table_rows(t)[1][r]).model_dump(mode="json", exclude={"name"}) for t, r in ((t1, r1), (t2, r2)))
    assert a == b
    assert row_dir(t2, r2, ROOT / "records" / t2) == ROOT / "records" / t1 / r1
    assert (t2, r2, "read by") in pub.shared_runs(ROOT / "records")[(t1, r1)]


def test_a_shared_run_is_found_from_the_records_not_from_a_list(tiny_records, tmp_path):
    """Two records with the same config and the same metrics (wall times aside) are one run; with the same
    config but other metrics, the same experiment run twice."""
    records = tmp_path / "records"
    shutil.copytree(tiny_records, records)
    twin = records / "table-4.2" / "fl-rnd_r0.2"
    shutil.copytree(records / "table-4.2" / "fl-rnd_r0.1", twin)
    lines = [json.loads(x) for x in (twin / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        m["round_seconds"] = m.get("round_seconds", 0) + 1.0  # another machine's wall times: still the same run
    (twin / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    block = pub.table_block(records, "table-4.2", [None], "../records", None)
    assert "(the same run as table-4.2 fl-rnd_r0.1: the same config and metrics)" in _row(block, "fl-rnd_r0.2")[0]
    assert "(the same run as table-4.2 fl-rnd_r0.2: the same config and metrics)" in _row(block, "fl-rnd_r0.1")[0]
    lines[-1]["accuracy"] += 0.0001
    (twin / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    block = pub.table_block(records, "table-4.2", [None], "../records", None)
    assert "(the same config as table-4.2 fl-rnd_r0.1, run separately)" in _row(block, "fl-rnd_r0.2")[0]
    assert "the same" not in _row(block, "fl-cs_r0.1")[0]  # another config


def test_a_diverged_row_says_so_instead_of_an_accuracy_and_counts_in_no_accuracy_column():
    """6.3-fmnist's FL-STD rows under gradient ascent have a NaN loss in every round: their 0.1000 is no accuracy."""
    block = _block("table-6.3-fmnist")
    for row in ("fl-std-01", "fl-std-10", "fl-std-20", "fl-std-40", "fl-std-60"):
        cells = _row(block, row)
        assert cells[2] == "diverged (loss NaN from round 1)" and cells[4] == "— (diverged)"
    assert _row(block, "fl-sign-10")[2] == "0.8650 (89)"  # a finite loss: its accuracy
    assert "diverged: the evaluation loss is NaN at the best round" in block.splitlines()[0]
    board = pub.scoreboard_block(ROOT / "records").splitlines()
    head = [c.strip() for c in board[0].strip("|").split("|")]
    row = dict(zip(head, (c.strip() for c in next(ln for ln in board if ln.startswith("| table-6.3-fmnist |"))
                         .strip("|").split("|"))))
    assert row["diverged (loss NaN: no accuracy, no Δ)"] == "5"
    assert row["no Δ (no thesis number or other dataset)"] == "4"
    assert row["literal: within ±0.03"] == row["literal: above thesis"] == row["literal: more than 0.03 below"] == "0"
    assert row["best reading: within ±0.03"] == row["best reading: more than 0.03 below"] == "0"
    note = next(ln for ln in board if ln.startswith("Diverged"))
    assert "table-6.3-fmnist fl-std-10 (loss NaN from round 1)" in note


def test_a_delta_within_one_test_image_of_the_line_is_marked_and_given_4_decimals():
    """5.3 fl-freq-dp_r0.1: 0.7301 against 0.76 is within ±0.03 by one test image of 10,000."""
    block = _block("table-5.3")
    assert _row(block, "fl-freq-dp_r0.1")[4] == "-0.0299 ‡"
    assert _row(block, "fl-freq-dp_r0.1", 1)[4] == "-0.015"  # its pld σ twin: far from the line
    assert "‡: |Δ| is within one test image" in block.splitlines()[0]
    assert "‡" not in _block("table-5.5")
    board = pub.scoreboard_block(ROOT / "records")
    assert "table-5.3 fl-freq-dp_r0.1 (Δ -0.0299: within by one of 10,000 test images)" in board


def test_the_test_images_are_read_from_the_accuracies():
    from dpfl.experiments.report import load_run

    assert pub._test_images(load_run(ROOT / "records/table-5.3/fl-freq-dp_r0.1")[1]) == 10_000
    assert pub._test_images(load_run(ROOT / "records/table-6.12/fl-sign-10")[1]) == 9_000  # out-backdoor: 9 classes
    metrics = [{"accuracy": 0.5}, {"accuracy": 0.7301}]
    e = {"metric": "accuracy", "metrics": metrics}
    assert [bool(pub._at_the_line({**e, "delta": d})) for d in (-0.0299, -0.0301, 0.0300, -0.0298, -0.0302)] == \
        [True, True, True, False, False]
    assert pub._test_images([{"accuracy": 0.123456789123}]) is None


def test_dp_rows_give_the_cost_formula_at_the_masked_width_and_at_32_bits():
    """The record's formula counts the b-bit masked integers; the thesis counts float32 (FL-SIGN-DP: b bits)."""
    from dpfl.experiments.report import load_run

    block = _block("table-5.3")
    head = [c.strip() for c in block.splitlines()[2].strip("|").split("|")]
    col = head.index("cost formula up / client: at the masked width b; at 32 bits")
    summary, metrics = load_run(ROOT / "records/table-5.3/fl-freq-dp_r0.05")
    best = metrics[summary["best"]["round"] - 1]
    b = best["step_secagg_bits"]
    at_b = best["formula_up_bytes_per_client"] * 8 / 1e6
    assert b == 20 and _row(block, "fl-freq-dp_r0.05")[col] == \
        f"{at_b:,.2f} Mbit at b = 20 bits; {at_b * 32 / 20:,.2f} Mbit at 32 bits"
    six10 = _block("table-6.10")
    head = [c.strip() for c in six10.splitlines()[2].strip("|").split("|")]
    col = head.index("cost formula up / client: at the masked width b; at 32 bits")
    assert _row(six10, "fl-sign-10")[col] == "—"  # no masked integers
    assert _row(six10, "fl-sign-dp-eps1-10")[col].endswith(" at 32 bits") and " at b = 22 bits; " in \
        _row(six10, "fl-sign-dp-eps1-10")[col]
    assert "cost formula" not in _block("table-4.4")  # no DP row


def test_record_tables_sort_thesis_tables_by_number_then_named_ones(tmp_path):
    for name in ("table-6.10", "correlated-noise", "table-4.2", "table-6.3-fmnist", "table-5.1-pld"):
        (tmp_path / name / "row").mkdir(parents=True)
        (tmp_path / name / "row" / "metrics.jsonl").write_text("{}\n")
    assert list(pub.record_tables(tmp_path)) == ["table-4.2", "table-5.1", "table-6.3-fmnist", "table-6.10",
                                                 "correlated-noise"]


@pytest.mark.parametrize("options, fed, privacy", [
    ({"epsilon": 2.0, "clip": 2.15}, {}, {"accountant": "rdp"}),  # as drawn
    ({"epsilon": 2.0, "clip": 2.15}, {}, {"sampling_assumption": "poisson"}),
    ({"epsilon": 2.0, "clip": 2.15, "noise": "central", "correlated": "tree"},
     {"participation": "cyclic", "groups": 5}, {}),
    ({"sigma": 1.0, "clip": 2.15, "noise": "local"}, {}, {}),
])
def test_a_cut_short_rows_sampling_is_the_runs(options, fed, privacy):
    """Without a summary, the table's sampling cell follows the rule the run's ε uses."""
    from dpfl.config import load_config
    from dpfl.run.state import Run

    cfg = load_config(data={"name": "x", "data": {"dataset": "digits", "n_clients": 20, "partition": "shards"},
                            "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 8, "num_classes": 10}},
                            "scheme": {"name": "fl-std-dp", "options": options},
                            "federation": {"rounds": 10, "clients_per_round": 4, **fed}, "privacy": privacy})
    run = Run(cfg, None, log=lambda s: None)
    assert pub.epsilon_sampling({"summary": {}, "cfg": cfg}) == run.epsilon_sampling()
