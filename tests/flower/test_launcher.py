"""dpfl's `flwr-clientapp` (dpfl.flower.launcher): Flower's own function, started without the
SuperNode's command modules, and only from a directory no one else may write to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dpfl.cli.main import app
from dpfl.errors import ConfigError
from dpfl.flower import launcher
from dpfl.flower.local import LocalFederation

PROBE = """
import runpy, sys
sys.argv = ["flwr-clientapp", "--help"]
try:
    runpy.run_path({path!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
print("EXIT", code)
print("SUPERNODE_CLI", "flwr.supernode.cli.flower_supernode" in sys.modules)
print("SQLALCHEMY", "sqlalchemy" in sys.modules)
"""


def test_the_script_is_flowers_clientapp_without_the_supernode_command(tmp_path):
    path = launcher.write(tmp_path / "bin")
    assert path.name == "flwr-clientapp" and oct(path.stat().st_mode & 0o777) == "0o700"
    assert path.read_text().splitlines()[0] == f"#!{sys.executable}"
    out = subprocess.run([sys.executable, "-c", PROBE.format(path=str(path))], capture_output=True, text=True,
                         check=False, timeout=120).stdout
    assert "usage: flwr-clientapp" in out and "--runtime-api-address" in out  # Flower's own parser
    assert "EXIT 0" in out
    assert "SUPERNODE_CLI False" in out and "SQLALCHEMY False" in out
    # and Flower's own script does load them (what the launcher saves)
    code = "import sys, flwr.supernode.cli; print('flwr.supernode.cli.flower_supernode' in sys.modules)"
    own = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120, check=False).stdout
    assert own.strip() == "True"


def test_the_script_runs_as_a_command(tmp_path):
    path = launcher.write(tmp_path / "bin")
    res = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.startswith("usage: flwr-clientapp")


def test_a_directory_others_may_write_to_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by no one else"):
        launcher.write(d)
    assert not (d / launcher.NAME).exists()


def test_a_rewrite_replaces_the_file(tmp_path):
    path = launcher.write(tmp_path / "bin")
    path.write_text("#!/bin/sh\nexit 3\n")
    assert launcher.write(tmp_path / "bin") == path and launcher.MARK in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["flwr-clientapp"]  # no temporary left


def test_a_local_federation_puts_it_first_on_the_supernodes_path(tmp_path):
    fed = LocalFederation(tmp_path / "fed", 1)
    assert fed.env["PATH"].split(os.pathsep)[0] == str(tmp_path / "fed" / "bin")
    plain = LocalFederation(tmp_path / "fed2", 1, launcher=False)
    assert plain.env["PATH"] == os.environ.get("PATH")


def test_the_command_writes_it_and_refuses_a_shared_directory(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["flower", "launcher", str(tmp_path / "bin")])
    assert res.exit_code == 0 and (tmp_path / "bin" / "flwr-clientapp").is_file()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    res = runner.invoke(app, ["flower", "launcher", str(shared)])
    assert res.exit_code == 2 and "writable by no one else" in res.output
    assert "Traceback" not in res.output


def test_a_python_path_with_a_space_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/opt/my env/bin/python3")
    with pytest.raises(ConfigError, match="holds a space"):
        launcher.write(tmp_path / "bin")
