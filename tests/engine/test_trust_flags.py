"""Trust boundaries, flags: `dpfl run` and `dpfl reproduce` refuse flags that do not apply, an
output directory that holds a run, bad round counts and a silent σ re-calibration, each with one
`error:` line (exit code 2, no traceback) and without touching what is already written."""

import json

import pytest
import torch
from typer.testing import CliRunner

from dpfl.cli.main import app
from dpfl.config import dump_config


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(r, *phrases):
    """Exit code 2, exactly one `error:` line naming the problem, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.output, r.output
    for p in phrases:
        assert p in errors[0], (p, errors[0])
    return errors[0]


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture
def made(tmp_path, tiny_config):
    """A config file and a finished 2-round run made from it."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_config(tiny_config(**{"federation.rounds": 2})))
    r = cli("run", cfg, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    return cfg, tmp_path / "run"


def test_out_onto_an_existing_run_refuses_without_overwrite(made, tmp_path):
    cfg, run = made
    before = snapshot(run)
    refused(cli("run", cfg, "--out", run, "--set", "seed=9"), str(run), "already holds a run", "--overwrite")
    assert snapshot(run) == before
    r = cli("run", cfg, "--out", run, "--set", "seed=9", "--overwrite")
    assert r.exit_code == 0, r.output
    assert snapshot(run)["metrics.jsonl"] != before["metrics.jsonl"]
    assert "seed = 9" in (run / "config.toml").read_text()


@pytest.mark.parametrize("extra,named", [(["CONFIG"], "CONFIG"), (["--out", "elsewhere"], "--out"), (["--overwrite"], "--overwrite")])
def test_flags_that_do_not_apply_with_resume(made, extra, named):
    cfg, run = made
    before = snapshot(run)
    args = [cfg if a == "CONFIG" else a for a in extra]
    refused(cli("run", "--resume", run, *args), named, "does not apply with --resume")
    assert snapshot(run) == before


@pytest.mark.parametrize("sets,named", [(["seed=1"], "got seed"), (["run.threads=1", "train.lr=0.5"], "got train.lr"),
                                        (["run.engine=\"loop\""], "got run.engine"),
                                        (["run.threads=-1"], "run.threads"), (["run.threads"], "key=value")])
def test_resume_takes_only_resources_from_set(made, sets, named):
    """--set with --resume changes where the run goes on (threads, device...), never what it is."""
    _, run = made
    before = snapshot(run)
    refused(cli("run", "--resume", run, "--rounds", "3", *[x for s in sets for x in ("--set", s)]), named)
    assert snapshot(run) == before


def test_resume_with_a_resource_set_runs_on_with_it(made):
    _, run = made
    assert "threads = 2" not in (run / "config.toml").read_text()
    r = cli("run", "--resume", run, "--rounds", "3", "--set", "run.threads=2")
    assert r.exit_code == 0, r.output
    assert "threads = 2" in (run / "config.toml").read_text()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("extra,named", [(["--rounds", "3"], "--rounds"),
                                         (["--allow-recalibration"], "--allow-recalibration")])
def test_flags_that_do_not_apply_without_resume(made, tmp_path, extra, named):
    cfg, _ = made
    refused(cli("run", cfg, "--out", tmp_path / "new", *extra), named, "does not apply without --resume")
    assert not (tmp_path / "new").exists()


def test_no_config_and_no_resume(tmp_path):
    refused(cli("run"), "give a CONFIG file or --resume DIR")


@pytest.mark.parametrize("rounds,phrase", [("0", "--rounds must be at least 1, got 0"),
                                           ("1", "has already run 2 rounds")])
def test_resume_with_too_few_rounds(made, rounds, phrase):
    _, run = made
    before = snapshot(run)
    refused(cli("run", "--resume", run, "--rounds", rounds), phrase)
    assert snapshot(run) == before


@pytest.mark.parametrize("setting,phrase", [("train.lr=inf", "train.lr: Input should be a finite number"),
                                            ("scheme.options={clip=nan}", "clip = nan"),
                                            ('eval.metric="loss"', "eval.metric")])
def test_bad_config_values_are_one_error_line(made, tmp_path, setting, phrase):
    cfg, _ = made
    refused(cli("run", cfg, "--out", tmp_path / "new", "--set", setting), phrase)
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_cuda_on_cpu_only_torch_is_one_error_line(made, tmp_path):
    cfg, _ = made
    refused(cli("run", cfg, "--out", tmp_path / "new", "--set", 'run.device="cuda"'), "run.device = 'cuda'")


def test_corrupt_checkpoint_is_one_error_line_and_kept(made):
    _, run = made
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    refused(cli("run", "--resume", run), "checkpoint.pt: not a readable checkpoint")
    assert (run / "checkpoint.pt").read_bytes() == b"not a checkpoint"


def test_resume_that_would_recalibrate_sigma_refuses_unless_allowed(tmp_path, tiny_config):
    cfg = tmp_path / "dp.toml"
    cfg.write_text(dump_config(tiny_config(**{"federation.rounds": 2, "scheme.name": "fl-std-dp",
                                              "scheme.options": {"epsilon": 4.0, "clip": 1.0},
                                              # Poisson: calibrating σ is quick (without replacement
                                              # under rdp takes seconds per calibration)
                                              "federation.sampling": "poisson"})))
    run = tmp_path / "run"
    assert cli("run", cfg, "--out", run).exit_code == 0
    before = snapshot(run)
    refused(cli("run", "--resume", run, "--rounds", "3"), "would change the noise multiplier σ",
            "--allow-recalibration")
    assert snapshot(run) == before
    r = cli("run", "--resume", run, "--rounds", "3", "--allow-recalibration")
    assert r.exit_code == 0, r.output
    assert "σ re-calibrated on resume with 3 rounds instead of 2" in r.output
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


# ---- dpfl reproduce ---------------------------------------------------------------------------


@pytest.fixture
def table(tmp_path, tiny_config, monkeypatch):
    """A one-row table `tiny` in a temporary configs folder."""
    root = tmp_path / "configs"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "thesis.json").write_text(json.dumps({"_table": {"description": "tiny"}, "row": {}}))
    (root / "tiny" / "row.toml").write_text(dump_config(tiny_config(**{"federation.rounds": 2})))
    monkeypatch.setattr("dpfl.experiments.reproduce.configs_root", lambda: root)
    monkeypatch.setattr("dpfl.experiments.report.write_plots", lambda *a: None)  # seconds of matplotlib
    return tmp_path / "out"


