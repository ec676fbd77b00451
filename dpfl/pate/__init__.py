"""PATE: teacher votes, LNMax/GNMax noisy max, and their data-(in)dependent privacy analysis."""

from dpfl.pate.analysis import PateReport, analyze
from dpfl.pate.votes import noisy_max, vote_counts

__all__ = ["PateReport", "analyze", "noisy_max", "vote_counts"]
