"""DP statistics for a federation: feature mean / std, SuLQ counts, noisy (secure) sums."""

from dpfl.stats.moments import FeatureStats, dp_mean_std
from dpfl.stats.secure_sum import noisy_sum, plain_sum
from dpfl.stats.sulq import SuLQ, conf, posterior_confidence

__all__ = ["FeatureStats", "SuLQ", "conf", "dp_mean_std", "noisy_sum", "plain_sum", "posterior_confidence"]
