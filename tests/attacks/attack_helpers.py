"""Shared helpers of the attack tests: tiny run configs, FL-SIGN chain, round contexts."""

import numpy as np
import torch

from dpfl.config import load_config
from dpfl.rng import Seeds
from dpfl.schemes.base import RoundContext


def tiny_config(scheme="fl-std", attack=None, rounds=4, clients=40, per_round=10, lr=0.3, seed=1, **extra):
    """digits (8x8) + a 64-32-10 MLP: a few seconds for a handful of rounds."""
    d = {"seed": seed, "data": {"dataset": "digits", "n_clients": clients},
         "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 32}},
         "train": {"steps": 5, "batch_size": 10, "lr": lr},
         "federation": {"rounds": rounds, "clients_per_round": per_round},
         "scheme": {"name": scheme}, "run": {"threads": 1}}
    if attack is not None:
        d["attack"] = attack
    for k, v in extra.items():  # extra sections are merged into the defaults
        if isinstance(v, dict):
            d.setdefault(k, {}).update(v)
        else:
            d[k] = v
    return load_config(data=d)


def fl_sign(gamma=0.01):
    """FL-SIGN as a chain (Alg. 3): sign step, 1-bit transport, vote by sum."""
    from dpfl.compression.bits import SignCodec
    from dpfl.schemes.aggregators import SumAggregator
    from dpfl.schemes.registry import Scheme
    from dpfl.schemes.sign import SignStep
    from dpfl.schemes.transport import PlainTransport

    return Scheme("fl-sign", [SignStep(gamma)], PlainTransport(SignCodec()), SumAggregator())


def round_ctx(k, n, r=1, seed=0, malicious=None, n_clients=None, cohort=None):
    return RoundContext(round=r, n_params=n, cohort=np.arange(k) if cohort is None else cohort, n_selected=k,
                        weights=torch.ones(k), seeds=Seeds(seed), device=torch.device("cpu"),
                        global_params=torch.zeros(n), n_clients=n_clients or k, cohort_size=k,
                        malicious=malicious)
