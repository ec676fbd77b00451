"""DP statistics: feature mean / std, SuLQ counts, histograms, noisy (secure) sums."""

from dpfl.stats.histogram import Histogram, dp_histogram, stability_threshold, stable_histogram
from dpfl.stats.moments import FeatureStats, dp_mean_std
from dpfl.stats.noisy_sum import noisy_sum, plain_sum
from dpfl.stats.sulq import SuLQ, conf, posterior_confidence

__all__ = ["FeatureStats", "Histogram", "SuLQ", "conf", "dp_histogram", "dp_mean_std", "noisy_sum", "plain_sum",
           "posterior_confidence", "stability_threshold", "stable_histogram"]
