"""The Flower App directory `flwr run` takes: a pyproject.toml naming dpfl's ServerApp and
ClientApp and carrying the dpfl config as run config. dpfl itself must be installed where the
SuperLink and the SuperNodes run (runtime dependency installation stays off)."""

from __future__ import annotations

from pathlib import Path

import tomli_w

import dpfl
from dpfl.flower.client import CONFIG_KEY, parse_run_config
from dpfl.flower.server import settings

PYPROJECT = "pyproject.toml"


def app_pyproject(config_text: str, out_dir: str = "", reproducible: bool = False, timeout: float = 300.0,
                  node_wait: float = 120.0, resume: bool = False, evaluation: str = "both", peers: str = "") -> str:
    """pyproject.toml text for a Flower App running `config_text` (validated first)."""
    parse_run_config(config_text)
    run_config = settings({CONFIG_KEY: config_text, "out-dir": str(out_dir), "reproducible": reproducible,
                           "timeout": float(timeout), "node-wait": float(node_wait), "resume": resume,
                           "evaluation": evaluation, "peers": str(peers)})
    doc = {
        "project": {"name": "dpfl-flower-app", "version": dpfl.__version__,
                    "description": "a dpfl run on Flower's deployment runtime", "license": "Apache-2.0",
                    "dependencies": [f"dpfl[flower]=={dpfl.__version__}"]},
        "tool": {"flwr": {"app": {"publisher": "dpfl",
                                  "components": {"serverapp": "dpfl.flower.server:app",
                                                 "clientapp": "dpfl.flower.client:app"},
                                  "config": run_config}}},
    }
    return tomli_w.dumps(doc, multiline_strings=True)


def write_app(app_dir: str | Path, config_text: str, **run_config) -> Path:
    """Write the Flower App directory (just its pyproject.toml); returns the directory."""
    d = Path(app_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / PYPROJECT).write_text(app_pyproject(config_text, **run_config))
    return d
