import pytest


def make_tiny_config(**over):
    """digits + small CNN-free MLP; a few clients and rounds."""
    from dpfl.config import load_config

    data = {"name": "tiny", "seed": 3,
            "data": {"dataset": "digits", "n_clients": 20, "partition": "shards"},
            "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 32, "num_classes": 10}},
            "train": {"steps": 2, "batch_size": 8, "lr": 0.1},
            "federation": {"rounds": 4, "clients_per_round": 5},
            "run": {"checkpoint_every": 2}}
    for k, v in over.items():
        node = data
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return load_config(data=data)


@pytest.fixture
def tiny_config():
    return make_tiny_config
