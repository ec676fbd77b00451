"""`dpfl reproduce TABLE --replay N`: recorded rows rerun and compared with their records."""

import io
import json

import pytest
import torch
from rich.console import Console

from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.experiments.replay import replay
from dpfl.run.state import Run


def _tiny(name):
    return load_config(data={
        "name": name, "seed": 3,
        "data": {"dataset": "digits", "n_clients": 12},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 8}},
        "train": {"steps": 2, "batch_size": 8, "lr": 0.2},
        "federation": {"rounds": 3, "clients_per_round": 4},
        "scheme": {"name": "fl-sign"},
    })


def test_a_faithful_record_replays_the_same_and_an_edited_one_does_not(tmp_path):
    records = tmp_path / "records"
    for row in ("fl-sign", "fl-std"):
        simulate(Run(_tiny(row), records / "table-4.1" / row, log=lambda s: None))
    quiet = Console(file=io.StringIO())
    out = replay(records, "table-4.1", 2, quiet)
    assert [r["diffs"] for r in out] == [[], []] and all(r["rounds"] == 2 for r in out)
    assert "accuracy" in out[0]["keys"] and "up_bytes" in out[0]["keys"]
    path = records / "table-4.1" / "fl-std" / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[1]["up_bytes"] += 1
    path.write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = replay(records, "all", 2, quiet)
    assert out[0]["diffs"] == [] and len(out[1]["diffs"]) == 1 and "round 2 up_bytes" in out[1]["diffs"][0]
    # a difference is printed with the code that made the record beside the code replaying it
    from dpfl.run.state import code_version, ran_on

    assert out[1]["code"] == [{**code_version(), "ran_on": ran_on(torch.device("cpu")), "from_round": 1}]
    assert f"the record ran at commit {code_version()['commit'] or 'unknown'}" in quiet.file.getvalue()


def test_replay_refuses_a_table_without_records_and_zero_rounds(tmp_path):
    (tmp_path / "table-4.1").mkdir()
    with pytest.raises(ConfigError, match="no records of 'table-4.4'"):
        replay(tmp_path, "table-4.4", 1, Console(file=io.StringIO()))
    with pytest.raises(ConfigError, match="at least 1 round"):
        replay(tmp_path, "table-4.1", 0, Console(file=io.StringIO()))
    with pytest.raises(ConfigError, match="not a directory of run records"):
        replay(tmp_path / "none", "all", 1, Console(file=io.StringIO()))


def test_a_replay_that_ran_fewer_rounds_is_a_difference():
    from dpfl.experiments.replay import compare

    assert compare([{"round": 1}, {"round": 2}], [{"round": 1}]) == ["2 rounds on record, 1 now"]
    assert compare([{"round": 1}], [{"round": 1}]) == []
