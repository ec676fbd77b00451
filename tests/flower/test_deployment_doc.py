"""docs/deployment.md, followed verbatim: every `# by-hand N` block of its by-hand section runs,
in order, in one shell on this machine (the three sites as three SuperNodes on loopback), with a
fresh home directory (no ~/.flwr yet) and the clone as the working directory."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"


def by_hand_blocks(text: str) -> list[str]:
    """The ```bash blocks whose first line is `# by-hand N`, in the order N."""
    blocks = re.findall(r"```bash\n(# by-hand (\d+).*?)```", text, flags=re.DOTALL)
    numbers = [int(n) for _, n in blocks]
    assert numbers == list(range(len(blocks))), f"by-hand steps out of order: {numbers}"
    return [b for b, _ in blocks]


def _editable_install() -> Path | None:
    """The directory this Python's dpfl is installed from in editable mode (pip's direct_url.json)."""
    from importlib.metadata import distributions
    from urllib.parse import unquote, urlparse

    for dist in distributions(name="dpfl"):  # a source tree's own dpfl.egg-info has no direct_url.json
        info = json.loads(dist.read_text("direct_url.json") or "{}")
        if info.get("dir_info", {}).get("editable") and info.get("url", "").startswith("file:"):
            return Path(unquote(urlparse(info["url"]).path)).resolve()
    return None


def test_the_by_hand_blocks_are_found():
    blocks = by_hand_blocks(DOC.read_text())
    assert len(blocks) == 8 and "flower-superlink" in blocks[2] and "flwr run" in blocks[6]


@pytest.mark.integration
def test_the_by_hand_procedure_works_verbatim(tmp_path):
    script = "set -euo pipefail\n" + "\n".join(by_hand_blocks(DOC.read_text()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env["HOME"] = str(tmp_path)
    installed = _editable_install()
    if installed is not None and installed != ROOT:  # a worktree: its `pip install -e .` would repoint this
        # Python's dpfl here for good; pip resolves only (--dry-run), and ROOT's dpfl is imported
        shim = tmp_path / "shim"
        shim.mkdir()
        (shim / "pip").write_text(f'#!/bin/sh\nexec {sys.executable} -m pip "$@" --dry-run\n')
        (shim / "pip").chmod(0o755)
        env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    p = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=900)
    finally:
        from dpfl.flower.local import descendants

        for pid in descendants([p.pid]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the SuperLink and SuperNodes the steps started with &
        except ProcessLookupError:
            pass
    work = tmp_path / "dpfl-deploy"
    logs = "".join(f"\n--- {f.name}\n" + f.read_text(errors="replace")[-1500:] for f in work.glob("*.log"))
    assert p.returncode == 0, out[-4000:] + logs
    summary = json.loads((work / "results" / "summary.json").read_text())
    assert summary["rounds_run"] == 2 and summary["rounds_aborted"] == 0
    rounds = [json.loads(line) for line in (work / "results" / "metrics.jsonl").read_text().splitlines()]
    assert [m["answered"] for m in rounds] == [3, 3]
    assert all("flower_sa_consistency_wall_seconds" in m for m in rounds)  # the rounds were signed
    assert "resuming" in out and out.count("dpfl-summary") == 2
