"""Membership inference by a loss threshold (Yeom et al., CSF 2018).

The adversary predicts "member" when a sample's loss under the model is at most τ, with τ the
model's expected training loss (Yeom's threshold adversary). Membership advantage = TPR − FPR,
measured on equally many members (samples of the clients' training data) and non-members (test
samples). Also reported: the advantage of the best threshold in hindsight (an optimistic upper
bound for this attack) and the AUC of −loss as a membership score.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from dpfl.errors import ConfigError, DataError
from dpfl.models.loss import loss_per_sample


@dataclass
class MembershipResult:
    members: int
    non_members: int
    threshold: float  # τ: mean member loss
    tpr: float  # members with loss ≤ τ
    fpr: float  # non-members with loss ≤ τ
    advantage: float  # tpr − fpr
    advantage_se: float  # its standard error (independent binomial TPR and FPR)
    best_advantage: float  # max over τ of tpr − fpr
    auc: float
    member_loss: float
    non_member_loss: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def best_threshold_advantage(member_losses: np.ndarray, non_member_losses: np.ndarray) -> float:
    """max over τ of P(member loss ≤ τ) − P(non-member loss ≤ τ) (τ = −∞ gives 0)."""
    a, b = np.sort(member_losses), np.sort(non_member_losses)
    taus = np.concatenate([a, b])
    tpr = np.searchsorted(a, taus, side="right") / len(a)
    fpr = np.searchsorted(b, taus, side="right") / len(b)
    return float(max(0.0, (tpr - fpr).max()))


def loss_threshold_attack(member_losses: np.ndarray, non_member_losses: np.ndarray,
                          threshold: float | None = None) -> MembershipResult:
    """Yeom et al.'s attack on given per-sample losses (τ = mean member loss unless given)."""
    a = np.asarray(member_losses, dtype=np.float64)
    b = np.asarray(non_member_losses, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise DataError(f"membership inference needs members and non-members, got {a.size} and {b.size}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise DataError("membership inference got non-finite losses (the model diverged?)")
    tau = float(a.mean()) if threshold is None else float(threshold)
    tpr, fpr = float((a <= tau).mean()), float((b <= tau).mean())
    from sklearn.metrics import roc_auc_score

    auc = float(roc_auc_score(np.r_[np.ones(a.size), np.zeros(b.size)], -np.r_[a, b]))
    se = float(np.sqrt(tpr * (1 - tpr) / a.size + fpr * (1 - fpr) / b.size))
    return MembershipResult(int(a.size), int(b.size), tau, tpr, fpr, tpr - fpr, se,
                            best_threshold_advantage(a, b), auc, float(a.mean()), float(b.mean()))


@torch.no_grad()
def sample_losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: str,
                  batch_size: int = 1000) -> np.ndarray:
    """Per-sample training loss of `model` (cross-entropy, or BCE for binary tasks)."""
    model.eval()
    out = []
    for s in range(0, x.shape[0], batch_size):
        xb = x[s : s + batch_size]
        xb = xb.float() if xb.dtype == torch.uint8 or (xb.is_floating_point() and xb.dtype != torch.float32) else xb
        out.append(loss_per_sample(model(xb), y[s : s + batch_size], task).double().cpu())
    model.train()
    return torch.cat(out).numpy() if out else np.zeros(0)


def membership_advantage(model: torch.nn.Module, fed: Any, samples: int = 5000, seed: int = 0,
                         batch_size: int = 1000) -> MembershipResult:
    """The attack on a federation: members drawn from the clients' data, non-members from its test set
    (as many of each: `samples`, or fewer if either side has fewer)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ConfigError(f"samples must be an integer ≥ 1, got {samples!r}")
    members = np.unique(np.concatenate(list(fed.clients)))
    m = min(samples, len(members), len(fed.y_test))
    rng = np.random.default_rng(seed)
    mi = torch.from_numpy(np.sort(rng.choice(members, size=m, replace=False))).to(fed.y.device)
    ni = torch.from_numpy(np.sort(rng.choice(len(fed.y_test), size=m, replace=False))).to(fed.y_test.device)
    a = sample_losses(model, fed.x[mi], fed.y[mi], fed.task, batch_size)
    b = sample_losses(model, fed.x_test[ni], fed.y_test[ni], fed.task, batch_size)
    return loss_threshold_attack(a, b)
