"""`dpfl bench flower`: one run over a local Flower federation next to the simulator's run of
the same config and seed — round latency, bytes per client, and whether the models agree."""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from dpfl.flower.launcher import LOCAL_POLL, launcher_of

STARTED_BY = {"fork": "dpfl's flwr-clientapp, each a fork of dpfl's fork server (--launcher fork)",
              "dpfl": "dpfl's flwr-clientapp, a new Python each (--launcher dpfl)",
              "flower": "Flower's flwr-clientapp (--launcher flower)"}


def compare(config_text: str, workdir: str | None = None, *, tls: bool = True, auth: bool = False,
            timeout: float = 1800.0, evaluation: str = "both", launcher: str | None = None, node_poll: float | None = LOCAL_POLL,
            log=print) -> dict[str, Any]:
    """Run `config_text` over a local federation (seeded: comparable, not private) and in the
    simulator; returns both runs' per-round numbers and whether the final models are equal."""
    from dpfl.engine.simulator import simulate
    from dpfl.flower.client import parse_run_config
    from dpfl.flower.local import run_local
    from dpfl.run.state import Run

    cfg = parse_run_config(config_text)
    work = workdir or tempfile.mkdtemp(prefix="dpfl-flower-")
    res = run_local(config_text, work, tls=tls, auth=auth, reproducible=True, timeout=timeout, evaluation=evaluation,
                    launcher=launcher, node_poll=node_poll, log=log)
    run = Run(cfg, None, log=lambda s: None)
    sim_rounds: list[dict] = []
    simulate(run, sim_rounds.append)
    res["simulator"] = sim_rounds
    res["equal"] = bool(torch.equal(res["w"], run.w.cpu()))
    res["max_abs_diff"] = float((res["w"] - run.w.cpu()).abs().max())
    res["workdir"] = str(work)
    return res


def table(res: dict[str, Any], console: Console | None = None) -> Table:
    """Per round: wall seconds and bytes per client, Flower next to the simulator."""
    t = Table(title="Flower deployment vs simulator (bytes per answering client)")
    for col in ("round", "Flower s", "sim s", "sim up B", "payload up B", "Flower up B", "Flower down B",
                "accuracy", "fed accuracy", "ε", "record ε (max site)"):
        t.add_column(col, justify="right", no_wrap=True)
    for m, s in zip(res["metrics"], res["simulator"]):
        k = max(1, m.get("answered", 0))
        eps = m.get("epsilon")
        t.add_row(str(m["round"]), f"{m['round_seconds']:.2f}", f"{s['round_seconds']:.3f}",
                  f"{s['up_bytes'] / k:,.0f}", f"{m.get('up_bytes', 0) / k:,.0f}",
                  f"{m['flower_up_bytes'] / k:,.0f}", f"{m['flower_down_bytes'] / k:,.0f}",
                  f"{m.get('accuracy', float('nan')):.4f}", f"{m.get('fed_accuracy', float('nan')):.4f}",
                  "-" if eps is None else f"{eps:.3f}",
                  "-" if m.get("record_epsilon_max") is None else f"{m['record_epsilon_max']:.3f}")
    (console or Console(width=160)).print(t)
    return t


PHASES = ("statistic", "train", "sa_keys", "sa_train", "sa_consistency", "sa_unmask", "evaluate")


