"""The thesis DP configs and the committed DP records keep the thesis's accounting: Poisson sampling
with q = C, stated in the config, and the ε each record's metrics report is what that gives."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dpfl.config import load_config
from dpfl.experiments.report import load_run
from dpfl.experiments.reproduce import configs_root
from dpfl.flower.node import build_run_scheme
from dpfl.models import build_model
from dpfl.privacy import Ledger

RECORDS = Path(__file__).resolve().parents[2] / "records"


def _dp(path):
    cfg = load_config(path)
    return cfg if cfg.scheme.name.endswith("-dp") else None


def test_thesis_dp_configs_state_the_poisson_assumption():
    rows = [p for p in sorted(configs_root().glob("table-*/*.toml")) if _dp(p)]
    assert len(rows) > 30
    for p in rows:
        cfg = _dp(p)
        assert cfg.federation.sampling == "fixed" and cfg.cohort_size() < cfg.data.n_clients, p
        assert cfg.privacy.sampling_assumption == "poisson", f"{p}: the thesis assumes Poisson sampling"
        assert cfg.accounted_sampling() == "poisson"


def _dp_records():
    return sorted(p.parent for p in RECORDS.glob("*/*/config.toml") if _dp(p))


@pytest.mark.parametrize("run_dir", _dp_records(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_dp_record_epsilon_is_the_poisson_accounting(run_dir):
    """Rebuild the record's scheme from its config (σ as the run calibrated it) and account its rounds:
    the last metrics line's ε is T Poisson-sampled rounds (not sampling without replacement)."""
    cfg = load_config(run_dir / "config.toml")
    assert cfg.accounted_sampling() == "poisson"
    if cfg.privacy.accountant == "pld":
        pytest.skip("σ calibration under pld takes ~10 s; the config check above covers the assumption")
    _, metrics = load_run(run_dir)
    assert not any("aborted" in m for m in metrics) and cfg.federation.dropout == 0
    model = build_model(cfg.model.name, seed=0, **cfg.model.options)
    n = sum(p.numel() for p in model.parameters())
    scheme = build_run_scheme(cfg, n)
    assert scheme.privacy_sampling == "poisson"
    ctx = SimpleNamespace(n_params=n, cohort=np.arange(cfg.cohort_size()), round=1)
    (event,) = scheme.steps[-1].privacy_events(ctx)
    led = Ledger(cfg.privacy.accountant)
    led.add(event, count=len(metrics))
    assert metrics[-1]["epsilon"] == pytest.approx(led.epsilon(cfg.privacy.delta), rel=1e-6)
    assert metrics[-1].get("epsilon_sampling", "poisson") == "poisson"
