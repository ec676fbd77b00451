"""`dpfl classic train` through typer's CliRunner: numbers, the ε read back, one error line."""

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from dpfl.cli.classic import app

runner = CliRunner()


def ok(args):
    r = runner.invoke(app, ["train", *args])
    assert r.exit_code == 0, r.output
    return r.output


def spent(out: str) -> float:
    return float(re.search(r"ε spent: (\S+)", out).group(1))


@pytest.mark.parametrize("model,metric", [("linear", "MSE"), ("logistic", "accuracy"), ("svm", "accuracy"),
                                          ("forest", "accuracy")])
def test_each_model_trains_beside_scikit_learn_and_spends_its_epsilon(model, metric):
    out = ok(["--model", model, "--epsilon", "2", "--seed", "0"])
    dp, base = (float(m) for m in re.findall(rf"{metric} (\S+)", out))
    assert "non-private (scikit-learn" in out
    assert spent(out) == pytest.approx(2.0)  # summed from the events the model recorded
    assert np.isfinite(dp) and np.isfinite(base)
    if metric == "accuracy":
        assert 0.5 < base <= 1.0 and 0.0 <= dp <= 1.0
    assert ok(["--model", model, "--epsilon", "2", "--seed", "0"]) == out  # same seed, same output


def _csv(tmp_path, n=200):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, size=(n, 2))
    label = np.where(x[:, 0] > 5, "sick", "well")
    p = tmp_path / "d.csv"
    p.write_text("a,b,label\n" + "".join(f"{u:.3f},{v:.3f},{c}\n" for (u, v), c in zip(x, label)))
    return p


def test_a_csv_with_text_labels_and_a_bounds_file(tmp_path):
    data = _csv(tmp_path)
    bounds = tmp_path / "b.csv"
    bounds.write_text("a,b\n0,0\n10,10\n")
    out = ok(["--model", "forest", "--epsilon", "5", "--data", str(data), "--bounds", str(bounds), "--seed", "1"])
    assert "2 features, 2 classes" in out and "note:" not in out
    dp = float(re.search(r"DP random forest\s+accuracy (\S+)", out).group(1))
    assert dp > 0.8  # one threshold on `a` separates the classes
    out = ok(["--model", "logistic", "--epsilon", "5", "--data", str(data), "--target", "label", "--seed", "1"])
    assert "note: feature ranges were read from the data" in out


@pytest.mark.parametrize("args,needle", [
    (["--model", "svm", "--epsilon", "0"], "--epsilon"),
    (["--model", "svm", "--epsilon", "nan"], "--epsilon"),
    (["--model", "svm", "--epsilon", "-inf"], "--epsilon"),
    (["--model", "tree", "--epsilon", "1"], "--model"),
    (["--model", "svm", "--epsilon", "1", "--trees", "5"], "--trees applies to --model forest"),
    (["--model", "forest", "--epsilon", "1", "--C", "2"], "--C applies to --model svm"),
    (["--model", "svm", "--epsilon", "1", "--target", "x"], "--target applies to a CSV"),
    (["--model", "svm", "--epsilon", "1", "--data", "digits"], "10 classes"),
    (["--model", "forest", "--epsilon", "1", "--data", "diabetes"], "regression"),
    (["--model", "svm", "--epsilon", "1", "--data", "/nonexistent/x.csv"], "file not found"),
    (["--model", "svm", "--epsilon", "1", "--data", "iris"], "--data must be"),
    (["--model", "svm", "--epsilon", "1", "--test-size", "1"], "--test-size"),
    (["--model", "svm", "--epsilon", "1", "--seed", "-1"], "--seed"),
    (["--model", "forest", "--epsilon", "1", "--trees", "0"], "n_trees must be an integer >= 1"),
    (["--model", "forest", "--epsilon", "1", "--depth", "-1"], "max_depth must be an integer >= 0"),
    (["--model", "svm", "--epsilon", "1", "--C", "nan"], "C must be a finite number"),
])
def test_bad_input_is_one_error_line(args, needle):
    r = runner.invoke(app, ["train", *args])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.output


def test_bad_csv_content_is_one_error_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("name,a,y\nann,1,0\nbob,2,1\n")
    bounds = tmp_path / "b.csv"
    bounds.write_text("a\n5\n1\n")
    cases = [
        (["--data", str(p)], "column 'name' is not numeric: row 1 holds 'ann'"),
        (["--data", str(p), "--target", "nope"], "no column 'nope'"),
    ]
    p2 = tmp_path / "u.csv"
    p2.write_text("a,b,y\n1,inf,0\n2,3,1\n")
    p3 = tmp_path / "v.csv"
    p3.write_text("a,b,y\n1,2,0\n2,3,1\n")
    flipped = tmp_path / "f.csv"
    flipped.write_text("a,b\n5,0\n1,1\n")
    cases += [(["--data", str(p2)], "non-finite value at row 1"),
              (["--data", str(p3), "--bounds", str(bounds)], "gives no bounds for ['b']"),
              (["--data", str(p3), "--bounds", str(flipped)], "lower bound >= upper bound for ['a']"),
              (["--data", str(p3), "--bounds", str(tmp_path / "none.csv")], "file not found")]
    for extra, needle in cases:
        r = runner.invoke(app, ["train", "--model", "forest", "--epsilon", "1", *extra])
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
        assert needle in lines[0], r.output


def test_mounted_on_the_dpfl_command():
    from dpfl.cli.main import app as dpfl

    for args, needle in ((["classic", "--help"], "train"), (["stats", "--help"], "histogram"),
                         (["bench", "--help"], "classic"), (["bench", "--help"], "stats")):
        r = runner.invoke(dpfl, args)
        assert r.exit_code == 0 and needle in r.output, r.output
