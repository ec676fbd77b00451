"""Deliberately broken DP code must be caught by the audit, the honest code never.

Each mutation is a test-only monkeypatch of the real step (no production flag): the ledger still
accounts the honest σ, so the printed ε is unchanged while the model gets less privacy. The setting
(1,000 canary clients, FL-STD-DP at ε = 2, q = 1, 3 rounds, Steinke et al.'s bound at 95%) leaves a
margin on both sides (docs/audit.md, "The mutation tests"); no noise value is pinned, only verdicts."""

import pytest
import torch

from dpfl.audit.run import audit
from dpfl.schemes import dp

CANARIES = 1000


def _run(cfg, tmp_path):
    return audit(cfg, canaries=CANARIES, confidence=0.95, observe="white", out_dir=tmp_path, log=lambda s: None)


def test_honest_fl_std_dp_is_not_flagged(audit_config, tmp_path):
    out = _run(audit_config(), tmp_path)
    assert out["epsilon_accounted"] == pytest.approx(2.0, abs=1e-3)
    assert out["white"]["epsilon_lower_bound"] < out["epsilon_accounted"]
    assert out["black"]["epsilon_lower_bound"] < out["epsilon_accounted"]
    assert not out["flagged"]
    assert (tmp_path / "audit.json").is_file() and (tmp_path / "metrics.jsonl").is_file()


def test_noise_at_a_quarter_of_sigma_is_caught(audit_config, tmp_path, monkeypatch):
    honest = dp.GaussianNoiseStep.share_std
    monkeypatch.setattr(dp.GaussianNoiseStep, "share_std", lambda self, k: honest(self, k) / 4)
    out = _run(audit_config(), tmp_path)
    assert out["epsilon_accounted"] == pytest.approx(2.0, abs=1e-3)  # the ledger still says σ
    assert out["white"]["epsilon_lower_bound"] > out["epsilon_accounted"]
    assert out["flagged"]


def test_one_round_without_noise_is_caught_by_the_white_box(audit_config, tmp_path, monkeypatch):
    honest = dp.GaussianNoiseStep.client
    monkeypatch.setattr(dp.GaussianNoiseStep, "client",
                        lambda self, u, ctx: u if ctx.round == 2 else honest(self, u, ctx))
    out = _run(audit_config(), tmp_path)
    assert out["white"]["epsilon_lower_bound"] > out["epsilon_accounted"]
    assert out["flagged"]


def test_clipping_skipped_for_canary_sized_updates_is_caught(audit_config, tmp_path, monkeypatch):
    honest = dp.ClipStep.client

    def client(self, u, ctx):  # rows far past S (the canaries: 10·S) leave unclipped
        big = u.norm(dim=1) > 5 * self.bound
        out = honest(self, u, ctx)
        out[big] = u[big].to(out.dtype)
        return out

    monkeypatch.setattr(dp.ClipStep, "client", client)
    out = _run(audit_config(), tmp_path)
    assert out["white"]["epsilon_lower_bound"] > out["epsilon_accounted"]
    assert out["black"]["epsilon_lower_bound"] > out["epsilon_accounted"]
    assert out["flagged"]


def test_canaries_go_through_the_real_clip(audit_config, tmp_path, monkeypatch):
    """The canary rows reach ClipStep at 10·S and leave it at S (no shortcut around the chain)."""
    seen = []
    honest = dp.ClipStep.client

    def client(self, u, ctx):
        out = honest(self, u, ctx)
        canary = torch.from_numpy(ctx.cohort >= 20)
        seen.append((u[canary].norm(dim=1), out[canary].norm(dim=1), self.bound))
        return out

    monkeypatch.setattr(dp.ClipStep, "client", client)
    audit(audit_config(**{"federation.rounds": 1}), canaries=50, out_dir=None, log=lambda s: None)
    (before, after, bound), = seen
    assert len(before) > 0
    assert torch.allclose(before, torch.full_like(before, 10 * bound), rtol=1e-5)
    assert (after <= bound * (1 + 1e-6)).all() and (after >= bound * (1 - 1e-5)).all()
