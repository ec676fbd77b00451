"""The ServerApp: a `Coordinator` over Flower's Grid.

Run config keys (the `[tool.flwr.app.config]` table `dpfl flower app` writes; override them
with `flwr run --run-config 'key=value'`):

    dpfl-config    the dpfl run config, as TOML text (the same file `dpfl run` takes)
    out-dir        where the ServerApp writes the run directory, as `dpfl run` does: config.toml,
                   metrics.jsonl, checkpoint.pt (the model: "w"), summary.json ("" = nowhere)
    reproducible   draw server randomness (selection, ties, central noise, the SecAgg+ graph) from
                   the config seed, as the simulator does; default false (OS randomness)
    timeout        seconds to wait for each phase's replies (a client that misses it has dropped)
    node-wait      seconds to wait for data.n_clients SuperNodes to connect
    evaluation     server | federated | both (default): the global model on the server's test data,
                   on every site's held-out data (its test-path file) added up, or both; with
                   federated the server loads no dataset (a scheme that needs data there is refused)
    peers          the operator-approved site keys (peers.toml, on the SuperLink machine): a site must
                   sign with the key listed for its partition id, or it is refused ("" = no check)
    resume         continue the run in out-dir from its checkpoint.pt (model, scheme state, privacy
                   ledger: the ε already spent is kept); default false
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpfl.errors import ConfigError, DpflError
from dpfl.flower import certs, retries
from dpfl.flower.client import CONFIG_KEY, parse_run_config, run_config_text
from dpfl.flower.coordinator import EVALUATION, Coordinator, Quorum, Reply, quorum_open
from dpfl.flower.progress import ROUND, round_line
from dpfl.flower.wire import content_nbytes

RUN_CONFIG_DEFAULTS: dict[str, Any] = {CONFIG_KEY: "", "out-dir": "", "reproducible": False, "timeout": 300.0,
                                       "node-wait": 120.0, "resume": False, "evaluation": "both", "peers": ""}


class GridExchange:
    """`Exchange` over Flower: one message per node, replies matched to the message they answer
    (`reply_to_message_id`: the SuperLink's own "node unavailable" replies come from node 1) and
    collected until `timeout`, or, once the `quorum` is met (`quorum_open`: replies with content
    count) or can no longer be, for a grace period as long again as that took (at least `GRACE_MIN`
    s): a lost site costs seconds, not the timeout.
    Pulled every `poll` s (`Grid.send_and_receive` waits 3 s between pulls). Messages still
    unanswered when their exchange ends are kept (the newest `LATE_MAX`) for `late_errors`."""

    GRACE_MIN = 5.0
    LATE_MAX = 10_000

    def __init__(self, grid: Grid, poll: float = 0.1):
        self.grid, self.poll = grid, poll
        self.late: dict[str, int] = {}  # message id → its node, for messages unanswered when their exchange ended

    def late_errors(self) -> dict[int, str]:
        """The nodes that have since answered such a message with an error of their own (not the
        SuperLink's "node unavailable"), with the error; every reply that came is forgotten."""
        out: dict[int, str] = {}
        if not self.late:
            return out
        for rep in self.grid.pull_messages(list(self.late)):
            node = self.late.pop(rep.metadata.reply_to_message_id, None)
            if node is not None and rep.has_error() and rep.metadata.src_node_id == node:
                out[node] = f"{rep.error.reason} (Flower error code {rep.error.code})"
        return out

    def forget(self, node: int) -> None:
        """Stop looking for `node`'s replies to messages sent so far (it was greeted again)."""
        self.late = {mid: n for mid, n in self.late.items() if n != node}

    def connected(self) -> list[int]:
        return sorted(int(n) for n in self.grid.get_node_ids())

    def __call__(self, kind: str, contents: dict[int, RecordDict], timeout: float,
                 quorum: Quorum | None = None) -> dict[int, Reply]:
        msgs = [Message(content, dst_node_id=node, message_type=kind) for node, content in contents.items()]
        down = {m.metadata.dst_node_id: content_nbytes(m) for m in msgs}
        ids = list(self.grid.push_messages(msgs))
        node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, msgs)}
        pending = set(ids)
        out: dict[int, Reply] = {}
        start = time.monotonic()
        deadline = start + timeout
        while pending:
            for rep in self.grid.pull_messages(list(pending)):
                mid = rep.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                node = node_of[mid]
                if rep.has_error():
                    out[node] = Reply(None, f"{rep.error.reason} (Flower error code {rep.error.code})", 0, down[node])
                else:
                    out[node] = Reply(rep.content, None, content_nbytes(rep), down[node])
            now = time.monotonic()
            if quorum is not None and pending and not quorum_open(
                    quorum, contents, [n for n, r in out.items() if r.content is not None], [node_of[m] for m in pending]):
                deadline = min(deadline, now + max(self.GRACE_MIN, now - start))
                quorum = None  # the grace is set once, when the quorum is reached
            if not pending or now > deadline:
                break
            time.sleep(self.poll)
        self.late.update((mid, node_of[mid]) for mid in pending)
        for mid in list(self.late)[: max(0, len(self.late) - self.LATE_MAX)]:  # the oldest first
            del self.late[mid]
        return out


