"""An in-process federation: the ClientApp's handlers called directly, one state per node.

Same messages, same handlers, same coordinator as a deployment, without processes or a
network: for tests and for checking a config before deploying it. Bytes are the serialized
message contents (a deployment adds Flower's message metadata and transport framing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import RecordDict

from dpfl.flower import wire
from dpfl.flower.client import HANDLERS
from dpfl.flower.coordinator import Reply


class Loopback:
    """`Exchange` over in-process clients. `node_configs`: node id → its --node-config values."""

    def __init__(self, run_config: Mapping[str, Any], node_configs: Mapping[int, Mapping[str, Any]]):
        self.run_config = dict(run_config)
        self.node_configs = {int(n): dict(c) for n, c in node_configs.items()}
        self.states = {n: RecordDict() for n in self.node_configs}

    @property
    def nodes(self) -> list[int]:
        return sorted(self.node_configs)

    def __call__(self, kind: str, contents: dict[int, RecordDict], timeout: float) -> dict[int, Reply]:
        out = {}
        for node, content in contents.items():
            down = wire.content_nbytes(content)
            try:
                reply = HANDLERS[kind](content, self.states[node], self.node_configs[node], self.run_config)
            except Exception as e:  # noqa: BLE001  (a client error is a reply with an error, as over Flower)
                out[node] = Reply(None, f"{type(e).__name__}: {e}", 0, down)
            else:
                out[node] = Reply(reply, None, wire.content_nbytes(reply), down)
        return out
