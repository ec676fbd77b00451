"""The CLI starts light: its quick commands import neither torch nor the sub-apps, and the lazy listing
prints the same help as the loaded commands. (Times: `dpfl bench cli`; no timed test here.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.core import TyperGroup
from typer.testing import CliRunner

from dpfl.cli import main

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, sys
from dpfl.cli.main import app
out = []
for args in {commands!r}:
    try:
        app(args, prog_name="dpfl")
        code = 0
    except SystemExit as e:
        code = e.code
    heavy = sorted(m for m in ("torch", "dpfl.cli.privacy", "dpfl.data", "dpfl.schemes.registry", "dp_accounting",
                               "numpy", "scipy.special", "scipy.optimize", "scipy.stats", "scipy.signal", "scipy.fft",
                               "dpfl.privacy.samplers", "dpfl.rng", "dpfl.privacy.pld")
                   if m in sys.modules)
    out.append([args, code, heavy])
print(json.dumps(out))
"""


def test_quick_commands_do_not_import_torch():
    eps = ["privacy", "epsilon", "--sigma", "1", "--steps", "100"]
    # in this order, each row lists what the commands so far have imported
    commands = [["--help"], ["schemes"], [*eps, "--q", "1", "--json"], [*eps, "--q", "0.01"]]  # default: rdp
    p = subprocess.run([sys.executable, "-c", _SCRIPT.format(commands=commands)], cwd=ROOT, capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stderr
    (help_, schemes, unsampled, epsilon) = json.loads(p.stdout.strip().splitlines()[-1])
    assert help_ == [["--help"], 0, []]  # listed, not imported
    assert schemes == [["schemes"], 0, []]  # from dpfl.schemes.index, not the registry
    # the privacy package imports no scipy, and the plain Gaussian's curve needs none
    assert unsampled[1:] == [0, ["dpfl.cli.privacy", "numpy"]]
    # the subsampled curve takes gammaln and log_ndtr from scipy.special (its bits are the recorded epsilons'),
    # but neither dp-accounting, scipy.optimize nor scipy.stats (~1.5 s of imports), nor torch
    assert epsilon[1:] == [0, ["dpfl.cli.privacy", "numpy", "scipy.special"]]
    assert '"epsilon": 96.0885' in p.stdout  # q 1: the plain Gaussian's epsilon was computed
    assert "1.2141" in p.stdout  # it did compute epsilon (rdp, sigma 1, q 0.01, 100 steps)


def test_every_accountant_imports_no_dp_accounting():
    """`dpfl privacy epsilon --accountant all` (issue 40: under 1 s in a fresh process; `dpfl bench cli` times
    it): the pld accountant builds the subsampled Gaussian's PLD in numpy, so the command imports no more than
    the rdp accountant does (and the pld module): neither dp-accounting nor scipy.stats, scipy.signal (which
    dp-accounting's PLD modules import) nor scipy.optimize, nor the samplers and dpfl.rng."""
    commands = [["privacy", "epsilon", "--sigma", "1", "--steps", "100", "--q", "0.01", "--accountant", "all",
                 "--json"]]
    p = subprocess.run([sys.executable, "-c", _SCRIPT.format(commands=commands)], cwd=ROOT, capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stderr
    ((_, code, heavy),) = json.loads(p.stdout.strip().splitlines()[-1])
    assert code == 0 and heavy == ["dpfl.cli.privacy", "dpfl.privacy.pld", "numpy", "scipy.special"]
    out = json.loads(p.stdout.strip().splitlines()[-2])
    assert out["pld"] == pytest.approx(0.71804, abs=1e-5) and out["pld"] < out["rdp"] < out["moments"]


def test_lazy_listing_matches_loaded_commands(monkeypatch):
    runner = CliRunner()
    lazy = runner.invoke(main.app, ["--help"], prog_name="dpfl")
    assert lazy.exit_code == 0, lazy.output
    # list through get_command, which loads every sub-app and `generate`
    monkeypatch.setattr(main._LazyGroup, "format_help", TyperGroup.format_help)
    loaded = runner.invoke(main.app, ["--help"], prog_name="dpfl")
    assert loaded.exit_code == 0, loaded.output
    assert lazy.output == loaded.output
    for name in main._LAZY:
        assert f" {name} " in lazy.output


def test_lazy_command_runs_and_typos_are_suggested():
    runner = CliRunner()
    r = runner.invoke(main.app, ["privacy", "epsilon", "--sigma", "1", "--q", "0.01", "--steps", "100",
                                 "--accountant", "rdp", "--json"], prog_name="dpfl")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["epsilon"] > 0
    r = runner.invoke(main.app, ["privcy"], prog_name="dpfl")
    assert r.exit_code == 2 and "privacy" in r.output
