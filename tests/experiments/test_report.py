"""`dpfl report`: labels that tell runs apart, readable units, figures, tables that fit the terminal."""

import json
from pathlib import Path

from rich.console import Console

from dpfl.compression.costs import human_bytes
from dpfl.config import dump_config, load_config
from dpfl.experiments.report import plot_curves, pyplot, report_runs, run_labels
from dpfl.experiments.reproduce import configs_root, reproduce_table

ROOT = Path(__file__).resolve().parents[2]
DP = ["scheme.name=fl-std-dp", "scheme.options.clip=1.0", "data.n_clients=20", "federation.rounds=4"]


def _run(path: Path, sets: list[str], eps_per_round: float | None = 0.5) -> Path:
    """A run directory as the simulator writes it (config.toml, metrics.jsonl), without training."""
    path.mkdir(parents=True)
    cfg = load_config(configs_root() / "quickstart.toml", sets)
    (path / "config.toml").write_text(dump_config(cfg))
    lines = []
    for r in range(1, 5):
        m = {"round": r, "accuracy": 0.1 + 0.05 * r - 0.08 * (r == 4), "cum_up_bytes_per_client": 1.5e6 * r,
             "formula_up_bytes_per_client": 1.5e6 * r, "cum_down_bytes_per_client": 2e6 * r}
        if eps_per_round is not None:
            m["epsilon"] = eps_per_round * r
        lines.append(json.dumps(m))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def _runs(*dirs):
    from dpfl.experiments.report import load_run

    return [(d, *load_run(d)) for d in dirs]


def test_runs_of_one_config_are_labelled_by_what_they_override(tmp_path):
    a = _run(tmp_path / "a", DP + ["scheme.options.epsilon=4"])
    b = _run(tmp_path / "b", DP + ["scheme.options.epsilon=8"])
    labels, shared = run_labels(_runs(a, b))
    assert labels == ["quickstart (scheme.options.epsilon=4)", "quickstart (scheme.options.epsilon=8)"]
    assert 'scheme.name="fl-std-dp"' in shared["quickstart"] and "federation.rounds=4" in shared["quickstart"]


def test_runs_that_differ_in_nothing_are_labelled_by_directory(tmp_path):
    a = _run(tmp_path / "x" / "run", DP)
    b = _run(tmp_path / "y" / "run", DP)
    c = _run(tmp_path / "z" / "other", DP)
    assert run_labels(_runs(a, b, c))[0] == ["x/run", "y/run", "other"]


def test_dp_runs_get_round_upstream_and_epsilon_figures_with_integer_rounds(tmp_path):
    a = _run(tmp_path / "a", DP + ["scheme.options.epsilon=4"])
    b = _run(tmp_path / "b", DP + ["scheme.options.epsilon=8"], eps_per_round=1.0)
    paths = report_runs([a, b], tmp_path / "fig", Console(record=True))
    assert [p.name for p in paths] == ["accuracy_vs_round.png", "accuracy_vs_upstream.png", "accuracy_vs_epsilon.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    plain = _run(tmp_path / "plain", ["federation.rounds=4"], eps_per_round=None)
    assert "accuracy_vs_epsilon.png" not in [p.name for p in report_runs([plain], tmp_path / "f2", Console())]

    plt = pyplot()
    fig, ax = plt.subplots()
    plot_curves(ax, [("a", _runs(a)[0][2])], "round")
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert len(ax.lines) == 2 and ax.lines[1].get_marker() == "*"  # the best round is marked
    assert (ax.lines[1].get_xdata()[0], ax.lines[1].get_ydata()[0]) == (3, 0.1 + 0.05 * 3)
    plt.close(fig)


def test_the_table_fits_a_narrow_terminal_and_wide_keeps_every_column(tmp_path):
    a = _run(tmp_path / "a", DP + ["scheme.options.epsilon=4"])
    narrow = Console(record=True, width=72, force_terminal=True)
    report_runs([a], tmp_path / "f", narrow)
    text = narrow.export_text()
    assert all(len(ln) <= 72 for ln in text.splitlines())
    assert "4.50 MB" in text  # human units, and never folded
    table, note = text.split("not shown for width:")
    assert "formula up" in note and "formula" not in table
    wide = Console(record=True, width=72, force_terminal=True)
    report_runs([a], tmp_path / "f", wide, wide=True)
    assert "formula up" in wide.export_text().split("┡")[0]


def test_reproduce_report_fits_100_columns_and_labels_a_cut_short_row(tmp_path):
    """The committed table-5.1 records, one of them cut to its first 100 rounds."""
    import shutil

    shutil.copytree(ROOT / "records" / "table-5.1", tmp_path / "table-5.1",
                    ignore=shutil.ignore_patterns("*.pt", "*.png", "results.json"))
    cut = tmp_path / "table-5.1" / "fl-sign-dp_eps2"
    lines = (cut / "metrics.jsonl").read_text().splitlines()[:100]
    (cut / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (cut / "summary.json").unlink()
    console = Console(record=True, width=100, force_terminal=True)
    reproduce_table("table-5.1", rows=[], rounds=None, out=tmp_path, overrides=[], accountant=None,
                    console=console, execute=None, report_only=True)
    text = console.export_text()
    assert all(len(ln) <= 100 for ln in text.splitlines())
    row = [ln for ln in text.splitlines() if "100/200" in ln]
    best = max(json.loads(ln)["accuracy"] for ln in lines)  # its best of the first 100 rounds
    assert len(row) == 1 and "cut short" in row[0] and f"{best:.4f}" in row[0]
    assert "14.94 MB" in text  # fl-sign-dp_eps1's upstream at its best round


def test_human_bytes():
    assert [human_bytes(x) for x in (512, 2_217_830, 14_942_651.27, 1_500)] == \
        ["512 B", "2.22 MB", "14.94 MB", "1.50 KB"]


def test_corrupt_run_files_are_one_error_line_not_a_traceback(tmp_path):
    from typer.testing import CliRunner

    from dpfl.cli.main import app

    run = _run(tmp_path / "a", DP)
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"round": 5, "accur')
    from dpfl.experiments.report import load_run

    assert len(load_run(run)[1]) == 4  # a half-written last line is not a round
    (run / "summary.json").write_text("{not json")
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "plots")])
    assert r.exit_code == 2 and "summary.json: not readable JSON" in r.output and "Traceback" not in r.output
    (run / "summary.json").unlink()
    (run / "metrics.jsonl").write_text('garbage\n{"round": 1}\n')
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "plots")])
    assert r.exit_code == 2 and "line 1 is not a JSON metrics record" in r.output


def test_no_rounds_no_empty_figures(tmp_path):
    """A reproduce call whose rows were all skipped (or runs with no rounds yet) writes no figure."""
    from dpfl.experiments.report import write_plots

    console = Console(record=True)
    assert write_plots([(tmp_path, {}, [])], tmp_path / "fig", console, ["empty"]) == []
    assert not list((tmp_path / "fig").glob("*.png")) and "no rounds to plot" in console.export_text()
