"""The thesis's models (and two small ones), built by name.

    model = build_model("cnn", seed=0)          # 1,663,370 parameters
    count_params(model)

All are plain nn.Modules without BatchNorm or buffers, so they run under
torch.func.functional_call + vmap. Multiclass models return logits [B, C]; binary models
(medical-mlp, imdb-cnn-lstm, mlp/logreg with num_classes=1) one logit per sample [B].
Weights start from Keras's default initialisation (see keras_init.py).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from dpfl.errors import ConfigError
from dpfl.models.keras_init import keras_init_
from dpfl.models.tabular import MLP, logreg, medical_mlp
from dpfl.models.text import ImdbCnnLstm, KerasLSTM
from dpfl.models.vision import AllCNNC, ThesisCNN

MODELS = {  # name -> (constructor, description)
    "cnn": (ThesisCNN, "MNIST/Fashion-MNIST CNN [MMRHA16], 1x28x28 -> 10"),
    "medical-mlp": (medical_mlp, "mortality MLP [Ava+18], 7,280 -> 200 -> 200 -> 1 logit"),
    "allcnn-c": (AllCNNC, "All-CNN-C [SDBR15], 3x32x32 -> 10"),
    "imdb-cnn-lstm": (ImdbCnnLstm, "Embedding+Conv1D+MaxPool+LSTM(70), 400 tokens -> 1 logit"),
    "mlp": (MLP, "MLP (in_features, hidden, num_classes; num_classes=1 -> binary)"),
    "logreg": (logreg, "logistic regression (in_features, num_classes; num_classes=1 -> binary)"),
}

THESIS_PARAMS = {"cnn": 1_663_370, "medical-mlp": 1_496_601, "allcnn-c": 1_369_738, "imdb-cnn-lstm": 402_701}


def list_models() -> dict[str, str]:
    """Model names and one-line descriptions."""
    return {name: desc for name, (_, desc) in MODELS.items()}


def count_params(model: nn.Module) -> int:
    """Number of scalar parameters (the length of the flat parameter vector)."""
    return sum(p.numel() for p in model.parameters())


def build_model(name: str, seed: int | None = None, **kw) -> nn.Module:
    """Model `name` with constructor options `kw`, Keras-initialised from `seed` (global RNG if None)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")
    ctor = MODELS[name][0]
    params = inspect.signature(ctor).parameters
    unknown = sorted(set(kw) - set(params))
    if unknown:
        raise ConfigError(
            f"model {name!r} got unknown options {unknown}; allowed: {', '.join(params) or 'none'}"
        )
    missing = [k for k, p in params.items() if p.default is inspect.Parameter.empty and k not in kw]
    if missing:
        raise ConfigError(f"model {name!r} needs options {missing}")
    for k, v in kw.items():
        if k == "dropout":
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"model {name!r}: dropout must be in [0, 1), got {v!r}")
        elif k == "hidden":
            widths = [v] if isinstance(v, int) else list(v)
            if not all(isinstance(w, int) and w >= 1 for w in widths):
                raise ConfigError(f"model {name!r}: hidden must be positive integer widths, got {v!r}")
        elif not isinstance(v, int) or v < 1:
            raise ConfigError(f"model {name!r}: {k} must be a positive integer, got {v!r}")
    model = ctor(**kw)
    gen = None if seed is None else torch.Generator().manual_seed(int(seed))
    return keras_init_(model, gen)


__all__ = [
    "MLP",
    "MODELS",
    "THESIS_PARAMS",
    "AllCNNC",
    "ImdbCnnLstm",
    "KerasLSTM",
    "ThesisCNN",
    "build_model",
    "count_params",
    "keras_init_",
    "list_models",
]
