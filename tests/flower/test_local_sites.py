"""`dpfl flower local --site I:key=value`: each site's own files, checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpfl.cli.flower import site_options
from dpfl.cli.main import app
from dpfl.errors import ConfigError


def test_site_options_give_each_client_its_node_config_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = site_options(["0:data-path=sites/client-0.npz", "0:test-path=/abs/t.npz", "2:label-column=y",
                        "2:data-scale=0.5", "1:data-shape=1,28,28"])
    assert got == {0: {"data-path": str(tmp_path / "sites" / "client-0.npz"), "test-path": "/abs/t.npz"},
                   2: {"label-column": "y", "data-scale": 0.5}, 1: {"data-shape": "1,28,28"}}


@pytest.mark.parametrize(("item", "why"), [
    ("data-path=x.npz", "I:key=value"), ("a:data-path=x", "I:key=value"), ("0:data-path=", "I:key=value"),
    ("0:partition-id=3", "must be one of"), ("0:data-scale=big", "must be a number"),
])
def test_bad_site_options_are_one_line(item, why):
    with pytest.raises(ConfigError, match=why):
        site_options([item])
    with pytest.raises(ConfigError, match="given twice"):
        site_options(["0:data-path=a", "0:data-path=b"])


def test_the_command_refuses_a_site_the_run_does_not_have_before_starting_anything(tmp_path):
    work = tmp_path / "work"
    res = CliRunner().invoke(app, ["flower", "local", "--workdir", str(work), "--site", "7:data-path=x.npz"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "node config for clients [7], but the run has data.n_clients = 3" in out, out
    assert "Traceback" not in res.output and not (work / "federation").exists()
    res = CliRunner().invoke(app, ["flower", "local", "--reproducible", "--workdir", str(work),
                                   "--site", "0:data-path=x.npz"])
    assert res.exit_code == 2 and "leave out --site" in " ".join(res.output.split())
    assert not Path(work / "federation").exists()


def test_a_deployed_round_is_printed_as_one_line():
    from dpfl.flower.progress import round_line

    m = {"round": 3, "selected": 3, "answered": 2, "absent": [1], "accuracy": 0.81234, "fed_accuracy": 0.8127,
         "fed_examples": 9999, "epsilon": 1.23456, "cum_up_bytes_per_client": 1526.0, "round_seconds": 4.06,
         "flower_sa_train_wall_seconds": 0.24}
    assert round_line(m) == ("round 3: 2/3 answered, absent 1, accuracy 0.8123, federated accuracy 0.8127 over 9,999 "
                             "examples, ε 1.235, upstream/client 1.53 KB, 4.1 s")
    m = {"round": 4, "selected": 3, "answered": 0, "absent": [0, 1, 2], "rejoined": [2], "diverged": 1,
         "aborted": "round 4: no client answered (client 0: ConfigError: set [privacy] or [/x])",
         "cum_up_bytes_per_client": 1526.0, "record_epsilon_max": 2.5, "round_seconds": 1.0}
    want = ("round 4: 0/3 answered, absent 0, 1, 2, rejoined 2, 1 diverged, aborted: round 4: no client answered "
            "(client 0: ConfigError: set [privacy] or [/x]), record ε 2.500 (max site), upstream/client 1.53 KB, 1.0 s")
    assert round_line(m) == want


def test_what_sites_and_logs_say_is_printed_as_it_is(capsys):
    from dpfl.cli.flower import _say

    _say("client 0: set [privacy] epsilon [/x] [bold]")  # not Rich markup: nothing dropped, no MarkupError
    assert capsys.readouterr().out == "client 0: set [privacy] epsilon [/x] [bold]\n"


def test_rounds_are_echoed_once_as_their_lines_arrive_and_a_line_in_writing_waits():
    from dpfl.flower.progress import Echo

    said: list[str] = []
    echo = Echo(said.append)
    text = "INFO : starting\ndpfl-round {\"round\": 1, \"selected\": 3, \"answered\": 3}\ndpfl-round {\"round\": 2"
    echo(text)
    assert said == ["round 1: 3/3 answered, upstream/client -"]
    text += ', "selected": 3, "answered": 2, "absent": [1]}\ndpfl-round not json\nround 9 in prose\n'
    echo(text)
    echo(text)
    assert said[1:] == ["round 2: 2/3 answered, absent 1, upstream/client -"]


def test_a_round_said_again_or_a_failing_say_does_not_stop_the_echo_or_the_run():
    from dpfl.flower.progress import Echo

    said: list[str] = []
    echo = Echo(said.append)
    line = 'dpfl-round {"round": 1, "selected": 1, "answered": 1}\n'
    echo(line + line)
    assert len(said) == 1

    def broken(_: str) -> None:
        raise BrokenPipeError

    echo = Echo(broken)
    echo(line)  # no error: display only
    echo(line + line.replace('"round": 1', '"round": 2'))
