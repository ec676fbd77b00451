"""`dpfl reproduce --report-only` and the committed run records under `records/`."""

import json
from pathlib import Path

import pytest
from rich.console import Console

from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.experiments.report import best_round, load_run
from dpfl.experiments.reproduce import reproduce_table, table_rows
from dpfl.privacy import ACCOUNTANTS
from dpfl.run.state import Run

RECORDS = Path(__file__).resolve().parents[2] / "records"


def _tiny(rounds):
    return load_config(data={
        "name": "tiny-rnd", "seed": 1,
        "data": {"dataset": "digits", "n_clients": 20},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
        "train": {"steps": 2, "batch_size": 8, "lr": 0.2},
        "federation": {"rounds": rounds, "clients_per_round": 5},
        "scheme": {"name": "fl-rnd", "options": {"ratio": 0.5}},
    })


def _never(*a):
    raise AssertionError("report-only must not run anything")


def test_report_only_compares_existing_runs_and_runs_nothing(tmp_path):
    done = tmp_path / "table-4.2" / "fl-rnd_r0.1"
    simulate(Run(_tiny(3), done, log=lambda s: None))
    partial = tmp_path / "table-4.2" / "fl-cs_r0.1"  # a run cut short: metrics but no summary
    sim = Run(_tiny(4), partial, log=lambda s: None)
    simulate(sim)
    (partial / "summary.json").unlink()
    lines = (partial / "metrics.jsonl").read_text().splitlines()
    (partial / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")

    console = Console(record=True, width=250)
    out = reproduce_table("table-4.2", rows=["fl-rnd_r0.1", "fl-cs_r0.1", "fl-cs_r0.2"], rounds=None,
                          out=tmp_path, overrides=[], accountant=None, console=console, execute=_never,
                          report_only=True)
    by_row = {r["row"]: r for r in out}
    assert set(by_row) == {"fl-rnd_r0.1", "fl-cs_r0.1"}
    m = [json.loads(x) for x in (done / "metrics.jsonl").read_text().splitlines()]
    assert by_row["fl-rnd_r0.1"]["measured"] == max(r["accuracy"] for r in m)
    assert by_row["fl-rnd_r0.1"]["thesis"] == table_rows("table-4.2")[0]["fl-rnd_r0.1"]["accuracy"]
    assert by_row["fl-cs_r0.1"]["rounds_run"] == 2 and by_row["fl-cs_r0.1"]["rounds_planned"] == 4
    # full length = the table row's 200 rounds: neither tiny run is complete, so neither gets a Δ
    assert by_row["fl-cs_r0.1"]["rounds_full"] == 200 and not by_row["fl-rnd_r0.1"]["complete"]
    assert by_row["fl-rnd_r0.1"]["delta"] is None
    text = console.export_text()
    assert "2/200" in text and "3/200" in text and "not run yet: fl-cs_r0.2" in text
    assert not (tmp_path / "table-4.2" / "results.json").exists()  # reporting writes nothing


def test_report_only_without_runs_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no run of table-4.4"):
        reproduce_table("table-4.4", rows=[], rounds=None, out=tmp_path, overrides=[], accountant=None,
                        console=Console(), execute=_never, report_only=True)



def test_an_unknown_accountant_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="--accountant must be one of moments, rdp, pld, got 'bogus'"):
        reproduce_table("table-4.2", rows=["fl-rnd_r0.05"], rounds=None, out=tmp_path, overrides=[],
                        accountant="bogus", console=Console(), execute=_never)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("table,rows,words", [
    ("table-4.2", [], "table-4.2 has none"),  # no DP row at all
    ("table-6.10", ["fl-sign-10"], "fl-sign-10 of table-6.10 account no ε"),  # a named non-DP row
])
def test_an_accountant_on_rows_without_dp_is_refused_before_anything_is_written(tmp_path, table, rows, words):
    with pytest.raises(ConfigError, match=words):
        reproduce_table(table, rows=rows, rounds=None, out=tmp_path, overrides=[], accountant="pld",
                        console=Console(), execute=_never)
    assert list(tmp_path.iterdir()) == []


def test_an_accountant_on_a_mixed_table_runs_its_dp_rows_only(tmp_path):
    with pytest.raises(ConfigError, match="no run of table-6.10 under .*table-6.10-pld; .*--accountant pld"):
        reproduce_table("table-6.10", rows=[], rounds=None, out=tmp_path, overrides=[], accountant="pld",
                        console=Console(), execute=_never, report_only=True)
    from dpfl.experiments.reproduce import private_rows, table_rows

    all_rows = table_rows("table-6.10")[1]
    ran = private_rows("table-6.10", all_rows, list(all_rows), explicit=False)
    assert ran == [r for r in all_rows if r.startswith("fl-sign-dp-")] and len(ran) == 9


def _record_dirs():
    from dpfl.experiments.publish import CONFIG_RUNS

    return sorted(p.parent for p in RECORDS.glob("*/*/metrics.jsonl") if p.parent.parent.name not in CONFIG_RUNS)


