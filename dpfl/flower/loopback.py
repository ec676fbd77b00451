"""An in-process federation: the ClientApp's handlers called directly, one state per node.

Same messages, same handlers, same coordinator as a deployment, without processes or a
network: for tests and for checking a config before deploying it. Bytes are the serialized
message contents (a deployment adds Flower's message metadata and transport framing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import RecordDict

from dpfl.flower import wire
from dpfl.flower.client import HANDLERS
from dpfl.flower.coordinator import Quorum, Reply


class Loopback:
    """`Exchange` over in-process clients. `node_configs`: node id → its --node-config values."""

    def __init__(self, run_config: Mapping[str, Any], node_configs: Mapping[int, Mapping[str, Any]]):
        self.run_config = dict(run_config)
        self.node_configs = {int(n): dict(c) for n, c in node_configs.items()}
        self.states = {n: RecordDict() for n in self.node_configs}
        self.down: set[int] = set()  # nodes that are lost: they answer nothing
        self.calls: list[tuple[str, list[int]]] = []  # (message type, nodes asked), in order
        self.before: Callable[[str, int], None] | None = None  # called before each exchange (tests)
        self.slow: dict[int, int] = {}  # node → how many of its next replies come after their exchange ended
        self._late: list[tuple[int, Reply]] = []

    @property
    def nodes(self) -> list[int]:
        return sorted(self.node_configs)

    def connected(self) -> list[int]:
        return sorted(set(self.node_configs) - self.down)

    def kill(self, node: int) -> None:
        """The node is lost: it answers nothing from now on."""
        self.down.add(node)

    def restart(self, node: int, new_id: int | None = None) -> int:
        """The lost node comes back with an empty state (as a restarted SuperNode), under `new_id`
        if given (no node authentication: a new id) or its own. Returns its id."""
        config = self.node_configs.pop(node) if new_id is not None else self.node_configs[node]
        nid = node if new_id is None else new_id
        self.node_configs[nid] = config
        self.states.pop(node, None)
        self.states[nid] = RecordDict()
        self.down.discard(node)
        return nid

    def late_errors(self) -> dict[int, str]:
        """The nodes whose late replies (`slow`) since the last call were errors, with the error."""
        out = {node: rep.error for node, rep in self._late if rep.content is None}
        self._late.clear()
        return out

    def forget(self, node: int) -> None:
        """Drop `node`'s late replies not yet collected."""
        self._late = [(n, rep) for n, rep in self._late if n != node]

    def __call__(self, kind: str, contents: dict[int, RecordDict], timeout: float,
                 quorum: Quorum | None = None) -> dict[int, Reply]:
        out = {}
        self.calls.append((kind, sorted(contents)))
        if self.before is not None:
            self.before(kind, len(self.calls))
        for node, content in contents.items():
            if node in self.down or node not in self.node_configs:
                continue
            down = wire.content_nbytes(content)
            try:
                reply = HANDLERS[kind](content, self.states[node], self.node_configs[node], self.run_config)
            except Exception as e:  # noqa: BLE001  (a client error is a reply with an error, as over Flower)
                out[node] = Reply(None, f"{type(e).__name__}: {e}", 0, down)
            else:
                out[node] = Reply(reply, None, wire.content_nbytes(reply), down)
            if self.slow.get(node, 0) > 0:  # it comes after the exchange has ended
                self.slow[node] -= 1
                self._late.append((node, out.pop(node)))
        return out