def phase_split(metrics: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean seconds per round of each exchange, over all the rounds (an exchange some rounds lack,
    such as the first round's key sharing, adds its share): its wall time, and the slowest
    ClientApp's launch (Flower: process start, Flower's imports, FAB install; with --launcher fork,
    from the fork on: the script that asked for it is in `flower`), import (dpfl's client module)
    and work (the handler, lazy imports included); `flower` = wall − (launch + import + work):
    polling and transport, Flower's too; `rounds`: in how many rounds it ran."""
    out: dict[str, dict[str, float]] = {}
    for ph in PHASES:
        rows = [m for m in metrics if f"flower_{ph}_wall_seconds" in m]
        if rows:
            mean = {part: sum(m[f"flower_{ph}_{part}_seconds"] for m in rows) / len(metrics)
                    for part in ("wall", "launch", "import", "work")}
            mean["flower"] = max(0.0, mean["wall"] - mean["launch"] - mean["import"] - mean["work"])
            mean["rounds"] = len(rows)
            out[ph] = mean
    return out


def split_table(res: dict[str, Any], console: Console | None = None) -> dict[str, float]:
    """The per-phase split, and per round: Flower's fixed cost (launch + poll/transport), dpfl's
    own (import + work), the round's wall time and its ratio to the simulator's; `steady_*`: the
    rounds after the first (whose keys were shared with the previous round's unmasking)."""
    split = phase_split(res["metrics"])
    t = Table(title="Where a deployed round's time goes (mean s per round; slowest ClientApp of each exchange)")
    for col in ("exchange", "rounds", "wall", "Flower: launch", "Flower: poll + transport", "dpfl: import",
                "dpfl: work"):
        t.add_column(col, justify="right", no_wrap=True)
    for ph, v in split.items():
        t.add_row(ph, str(v["rounds"]), *(f"{v[k]:.2f}" for k in ("wall", "launch", "flower", "import", "work")))
    (console or Console(width=140)).print(t)
    rounds = res["metrics"]
    wall = sum(m["round_seconds"] for m in rounds) / len(rounds)
    sim = sum(m["round_seconds"] for m in res["simulator"]) / len(res["simulator"])
    later = rounds[1:] or rounds
    steady = phase_split(later)
    return {"round_seconds": wall, "simulator_round_seconds": sim, "ratio": wall / sim,
            "flower_fixed_seconds": sum(v["launch"] + v["flower"] for v in split.values()),
            "dpfl_seconds": sum(v["import"] + v["work"] for v in split.values()),
            "exchanges_per_round": sum(v["rounds"] for v in split.values()) / len(rounds),
            "slowest_round_seconds": max(m["round_seconds"] for m in rounds),
            "slowest_round": max(rounds, key=lambda m: m["round_seconds"])["round"],
            "steady_round_seconds": sum(m["round_seconds"] for m in later) / len(later),
            "steady_flower_fixed_seconds": sum(v["launch"] + v["flower"] for v in steady.values()),
            "steady_dpfl_seconds": sum(v["import"] + v["work"] for v in steady.values()),
            "steady_exchanges_per_round": sum(v["rounds"] for v in steady.values()) / len(later)}


def run_bench(config_text: str, workdir: str | None = None, tls: bool = True, evaluation: str = "both",
              launcher: str | None = None, node_poll: float | None = LOCAL_POLL, console: Console | None = None) -> dict[str, Any]:
    """Measure a deployed run of `config_text` (seeded) against the simulator and print the tables.
    launcher: what starts the ClientApps (fork, dpfl or flower: `dpfl.flower.launcher.LAUNCHERS`);
    node_poll: the SuperNodes' idle poll in s (dpfl-supernode), None: Flower's flower-supernode (3 s)."""
    console = console or Console(width=160)
    res = compare(config_text, workdir, tls=tls, evaluation=evaluation, launcher=launcher, node_poll=node_poll,
                  log=lambda s: console.print(s, markup=False, highlight=False, soft_wrap=True))  # sites' words
    res["launcher"] = launcher = launcher_of(launcher, node_poll)
    res["node_poll"] = node_poll
    table(res, console)
    s = split_table(res, console)
    res["split"] = s
    console.print(f"per round: {s['round_seconds']:.2f} s deployed, {s['simulator_round_seconds']:.3f} s in the "
                  f"simulator ({s['ratio']:.0f}x), slowest {s['slowest_round_seconds']:.2f} s (round {s['slowest_round']}), "
                  f"{s['exchanges_per_round']:.2f} exchanges; Flower's fixed cost "
                  f"{s['flower_fixed_seconds']:.2f} s (launches, polls, transport), dpfl's own {s['dpfl_seconds']:.2f} s "
                  "(imports, work)")
    console.print(f"rounds 2 on: {s['steady_round_seconds']:.2f} s per round, {s['steady_exchanges_per_round']:.2f} "
                  f"exchanges; Flower's fixed cost {s['steady_flower_fixed_seconds']:.2f} s, dpfl's own "
                  f"{s['steady_dpfl_seconds']:.2f} s; round − Flower's fixed cost = "
                  f"{s['steady_round_seconds'] - s['steady_flower_fixed_seconds']:.2f} s")
    console.print("ClientApp processes started by " + STARTED_BY[launcher]
                  + "; SuperNodes: " + (f"dpfl-supernode, idle poll {node_poll:g} s" if node_poll is not None
                                        else "Flower's flower-supernode, idle poll 3 s (--node-poll 3)"))
    console.print(f"startup {res['startup_seconds']:.1f} s, run {res['run_seconds']:.1f} s, CPU of all "
                  f"components {res['cpu_seconds']:.1f} s; final models equal: {res['equal']} "
                  f"(max |Δw| = {res['max_abs_diff']:.3g}); logs: {res['logs']}")
    return {k: v for k, v in res.items() if k != "w"}


def idle_cpu(node_polls: list[float | None], nodes: int = 3, settle: float = 10.0, seconds: float = 20.0,
             log=print) -> list[dict[str, Any]]:
    """CPU an idle local federation (TLS, no run) uses, per SuperNode poll (None: Flower's own
    flower-supernode): the share of one core over `seconds`, after `settle` s, of all its processes
    (SuperLink, SuperNodes, their SuperExecs) and of the SuperLink's alone."""
    import time as clock

    from dpfl.flower.local import LocalFederation, cpu_seconds, descendants

    out = []
    for poll in node_polls:
        with tempfile.TemporaryDirectory(prefix="dpfl-idle-") as work:
            fed = LocalFederation(work, nodes, tls=True, node_poll=poll, log=lambda s: None)
            with fed:
                clock.sleep(settle)
                pids = descendants([p.pid for p in fed.procs])
                link = descendants([fed.link.pid])
                c0, l0, t0 = cpu_seconds(pids), cpu_seconds(link), clock.perf_counter()
                clock.sleep(seconds)
                dt = clock.perf_counter() - t0
                row = {"node_poll": poll, "processes": len(pids), "cpu_share": (cpu_seconds(pids) - c0) / dt,
                       "superlink_cpu_share": (cpu_seconds(link) - l0) / dt, "seconds": dt}
        log(f"node poll {'3 (Flower)' if poll is None else f'{poll:g}'} s: idle CPU {100 * row['cpu_share']:.1f} % of one "
            f"core ({row['processes']} processes), the SuperLink's {100 * row['superlink_cpu_share']:.1f} %")
        out.append(row)
    return out
