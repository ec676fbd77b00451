"""A real federation on loopback: SuperLink (TLS), 3 SuperNodes (each with its own data file),
`flwr run`, 3 rounds of FL-SIGN-DP with secure aggregation. The final model must equal the
simulator's bit for bit: clients train with the simulator's sequential engine (one client at a
time, as a deployed client does), draw the same seeded randomness, and the secure sum is exact
in Z_(2^b), so message order cannot change the result."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import tomli_w
import torch
from flower_helpers import SIGN_DP, config, held_out_counts, require_row_contract, simulate, site_files

from dpfl.flower.appdir import write_app
from dpfl.flower.local import FederationError, LocalFederation, raise_if_unfinished, run_local
from dpfl.run.state import RUN_FILES, SUMMARY

TOLERANT = {"name": "fl-sign-dp", "options": {**SIGN_DP["options"], "tolerate": 1}}


class Killed(Exception):
    """The ServerApp was killed: the test stops waiting for its run."""


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
    """Site 0 on a CSV, sites 1 and 2 on .npz files (training and held-out), federated evaluation:
    the model equals the simulator's fed the same partition, and the sites' evaluation counts add up
    to its accuracy on their held-out data."""
    require_row_contract()
    data = config(SIGN_DP)
    files = site_files(data, tmp_path)  # each SuperNode reads only its own files
    try:
        res = run_local(tomli_w.dumps(data), tmp_path / "run", tls=True, reproducible=True, node_config=files,
                        timeout=600, log=print)  # a hang guard: 3 min idle, over 5 under load
    finally:
        _stop_leftovers(tmp_path)

    sim, sim_rounds = simulate(data)
    assert res["summary"]["rounds_run"] == 3
    assert torch.equal(res["w"], sim.w)
    for mine, ref in zip(res["metrics"], sim_rounds):
        assert mine["answered"] == 3 and mine["step_secagg_survivors"] == 3 and mine["absent"] == []
        assert mine["up_bytes"] == ref["up_bytes"]  # the masked inputs the simulator counts
        assert mine["epsilon"] == ref["epsilon"]
        assert mine["accuracy"] == ref["accuracy"]
    want = held_out_counts(data, sim.w)
    last = res["metrics"][-1]
    assert last["fed_sites"] == 3 and last["fed_examples"] == want["n"]
    assert last["fed_accuracy"] == want["correct"] / want["n"]
    assert {p.name for p in (tmp_path / "run" / "out").iterdir()} == set(RUN_FILES)  # a simulated run's files, no more
    print(f"\nstartup {res['startup_seconds']:.1f} s, run {res['run_seconds']:.1f} s, "
          f"CPU {res['cpu_seconds']:.1f} s; per round: " + ", ".join(
              f"{m['round_seconds']:.1f} s / {m['flower_up_bytes'] // 3} B up / {m['flower_down_bytes'] // 3} B down "
              f"per client (simulator {r['up_bytes'] // 3} B)" for m, r in zip(res["metrics"], sim_rounds)))


# issue 41: adaptive clipping (C_t in the round plan, the counts inside the secure sum) and DP-FTRL's tree
# noise (each site continues its own earlier shares, kept in its SuperNode's state between rounds)
MECHANISMS = {
    "adaptive-clip": {"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": "adaptive", "clip_count_sigma": 1.0,
                                                       "clip_init": 0.05, "clip_lr": 0.5}},
    "tree-noise": {"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": 0.5, "correlated": "tree"}},
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_adaptive_clipping_and_correlated_noise_over_flower_match_the_simulator(tmp_path, name):
    """3 sites on a real SuperLink (TLS), 2 rounds: the model and ε equal the simulator's bit for bit."""
    require_row_contract()
    data = config(MECHANISMS[name], federation={"rounds": 2, "clients_per_round": 3})
    try:
        res = run_local(tomli_w.dumps(data), tmp_path / "run", tls=True, reproducible=True, timeout=600, log=print)
    finally:
        _stop_leftovers(tmp_path)
    sim, sim_rounds = simulate(data)
    assert res["summary"]["rounds_run"] == 2
    assert torch.equal(res["w"], sim.w)
    assert [m["epsilon"] for m in res["metrics"]] == [m["epsilon"] for m in sim_rounds]
    assert all(m["answered"] == 3 and "aborted" not in m for m in res["metrics"])


def _stop_leftovers(tmp_path) -> None:
    left = _leftovers(str(tmp_path))
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"processes left running after the run: {left}"


def _rounds(text: str) -> list[dict]:
    return [json.loads(line[len("dpfl-round "):]) for line in text.splitlines() if line.startswith("dpfl-round ")]


