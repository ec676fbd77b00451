"""The ServerApp: a `Coordinator` over Flower's Grid.

Run config keys (the `[tool.flwr.app.config]` table `dpfl flower app` writes; override them
with `flwr run --run-config 'key=value'`):

    dpfl-config    the dpfl run config, as TOML text (the same file `dpfl run` takes)
    out-dir        where the ServerApp writes metrics.jsonl, model.pt, summary.json ("" = nowhere)
    reproducible   draw server randomness (selection, ties, central noise, the SecAgg+ graph) from
                   the config seed, as the simulator does; default false (OS randomness)
    timeout        seconds to wait for each phase's replies (a client that misses it has dropped)
    node-wait      seconds to wait for data.n_clients SuperNodes to connect
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpfl.errors import ConfigError
from dpfl.flower.client import CONFIG_KEY, parse_run_config, run_config_text
from dpfl.flower.coordinator import Coordinator, Reply
from dpfl.flower.wire import content_nbytes

RUN_CONFIG_DEFAULTS: dict[str, Any] = {CONFIG_KEY: "", "out-dir": "", "reproducible": False, "timeout": 300.0,
                                       "node-wait": 120.0}


class GridExchange:
    """`Exchange` over Flower: one message per node, replies collected until `timeout`
    (polled every `poll` seconds: `Grid.send_and_receive` waits 3 s between pulls)."""

    def __init__(self, grid: Grid, poll: float = 0.2):
        self.grid, self.poll = grid, poll

    def __call__(self, kind: str, contents: dict[int, RecordDict], timeout: float) -> dict[int, Reply]:
        msgs = [Message(content, dst_node_id=node, message_type=kind) for node, content in contents.items()]
        down = {m.metadata.dst_node_id: content_nbytes(m) for m in msgs}
        pending = set(self.grid.push_messages(msgs))
        out: dict[int, Reply] = {}
        deadline = time.monotonic() + timeout
        while pending:
            for rep in self.grid.pull_messages(list(pending)):
                pending.discard(rep.metadata.reply_to_message_id)
                node = rep.metadata.src_node_id
                if node not in down:
                    continue
                if rep.has_error():
                    out[node] = Reply(None, rep.error.reason, 0, down[node])
                else:
                    out[node] = Reply(rep.content, None, content_nbytes(rep), down[node])
            if pending and time.monotonic() > deadline:
                break
            if pending:
                time.sleep(self.poll)
        return out


def wait_for_nodes(grid: Grid, n: int, timeout: float) -> list[int]:
    """The ids of n connected SuperNodes (the first n, sorted), waiting up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n:
            return nodes[:n]
        if time.monotonic() > deadline:
            raise ConfigError(f"only {len(nodes)} of data.n_clients = {n} SuperNodes connected within {timeout:.0f} s")
        time.sleep(0.5)


def settings(run_config: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(run_config) - set(RUN_CONFIG_DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown run config keys {unknown}; allowed: {', '.join(RUN_CONFIG_DEFAULTS)}")
    s = {**RUN_CONFIG_DEFAULTS, **dict(run_config)}
    if not isinstance(s["reproducible"], bool):
        raise ConfigError(f"run config reproducible must be true or false, got {s['reproducible']!r}")
    for key in ("timeout", "node-wait"):
        if isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or s[key] <= 0:
            raise ConfigError(f"run config {key} must be a positive number of seconds, got {s[key]!r}")
    return s


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    s = settings(context.run_config)
    cfg = parse_run_config(run_config_text(s))
    nodes = wait_for_nodes(grid, cfg.data.n_clients, float(s["node-wait"]))
    co = Coordinator(cfg, GridExchange(grid), nodes, out_dir=s["out-dir"] or None, reproducible=s["reproducible"],
                     timeout=float(s["timeout"]), log=lambda line: print(line, flush=True))
    summary = co.run(on_round=lambda m: print("dpfl-round " + json.dumps(m), flush=True))
    print("dpfl-summary " + json.dumps(summary), flush=True)
