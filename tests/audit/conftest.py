import pytest


def audit_tiny_config(**over):
    """Digits, an MLP of 9,610 parameters, 20 clients every round (q = 1), FL-STD-DP at ε = 2."""
    from dpfl.config import load_config

    data = {"name": "audit-tiny", "seed": 3,
            "data": {"dataset": "digits", "n_clients": 20, "partition": "shards"},
            "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 128, "num_classes": 10}},
            "train": {"steps": 2, "batch_size": 8, "lr": 0.1},
            "federation": {"rounds": 3, "fraction": 1.0},
            "scheme": {"name": "fl-std-dp", "options": {"epsilon": 2.0, "clip": 1.0, "neighbours": 8}},
            "privacy": {"accountant": "pld", "delta": 1e-5},
            "eval": {"every": 100}, "run": {"threads": 1, "checkpoint_every": 100}}
    for k, v in over.items():
        node = data
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return load_config(data=data)


@pytest.fixture
def audit_config():
    return audit_tiny_config