@pytest.mark.parametrize("run_dir", _record_dirs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_record_is_consistent(run_dir):
    """A committed record is a real run's output: its table row exists, its config loads, the rounds
    are consecutive, and the summary's best round is the best of its metrics (nothing edited by hand)."""
    table, row = run_dir.parent.name, run_dir.name
    suffix = next((a for a in ACCOUNTANTS if table.endswith(f"-{a}")), None)  # --accountant runs
    table = table.removesuffix(f"-{suffix}") if suffix else table
    assert row in table_rows(table)[1]
    cfg = load_config(run_dir / "config.toml")
    if suffix:
        assert cfg.privacy.accountant == suffix
    summary, metrics = load_run(run_dir)
    assert [m["round"] for m in metrics] == list(range(1, len(metrics) + 1))
    assert len(metrics) <= cfg.federation.rounds
    best, recomputed = summary["best"], best_round(metrics)
    key = best["metric"]
    assert (best["round"], best[key]) == (recomputed["round"], recomputed[key])
    assert summary.get("rounds_run", len(metrics)) == len(metrics)


def _same_run_pairs():
    from dpfl.experiments.reproduce import list_tables

    return [(t, r, e["same_run"]) for t in list_tables() for r, e in table_rows(t)[0].items()
            if isinstance(e, dict) and "same_run" in e]


@pytest.mark.parametrize("table,row,target", _same_run_pairs(), ids=lambda v: str(v))
def test_a_declared_same_run_is_the_same_config(table, row, target):
    from dpfl.experiments.reproduce import same_run

    assert "/".join(same_run(table, row)) == target  # checks the configs are equal but for the name


def test_the_committed_tables_declare_their_shared_runs():
    assert {(t, r) for t, r, _ in _same_run_pairs()} >= {("table-5.3", "fl-std-dp_r1.0"),
                                                         ("table-6.1-fmnist", "fl-sign-00")}


def _tables(root, b_changes=None, target="table-a/x"):
    """Two one-row tables under `root`: table-b/y declares itself the same run as `target`."""
    from dpfl.config import dump_config

    for t, r, changes, thesis in (("table-a", "x", {}, {"x": {"accuracy": 0.5}}),
                                  ("table-b", "y", b_changes or {}, {"y": {"accuracy": 0.5, "same_run": target}})):
        (root / t).mkdir(parents=True)
        (root / t / f"{r}.toml").write_text(dump_config(_tiny(2).model_copy(update={"name": r, **changes})))
        (root / t / "thesis.json").write_text(json.dumps(thesis))


def test_a_same_run_row_runs_into_and_reads_the_row_it_names(tmp_path, monkeypatch):
    import dpfl.experiments.reproduce as rp

    _tables(tmp_path / "configs")
    monkeypatch.setattr(rp, "configs_root", lambda: tmp_path / "configs")
    out = tmp_path / "out"
    console = Console(record=True, width=200)
    rp.reproduce_table("table-b", rows=[], rounds=None, out=out, overrides=[], accountant=None, console=console,
                       execute=lambda sim, row: simulate(sim))
    assert (out / "table-a" / "x" / "summary.json").is_file() and not (out / "table-b" / "y").exists()
    assert "the same run as table-a/x" in console.export_text()
    a = rp.reproduce_table("table-a", rows=[], rounds=None, out=out, overrides=[], accountant=None,
                           console=Console(), execute=_never, report_only=True)
    b = rp.reproduce_table("table-b", rows=[], rounds=None, out=out, overrides=[], accountant=None,
                           console=Console(), execute=_never, report_only=True)
    assert b[0]["row"] == "y" and b[0]["measured"] == a[0]["measured"] and b[0]["dir"] == a[0]["dir"]
    # running table-b again finds the row done; an --accountant variant goes to table-a-<accountant>
    assert rp.row_dir("table-b", "y", out / "table-b-pld") == out / "table-a-pld" / "x"
    rp.reproduce_table("table-b", rows=[], rounds=None, out=out, overrides=[], accountant=None,
                       console=Console(), execute=_never)


@pytest.mark.parametrize("changes,target,words", [
    ({"seed": 2}, "table-a/x", "the configs differ"),
    ({}, "table-c/x", "names no table"),
    ({}, "table-a/z", "names no other row of table-a"),
    ({}, "table-b/y", "names no other row of table-b"),
])
def test_a_wrong_same_run_is_refused(tmp_path, monkeypatch, changes, target, words):
    import dpfl.experiments.reproduce as rp

    _tables(tmp_path / "configs", changes, target)
    monkeypatch.setattr(rp, "configs_root", lambda: tmp_path / "configs")
    with pytest.raises(ConfigError, match=f"table-b/y: same_run '{target}'.*{words}"):
        rp.same_run("table-b", "y")


def test_a_best_round_with_a_nan_loss_is_diverged_and_gets_no_delta():
    """A model whose evaluation loss is NaN outputs a constant: its 0.1 is no accuracy to set against the thesis."""
    from dpfl.experiments.reproduce import compare_rows

    thesis = {"x": {"accuracy": 0.12}}

    def result(loss):
        best = {"round": 1, "accuracy": 0.1, "loss": loss, "metric": "accuracy"}
        return {"row": "x", "dir": "d", "summary": {"best": best, "rounds_run": 2, "rounds_planned": 2,
                                                     "rounds_full": 2}}

    nan, finite = compare_rows(thesis, [result(float("nan")), result(2.3)])
    assert nan["diverged"] and nan["delta"] is None
    assert not finite["diverged"] and finite["delta"] == pytest.approx(-0.02)
    assert compare_rows(thesis, [result(float("inf"))])[0]["diverged"]
