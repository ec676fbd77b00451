"""A deployed run's rounds for people: the ServerApp streams each round's metrics as a `dpfl-round`
JSON line (for programs) and as one line to read; `dpfl flower local` prints the latter as they come."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dpfl.compression.costs import human_bytes

ROUND = "dpfl-round "


def round_line(m: dict[str, Any]) -> str:
    """One round's metrics as a line (the whole record is in the run's metrics.jsonl)."""
    parts = [f"round {m.get('round')}: {m.get('answered', 0)}/{m.get('selected', 0)} answered"]
    for key, word in (("absent", "absent"), ("rejoined", "rejoined")):
        if m.get(key):
            parts.append(f"{word} {', '.join(map(str, m[key]))}")
    if m.get("diverged"):
        parts.append(f"{m['diverged']} diverged")
    if m.get("aborted"):
        parts.append(f"aborted: {m['aborted']}")
    if m.get("accuracy") is not None:
        parts.append(f"accuracy {m['accuracy']:.4f}")
    if m.get("fed_accuracy") is not None:
        parts.append(f"federated accuracy {m['fed_accuracy']:.4f} over {m.get('fed_examples') or 0:,} examples")
    if m.get("epsilon") is not None:
        parts.append(f"ε {m['epsilon']:.3f}")
    if m.get("record_epsilon_max") is not None:
        parts.append(f"record ε {m['record_epsilon_max']:.3f} (max site)")
    parts.append(f"upstream/client {human_bytes(m.get('cum_up_bytes_per_client'))}")
    if m.get("round_seconds") is not None:
        parts.append(f"{m['round_seconds']:.1f} s")
    return ", ".join(parts)


def rounds_in(text: str) -> list[dict[str, Any]]:
    """The rounds a streamed log holds so far (a line still being written is left for later)."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith(ROUND) and line.endswith("\n"):
            try:
                m = json.loads(line[len(ROUND):])
            except json.JSONDecodeError:
                continue
            if isinstance(m, dict):
                out.append(m)
    return out


class Echo:
    """`watch` for a run: says each round once, as its line arrives in the stream. Display only: if
    saying fails (a closed pipe), it stops saying and the run goes on."""

    def __init__(self, say: Callable[[str], None]):
        self.say: Callable[[str], None] | None = say
        self.at, self.said = 0, set()

    def __call__(self, text: str) -> None:
        end = text.rfind("\n", self.at) + 1  # only whole lines, each read once
        if end <= self.at:
            return
        for m in rounds_in(text[self.at:end]):
            if m.get("round") in self.said or self.say is None:
                continue
            self.said.add(m.get("round"))
            try:
                self.say(round_line(m))
            except Exception:  # noqa: BLE001
                self.say = None
        self.at = end
