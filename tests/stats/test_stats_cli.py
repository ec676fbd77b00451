"""`dpfl stats mean|count|histogram` through typer's CliRunner."""

import re

import pytest
from typer.testing import CliRunner

from dpfl.classic.tables import load_builtin
from dpfl.cli.stats import app

runner = CliRunner()
AGE = ["--column", "age", "--seed", "0"]


def ok(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.output


def spent(out: str) -> float:
    return float(re.search(r"ε spent: (\S+)", out).group(1))


def test_mean_prints_the_dp_estimate_and_the_true_value_only_on_request():
    args = ["mean", *AGE, "--lower", "0", "--upper", "100", "--epsilon", "1"]
    out = ok(args)
    assert "true" not in out and spent(out) == pytest.approx(1.0)
    dp_mean = float(re.search(r"DP mean ([-\d.e+]+)", out).group(1))
    assert abs(dp_mean - load_builtin("diabetes").columns["age"].mean()) < 5  # Laplace scale 100 / 442 / 0.5
    shown = ok([*args, "--show-true"])
    assert "true (not private; clipped): mean 48.5181" in shown
    assert shown.replace(shown.splitlines()[2] + "\n", "") == out  # same seed: the same DP numbers


def test_count_spends_at_most_its_epsilon():
    out = ok(["count", *AGE, "--min", "50", "--epsilon", "0.5", "--delta", "1e-6"])
    assert "true" not in out and spent(out) <= 0.5 and "δ = 1e-06" in out
    noisy = float(re.search(r"DP count (\S+)", out).group(1))
    sigma = float(re.search(r"σ = (\S+)\)", out).group(1))
    true = int((load_builtin("diabetes").columns["age"] >= 50).sum())
    assert abs(noisy - true) < 6 * sigma


def test_histograms_known_and_unknown_domain(tmp_path):
    out = ok(["histogram", *AGE, "--bins", "10,30,50,70,90", "--epsilon", "1"])
    assert "[10, 30)" in out and "[70, 90)" in out and spent(out) == pytest.approx(1.0) and "true" not in out
    out = ok(["histogram", "--column", "sex", "--categories", "1,2,3", "--noise", "discrete_laplace",
              "--nonneg", "--epsilon", "0.5", "--seed", "0", "--show-true"])
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:5]}
    assert set(rows) == {"1", "2", "3"} and rows["3"][1] == "0"  # an empty category is still released
    p = tmp_path / "c.csv"
    p.write_text("city\n" + "paris\n" * 40 + "lyon\n" * 25 + "nice\n")
    out = ok(["histogram", "--column", "city", "--stable", "--epsilon", "1", "--data", str(p), "--seed", "0"])
    released = [line.split()[0] for line in out.splitlines()[2:-1]]
    assert released == ["lyon", "paris"]  # nice (1 record) stays below τ = 1 + ln(1/(2δ)) = 11.8
    assert "τ = 11.82" in out and "ε spent: 1 at δ = 1e-05" in out


@pytest.mark.parametrize("args,needle", [
    (["mean", *AGE, "--lower", "0", "--upper", "100", "--epsilon", "0"], "--epsilon"),
    (["mean", *AGE, "--lower", "0", "--upper", "100", "--epsilon", "inf"], "--epsilon"),
    (["mean", *AGE, "--lower", "9", "--upper", "1", "--epsilon", "1"], "--lower must be below --upper"),
    (["mean", *AGE, "--lower", "0", "--upper", "100", "--epsilon", "1", "--data", "/no/x.csv"], "file not found"),
    (["mean", "--column", "nope", "--lower", "0", "--upper", "1", "--epsilon", "1"], "no column 'nope'"),
    (["count", *AGE, "--epsilon", "1"], "give --min, --max or both"),
    (["count", *AGE, "--min", "1", "--epsilon", "1", "--delta", "0"], "--delta"),
    (["histogram", *AGE, "--epsilon", "1"], "exactly one of --bins"),
    (["histogram", *AGE, "--epsilon", "1", "--bins", "1,x"], "--bins must be comma-separated numbers"),
    (["histogram", *AGE, "--epsilon", "1", "--bins", "5,1"], "increasing"),
    (["histogram", *AGE, "--epsilon", "1", "--bins", "1,5", "--delta", "1e-5"], "--delta applies to --stable"),
    (["histogram", *AGE, "--epsilon", "1", "--stable", "--noise", "laplace"], "--noise applies"),
    (["histogram", *AGE, "--epsilon", "1", "--bins", "1,5", "--noise", "gauss"], "noise must be one of"),
    (["histogram", *AGE, "--epsilon", "-2", "--stable"], "--epsilon"),
])
def test_bad_input_is_one_error_line(args, needle):
    r = runner.invoke(app, args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert needle in lines[0], r.output


def test_a_text_column_is_refused_where_numbers_are_needed(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("name,age\nann,31\nbob,n/a\n")
    for cmd in (["mean", "--lower", "0", "--upper", "1"], ["histogram", "--bins", "0,50"]):
        r = runner.invoke(app, [*cmd, "--column", "age", "--epsilon", "1", "--data", str(p)])
        assert r.exit_code == 2 and r.output.strip() == "error: column 'age' is not numeric: row 2 holds 'n/a'"
