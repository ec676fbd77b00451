"""A real federation on loopback: SuperLink (TLS), 3 SuperNodes (each with its own data file),
`flwr run`, 3 rounds of FL-SIGN-DP with secure aggregation. The final model must equal the
simulator's bit for bit: clients train with the simulator's sequential engine (one client at a
time, as a deployed client does), draw the same seeded randomness, and the secure sum is exact
in Z_(2^b), so message order cannot change the result."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch
from flower_helpers import SIGN_DP, config, require_row_contract, simulate

from dpfl.config import load_config
from dpfl.engine.simulator import build_federation
from dpfl.flower.local import run_local
from dpfl.rng import Seeds


def _leftovers(marker: str) -> list[int]:
    """Processes whose command line mentions `marker` (our federation's directory)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                out.append(int(p.name))
    return out


@pytest.mark.integration
def test_fl_sign_dp_with_secure_aggregation_over_flower_matches_the_simulator(tmp_path):
    require_row_contract()
    data = config(SIGN_DP)
    cfg = load_config(data=data)
    fed = build_federation(cfg, Seeds(cfg.seed))
    paths = {}
    for i, idx in enumerate(fed.clients):  # each SuperNode reads only its own file
        paths[i] = tmp_path / f"client-{i}.npz"
        np.savez(paths[i], x=fed.x[idx].numpy(), y=fed.y[idx].numpy())
    try:
        res = run_local(tomli_w.dumps(data), tmp_path / "run", tls=True, reproducible=True, data_paths=paths,
                        timeout=600, log=print)  # a hang guard: 3 min idle, over 5 under load
    finally:
        left = _leftovers(str(tmp_path))
        for pid in left:
            os.kill(pid, 9)
    assert not left, f"processes left running after the run: {left}"

    sim, sim_rounds = simulate(data)
    assert res["summary"]["rounds_run"] == 3
    assert torch.equal(res["w"], sim.w)
    for mine, ref in zip(res["metrics"], sim_rounds):
        assert mine["answered"] == 3 and mine["step_secagg_survivors"] == 3
        assert mine["up_bytes"] == ref["up_bytes"]  # the masked inputs the simulator counts
        assert mine["epsilon"] == ref["epsilon"]
        assert mine["accuracy"] == ref["accuracy"]
    print(f"\nstartup {res['startup_seconds']:.1f} s, run {res['run_seconds']:.1f} s, "
          f"CPU {res['cpu_seconds']:.1f} s; per round: " + ", ".join(
              f"{m['round_seconds']:.1f} s / {m['flower_up_bytes'] // 3} B up / {m['flower_down_bytes'] // 3} B down "
              f"per client (simulator {r['up_bytes'] // 3} B)" for m, r in zip(res["metrics"], sim_rounds)))
