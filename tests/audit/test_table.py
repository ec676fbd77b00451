"""docs/audit.md's table is what the committed audit runs (docs/audit/<run>/) generate, and those runs are
complete, honest (not flagged) records."""

import json
import shutil
from pathlib import Path

import pytest

from dpfl.audit.central import load_central_config
from dpfl.audit.table import audit_block, load_runs
from dpfl.config import load_config
from dpfl.errors import ConfigError
from dpfl.experiments import publish as pub

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / pub.AUDIT_RUNS


def _block(text: str) -> str:
    return text.split(pub.BEGIN.format("audit"))[1].split(pub.END)[0].strip("\n")


def test_the_doc_table_is_what_the_committed_runs_generate():
    doc = (ROOT / pub.AUDIT_DOC).read_text()
    assert _block(doc) == audit_block(RUNS, "audit"), "docs/audit.md is stale: run `dpfl publish`"
    assert pub.generated(ROOT)[ROOT / pub.AUDIT_DOC] == doc


def test_every_committed_run_is_a_complete_unflagged_record():
    runs = load_runs(RUNS)
    assert len(runs) == len(list(RUNS.glob("*/audit.json")))
    for d, a, s in runs:
        assert (d / "config.toml").is_file()
        if a["level"] == "central":
            cfg = load_central_config(d / "config.toml")
            assert cfg.dpsgd.target_epsilon == pytest.approx(a["epsilon_accounted"], abs=1e-3)
            assert s["epsilon"] == a["epsilon_accounted"]
        else:
            load_config(d / "config.toml")
            assert (s.get("record_level") or {}).get("epsilon_max", s.get("epsilon_final")) == a["epsilon_accounted"]
        assert not a["flagged"], d.name
        for box in ("white", "black"):
            if box in a:
                assert 0 <= a[box]["epsilon_lower_bound"] <= a["epsilon_accounted"], d.name


def test_rows_follow_the_mechanism_order_and_a_broken_record_is_one_error_line(tmp_path):
    for d in sorted(RUNS.glob("*/audit.json"))[:4]:
        shutil.copytree(d.parent, tmp_path / d.parent.name)
    block = audit_block(tmp_path, "runs")
    rows = block.splitlines()[2:]
    assert len(rows) == 4
    order = [load_runs(tmp_path)[i][0].name for i in range(4)]
    assert [r.rsplit("](runs/", 1)[1].split(")")[0] for r in rows] == order
    a = json.loads((tmp_path / order[0] / "audit.json").read_text())
    assert f"{a['epsilon_accounted']:.3f}" in rows[0]
    (tmp_path / order[0] / "summary.json").unlink()
    with pytest.raises(ConfigError, match="needs audit.json, config.toml and summary.json") as e:
        audit_block(tmp_path, "runs")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="holds no audit run"):
        audit_block(tmp_path / "empty", "runs")
