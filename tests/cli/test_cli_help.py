"""Positional arguments keep their help text in `--help` (typer < 0.21, which flwr 1.41 requires, drops
it under click 8.5: hence the click cap in pyproject.toml)."""

import re

import pytest
from typer.testing import CliRunner

from dpfl.cli.main import app


@pytest.mark.parametrize("command,argument,help_text", [
    ("run", "config", "Run config (TOML). Omit with --resume."),
    ("reproduce", "table", "Table id (e.g. table-4.4); `dpfl reproduce list` lists them."),
    ("report", "run_dirs", "One or more run directories."),
])
def test_positional_argument_help_is_shown(command, argument, help_text):
    r = CliRunner().invoke(app, [command, "--help"], prog_name="dpfl", terminal_width=200)
    assert r.exit_code == 0, r.output
    panel = r.output[r.output.index("Arguments"):r.output.index("Options")]
    words = " ".join(re.sub(r"[│╭╮╰╯─]", " ", panel).split())
    assert argument in words
    assert help_text in words