def wait_for_nodes(grid: Grid, n: int, timeout: float) -> list[int]:
    """The ids of the connected SuperNodes once there are at least n (all of them, sorted: the hello
    finds which hold the clients), waiting up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n:
            return nodes
        if time.monotonic() > deadline:
            raise ConfigError(f"only {len(nodes)} of data.n_clients = {n} SuperNodes connected within {timeout:.0f} s")
        time.sleep(0.5)


def settings(run_config: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(run_config) - set(RUN_CONFIG_DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown run config keys {unknown}; allowed: {', '.join(RUN_CONFIG_DEFAULTS)}")
    s = {**RUN_CONFIG_DEFAULTS, **dict(run_config)}
    for key in ("reproducible", "resume"):
        if not isinstance(s[key], bool):
            raise ConfigError(f"run config {key} must be true or false, got {s[key]!r}")
    if not isinstance(s["peers"], str):
        raise ConfigError(f"run config peers must be the path of a peers.toml, got {s['peers']!r}")
    if s["evaluation"] not in EVALUATION:
        raise ConfigError(f"run config evaluation must be one of {', '.join(EVALUATION)}, got {s['evaluation']!r}")
    if s["resume"] and not s["out-dir"]:
        raise ConfigError("run config resume = true needs out-dir: the run directory to continue")
    for key in ("timeout", "node-wait"):
        if isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or s[key] <= 0:
            raise ConfigError(f"run config {key} must be a positive number of seconds, got {s[key]!r}")
    return s


def _stamped(line: str) -> None:
    """A log line with the UTC time in front (Flower's own log lines carry none); one line, whatever
    it quotes (a site's error text cannot start a line of its own)."""
    print(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + " ".join(str(line).split()), flush=True)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        _main(grid, context)
    except DpflError as e:  # one line in the stream first; raised on, Flower marks the run failed
        _stamped(f"dpfl-error: {e}")
        raise


def patient(grid: Grid) -> None:
    """From here on, the grid's requests to the SuperLink (its log uploads and heartbeat included,
    which share them) and this process's heartbeat kept going through the SuperLink's server errors
    (retries.py): with Flower's own, an HTTP 500 ends the run after its last finished round."""
    try:
        retries.check()
        from flwr.supercore.retry import RetryInvoker

        inv = getattr(grid, "_retry_invoker", None)
        if not isinstance(inv, RetryInvoker):
            raise retries.FlowerChanged("this Flower's grid has no HTTP retries dpfl knows")
    except retries.FlowerChanged as e:
        _stamped(f"note: {e}: a server error from the SuperLink ends this run, as in Flower (resume it)")
        return
    retries.patient(inv)
    retries.steady_heartbeats()


def _main(grid: Grid, context: Context) -> None:
    s = settings(context.run_config)
    cfg = parse_run_config(run_config_text(s))
    patient(grid)
    nodes = wait_for_nodes(grid, cfg.data.n_clients, float(s["node-wait"]))
    co = Coordinator(cfg, GridExchange(grid), nodes, out_dir=s["out-dir"] or None, reproducible=s["reproducible"],
                     timeout=float(s["timeout"]), log=_stamped, resume=s["resume"],
                     evaluation=s["evaluation"], peers=certs.read_peers(s["peers"]) if s["peers"] else None,
                     config_text=run_config_text(s))
    def on_round(m: dict) -> None:
        print(ROUND + json.dumps(m), flush=True)
        try:
            _stamped(round_line(m))
        except Exception as e:  # noqa: BLE001  (a line to read never ends a run)
            _stamped(f"round {m.get('round')}: (its line could not be written: {e})")

    summary = co.run(on_round=on_round)
    print("dpfl-summary " + json.dumps(summary), flush=True)
    if summary["rounds_aborted"] and summary["stopped"] and summary["stopped"].startswith("all "):
        raise SystemExit(f"dpfl-error: {summary['stopped']}")
