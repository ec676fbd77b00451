"""A ClientApp process serves one message: the phases that do not train (the secure sum's key
sharing, consistency check and unmasking, the last carrying the next round's key sharing) must
import neither torch nor scipy. Each phase's handler is run in a fresh
interpreter on the message and node state a real round gave it, and the modules it loaded are
listed. (Times: `dpfl bench flower`; no timed test here.)"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from flower_helpers import SIGN_DP, config, loopback, require_row_contract

from dpfl.config import load_config
from dpfl.flower import wire
from dpfl.flower.coordinator import Coordinator
from dpfl.flower.loopback import Loopback

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "scipy", "sklearn", "matplotlib", "dpfl.engine", "dpfl.run", "dpfl.training", "dpfl.schemes",
         "dpfl.models", "dpfl.data")

_SCRIPT = """
import json, pickle, sys
from dpfl.flower.client import HANDLERS
kind, content, state, node_config, run_config = pickle.load(open(sys.argv[1], "rb"))
HANDLERS[kind](content, state, node_config, run_config)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "scipy", "sklearn", "matplotlib")
                        or m.startswith(("dpfl.engine", "dpfl.run", "dpfl.training", "dpfl.schemes",
                                                      "dpfl.models", "dpfl.data")))))
"""


class Capturing(Loopback):
    """Keeps, for node 100, each message of round 1 with the node's state just before it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: dict[str, bytes] = {}

    def __call__(self, kind, contents, timeout, quorum=None):
        if 100 in contents and kind not in self.seen:
            self.seen[kind] = pickle.dumps((kind, contents[100], self.states[100], self.node_configs[100],
                                            self.run_config))
        return super().__call__(kind, contents, timeout, quorum)


def _modules(tmp_path: Path, blob: bytes) -> list[str]:
    f = tmp_path / "message.pkl"  # the test's own pickle, read by the test's own child
    f.write_bytes(blob)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, str(f)], cwd=ROOT, capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def round_messages() -> dict[str, bytes]:
    require_row_contract()
    co, lb = loopback(config(SIGN_DP, federation={"rounds": 2, "clients_per_round": 3}), cls=Capturing)
    co.run()
    assert set(lb.seen) == {"query", "train.sa_keys", "train.sa_train", "train.sa_unmask", "evaluate"}
    assert wire.NEXT_PLAN in pickle.loads(lb.seen["train.sa_unmask"])[1]  # round 1's: with round 2's key sharing
    return lb.seen


@pytest.fixture(scope="module")
def signed_messages(tmp_path_factory) -> dict[str, bytes]:
    """The same for a signed round (node keys and peers.toml: the consistency exchange too)."""
    from dpfl.flower import certs

    require_row_contract()
    pki = tmp_path_factory.mktemp("certs")
    certs.make_node_keys(pki, 3)
    data = config(SIGN_DP, federation={"rounds": 2, "clients_per_round": 3})
    lb = Capturing({"dpfl-config": tomli_w.dumps(data)},
                   {100 + i: {"partition-id": i, "num-partitions": 3, "dpfl-seeded": True,
                              "signing-key": str(pki / f"node-{i}"), "peers": str(pki / certs.PEERS)} for i in range(3)})
    Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lambda s: None).run()
    assert "train.sa_consistency" in lb.seen
    return lb.seen


@pytest.mark.parametrize("kind", ["train.sa_keys", "train.sa_unmask"])
def test_the_masking_and_unmasking_phases_load_no_training_code(tmp_path, round_messages, kind):
    assert _modules(tmp_path, round_messages[kind]) == []


@pytest.mark.parametrize("kind", ["train.sa_keys", "train.sa_consistency", "train.sa_unmask"])
def test_the_signed_phases_that_do_not_train_load_no_training_code(tmp_path, signed_messages, kind):
    assert _modules(tmp_path, signed_messages[kind]) == []


def test_the_training_phase_loads_it(tmp_path, round_messages):
    """The check above can fail: the phase that trains does import torch and the schemes."""
    loaded = _modules(tmp_path, round_messages["train.sa_train"])
    assert "torch" in loaded and "dpfl.schemes.round" in loaded
