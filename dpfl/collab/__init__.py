"""FedCollabNN (loss aggregation with additive secret sharing), its baselines, and private
dataset generation with the worker models as PATE teachers."""

from dpfl.collab.fedcollab import Worker, evaluate, train_fedavg, train_losses
from dpfl.collab.sharing import decode, encode, reconstruct, secure_sum, share

__all__ = [
    "Worker",
    "decode",
    "encode",
    "evaluate",
    "reconstruct",
    "secure_sum",
    "share",
    "train_fedavg",
    "train_losses",
]
