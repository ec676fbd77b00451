"""dpfl: differentially private, bandwidth-efficient federated learning."""

__version__ = "0.1.0"