@pytest.mark.integration
def test_three_sites_survive_a_killed_site_and_it_rejoins(tmp_path):
    """TLS and node authentication; kill -9 of site 2's SuperNode once it has received round 2's
    training message (tolerate = 1): the run completes with the other two, ε is charged as in the
    simulator, and the site, restarted at once, answers again (greeted before a round whose keys
    were shared without it, it sits that one out). Its restart is refused until the SuperLink counts
    the killed node offline (Flower: 2 heartbeat intervals after its last heartbeat; dpfl-supernode
    declares 10 s, so up to 20 s after the kill; `start_node` starts it again until it is activated);
    10 rounds leave it time to come back and answer in a later one. Whether its round-2 masked input
    got out before the kill is a race: either it is in round 2's sum (then it is absent from round 3)
    or not."""
    require_row_contract()
    data = config(TOLERANT, federation={"rounds": 10, "clients_per_round": 3})
    app = write_app(tmp_path / "app", tomli_w.dumps(data), out_dir=str(tmp_path / "out"), reproducible=True,
                    timeout=300)
    done: dict[str, float] = {}
    try:
        with LocalFederation(tmp_path / "fed", 3, tls=True, auth=True, seeded=True) as fed:
            def watch(text: str) -> None:
                n = len(_rounds(text))
                site = (tmp_path / "fed" / "logs" / "supernode-2.log").read_text(errors="replace")
                if n >= 1 and "kill" not in done and site.count("Receiving: train.sa_train") >= 2:
                    fed.kill_node(2)  # it has received round 2's training message
                    done["kill"] = time.monotonic()
                    fed.start_node(2)  # started again until the SuperLink accepts it
                    done["restart"] = time.monotonic()

            text = fed.run(app, timeout=900, watch=watch)
    finally:
        _stop_leftovers(tmp_path)
    rounds = _rounds(text)
    _, ref = simulate(data)
    assert done["kill"] and "did not answer (dropped)" in text
    assert [m["round"] for m in rounds] == list(range(1, 11))
    assert all("aborted" not in m for m in rounds)
    lost = [m["round"] for m in rounds if m["absent"] == [2]]
    assert lost and lost[0] in (2, 3) and all(rounds[r - 1]["answered"] == 2 for r in lost)
    back = [m["round"] for m in rounds if m.get("rejoined") == [2]]
    up = done["restart"] - done["kill"]
    assert back and back[0] > lost[0], f"site 2 was up {up:.0f} s after the kill but never rejoined"
    assert back[0] < 10, f"site 2 was up {up:.0f} s after the kill, greeted before round {back[0]}: too late to answer"
    assert all(m["answered"] == 3 and m["absent"] == [] for m in rounds[back[0]:])  # from the round after
    assert [m["epsilon"] for m in rounds] == [m["epsilon"] for m in ref]
    summary = json.loads((tmp_path / "out" / SUMMARY).read_text())
    assert summary["rounds_run"] == 10 and summary["rounds_aborted"] == 0
    print(f"\nsite 2 up {up:.0f} s after the kill; rejoined before round {back[0]}; "
          f"round seconds: {[m['round_seconds'] for m in rounds]}")


@pytest.mark.integration
def test_a_killed_serverapp_resumes_and_ends_as_an_uninterrupted_run(tmp_path):
    """kill -9 of the ServerApp after round 2 of 4: `dpfl flower local --resume` (a new federation,
    the run's checkpoint) ends with the model and ε of the uninterrupted run (the simulator's)."""
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 4, "clients_per_round": 3}, run={"checkpoint_every": 1})
    work = tmp_path / "run"
    app = write_app(work / "app", tomli_w.dumps(data), out_dir=str(work / "out"), reproducible=True, timeout=300)
    try:
        with LocalFederation(work / "federation", 3, tls=True, seeded=True) as fed:
            def watch(text: str) -> None:
                if len(_rounds(text)) >= 2:
                    apps = fed.serverapps()
                    for pid in apps:
                        os.kill(pid, 9)
                    if apps:  # Flower would end `flwr run` once it misses the app's heartbeats (~1 min)
                        raise Killed

            with pytest.raises(Killed):
                fed.run(app, timeout=600, watch=watch)
        assert not (work / "out" / SUMMARY).exists()
        with pytest.raises(FederationError, match="resume it with"):
            raise_if_unfinished(work)
        res = run_local(None, work, tls=True, resume=True, timeout=600, log=print)
    finally:
        _stop_leftovers(tmp_path)
    sim, ref = simulate(data)
    assert torch.equal(res["w"], sim.w)
    assert res["summary"]["epsilon_final"] == ref[-1]["epsilon"]
    assert [m["round"] for m in res["metrics"]] == [1, 2, 3, 4]
    assert [m["accuracy"] for m in res["metrics"]] == [m["accuracy"] for m in ref]


@pytest.mark.integration
def test_a_restarted_superlink_keeps_its_sites(tmp_path):
    """kill -9 of the SuperLink, restarted on its database: the SuperNodes are not logged out (no
    registration again) and a run over all three sites completes. The SuperNodes are Flower's own
    flower-supernode here (node_poll=None), dpfl-supernode elsewhere."""
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 1, "clients_per_round": 3})
    app = write_app(tmp_path / "app", tomli_w.dumps(data), out_dir=str(tmp_path / "out"), reproducible=True,
                    timeout=300, node_wait=120)
    try:
        with LocalFederation(tmp_path / "fed", 3, tls=True, auth=True, seeded=True, node_poll=None) as fed:
            assert fed.supernode_command(0, 1)[0] == "flower-supernode"
            time.sleep(5)  # the SuperNodes have connected
            fed.restart_superlink()
            text = fed.run(app, timeout=600)
    finally:
        _stop_leftovers(tmp_path)
    (r1,) = _rounds(text)
    assert r1["answered"] == 3
    logs = "".join(f.read_text(errors="replace") for f in (tmp_path / "fed" / "logs").glob("supernode-*.log"))
    assert "Unauthorized" not in logs and "authentication failed" not in logs