@pytest.mark.parametrize("args,phrase", [
    (["list", "--row", "x"], "--row does not apply to `dpfl reproduce list`"),
    (["tiny", "--report-only", "--set", "seed=1"], "--set does not apply with --report-only"),
    (["tiny", "--report-only", "--rounds", "3"], "--rounds does not apply with --report-only"),
    (["tiny", "--report-only", "--overwrite"], "--overwrite does not apply with --report-only"),
    (["tiny", "--rounds", "0"], "--rounds must be at least 1, got 0"),
])
def test_reproduce_flags(table, args, phrase):
    refused(cli("reproduce", *args, "--out", table), phrase)
    assert not table.exists()


def test_reproduce_does_not_resume_a_row_made_with_another_config(table):
    assert cli("reproduce", "tiny", "--out", table, "--rounds", "1").exit_code == 0
    row = table / "tiny" / "row"
    before = snapshot(row)
    r = cli("reproduce", "tiny", "--out", table, "--rounds", "2", "--set", "train.lr=0.05")
    assert r.exit_code == 0 and "row: skipped:" in r.output and "different config (train.lr)" in r.output
    assert snapshot(row) == before
    r = cli("reproduce", "tiny", "--out", table, "--rounds", "2")
    assert r.exit_code == 0 and "resuming at round 1" in r.output
    assert len((row / "metrics.jsonl").read_text().splitlines()) == 2


