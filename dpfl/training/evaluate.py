"""Batched no-grad evaluation of the global model."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from dpfl.data.dataset import as_model_input
from dpfl.models.loss import loss_per_sample


@torch.no_grad()
def _outputs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str,
             batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's outputs and per-example losses on (x, y), in eval mode, batch by batch.
    Images on CPU run through a channels-last copy of the model in chunks of ≤ 256 (cache-sized;
    measured 1.7× faster than NCHW at 1000 on the thesis CNN); results do not depend on the chunk."""
    if x.dim() == 4 and x.device.type == "cpu":
        model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        batch_size = min(batch_size, 256)
    model.eval()
    losses, outs = [], []
    for s in range(0, x.shape[0], batch_size):
        xb = x[s : s + batch_size]
        xb = as_model_input(xb, next(model.parameters()).dtype)
        if xb.dim() == 4:
            xb = xb.contiguous(memory_format=torch.channels_last)
        out = model(xb)
        losses.append(loss_per_sample(out, y[s : s + batch_size], task))
        outs.append(out)
    model.train()
    return torch.cat(outs), torch.cat(losses)


def _correct(out: torch.Tensor, y: torch.Tensor, task: str) -> np.ndarray:
    if task == "binary":
        return (out.reshape(-1).double().cpu().numpy() > 0) == (y.reshape(-1).cpu().numpy() == 1)
    return (out.argmax(1) == y).cpu().numpy()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str, batch_size: int = 1000) -> dict:
    """Loss and accuracy; balanced accuracy and AUROC for binary tasks."""
    out, losses = _outputs(model, x, y, task, batch_size)
    res = {"loss": float(losses.mean())}
    if task == "binary":
        score = out.reshape(-1).double().cpu().numpy()  # scikit-learn's AUROC needs NumPy
        yt = y.reshape(-1).cpu().numpy()
        pred = score > 0
        tpr = float((pred & (yt == 1)).sum() / max(1, (yt == 1).sum()))
        tnr = float((~pred & (yt == 0)).sum() / max(1, (yt == 0).sum()))
        res["accuracy"] = float((pred == (yt == 1)).mean())
        res["balanced_accuracy"] = (tpr + tnr) / 2
        res["auroc"] = _auroc(yt, score)
    else:
        res["accuracy"] = float((out.argmax(1) == y).double().mean())
    return res


def evaluate_counts(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str,
                    batch_size: int = 1000) -> dict[str, float | int]:
    """What federated evaluation adds up across sites: examples, correct predictions, summed loss
    (float64). Their sums give exactly the accuracy `evaluate` gives on the union of the sites' data."""
    out, losses = _outputs(model, x, y, task, batch_size)
    return {"n": len(y), "correct": int(_correct(out, y, task).sum()),
            "loss_sum": float(losses.double().sum())}


def _auroc(y: np.ndarray, score: np.ndarray) -> float:
    if y.min() == y.max():
        return float("nan")
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))
