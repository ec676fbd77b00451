"""The survey's DP classical ML: functional-mechanism regression, DP SVM, DP random forest."""

from dpfl.classic.forest import DPRandomForest
from dpfl.classic.functional import FunctionalLinearRegression, FunctionalLogisticRegression
from dpfl.classic.svm import DPSVM

__all__ = ["DPSVM", "DPRandomForest", "FunctionalLinearRegression", "FunctionalLogisticRegression"]