def test_reproduce_keeps_a_run_it_cannot_resume_unless_overwrite(table):
    assert cli("reproduce", "tiny", "--out", table, "--rounds", "1").exit_code == 0
    row = table / "tiny" / "row"
    (row / "checkpoint.pt").unlink()
    (row / "summary.json").unlink()
    before = snapshot(row)
    r = cli("reproduce", "tiny", "--out", table, "--rounds", "2")
    assert "without a checkpoint" in r.output and snapshot(row) == before
    r = cli("reproduce", "tiny", "--out", table, "--rounds", "2", "--overwrite")
    assert r.exit_code == 0, r.output
    assert len((row / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_cohort_that_cannot_fit_in_memory_is_one_line_naming_max_cohort(monkeypatch):
    """signSGD trains every client each round: 6,000 clients of the thesis CNN need ~40 GB at once,
    which the kernel answered with a silent kill; now the run refuses at start and says how to split.
    A scheme whose round needs all rows at once is not told to split (its pieces would be put back together)."""
    from dpfl.config import load_config
    from dpfl.engine import simulator
    from dpfl.errors import ConfigError
    from dpfl.run.state import Run

    def cfg(scheme, **extra):
        return load_config(data={"name": "mem", "data": {"dataset": "digits", "n_clients": 10},
                                 "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 8}},
                                 "federation": {"rounds": 1, "clients_per_round": 10}, "scheme": {"name": scheme},
                                 **extra})
    n = 64 * 8 + 8 + 8 * 10 + 10
    monkeypatch.setattr(simulator, "available_memory", lambda: 4 * n * 5)
    sign = cfg("signsgd")
    with pytest.raises(ConfigError, match=r"training 10 clients at once .* run.max_cohort=1$"):
        simulator.Simulator(Run(sign, None, log=lambda s: None))
    sign.run.max_cohort = 5
    simulator.Simulator(Run(sign, None, log=lambda s: None))  # 5 at a time fit
    attacked = cfg("signsgd", attack={"name": "random-update", "fraction": 0.2, "options": {"sigma": 1.0}})
    for c in (cfg("fl-std"), attacked):  # an attack acts on the whole cohort: signSGD then cannot stream either
        c.run.max_cohort = 5
        with pytest.raises(ConfigError, match=r"training 10 clients at once .* needs every client's row at once"):
            simulator.Simulator(Run(c, None, log=lambda s: None))


def test_reproduce_resumes_a_row_made_on_another_device(table):
    """run.device is a resource like run.threads: a row cut on a GPU host resumes on a CPU one
    (the record's `code` names the device of each part)."""
    import tomllib

    import tomli_w

    assert cli("reproduce", "tiny", "--out", table, "--rounds", "1").exit_code == 0
    row = table / "tiny" / "row"
    cfg = tomllib.loads((row / "config.toml").read_text())
    cfg.setdefault("run", {})["device"] = "cuda"  # as if the first round ran on a GPU host
    (row / "config.toml").write_text(tomli_w.dumps(cfg))
    r = cli("reproduce", "tiny", "--out", table, "--rounds", "2")
    assert r.exit_code == 0 and "resuming at round 1" in r.output, r.output
    assert len((row / "metrics.jsonl").read_text().splitlines()) == 2
    from dpfl.config import RESUME_RESOURCES
    from dpfl.experiments.reproduce import _RESOURCE_KEYS

    assert {f"run.{k}" for k in RESUME_RESOURCES} <= set(_RESOURCE_KEYS)


def test_reproduce_skips_a_row_the_simulator_refuses_and_goes_on(table, monkeypatch):
    """A row whose cohort cannot fit in memory is refused before its first round: reproduce says it
    skipped that row (as for any refused row) instead of stopping the table."""
    from dpfl.engine import simulator

    monkeypatch.setattr(simulator, "available_memory", lambda: 1)
    r = cli("reproduce", "tiny", "--out", table, "--rounds", "1")
    assert r.exit_code == 0 and "skipped" in r.output and "needs at least" in r.output, r.output
    assert not (table / "tiny" / "row" / "metrics.jsonl").exists()
