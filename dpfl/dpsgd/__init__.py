"""Record-level DP-SGD: per-example clipping, Gaussian noise, Poisson sampling, ledger accounting."""

from dpfl.dpsgd.core import clipped_grad_sum, noisy_gradient, per_example_grads
from dpfl.dpsgd.step import dpsgd_step
from dpfl.dpsgd.train import DPPlan, TrainResult, make_private_with_epsilon, train

__all__ = [
    "DPPlan",
    "TrainResult",
    "clipped_grad_sum",
    "dpsgd_step",
    "make_private_with_epsilon",
    "noisy_gradient",
    "per_example_grads",
    "train",
]
