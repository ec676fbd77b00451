"""Error types. Every error names the problem and, where possible, the fix."""


class DpflError(Exception):
    """Base class for dpfl errors."""


class ConfigError(DpflError, ValueError):
    """A configuration value is invalid."""


class DataError(DpflError, ValueError):
    """A data file or dataset is missing or malformed."""


class PrivacyError(DpflError, ValueError):
    """A privacy parameter is invalid or outside a theorem's domain."""


class BudgetExceededError(PrivacyError):
    """An event would push the ledger past its privacy budget."""


class ProtocolError(DpflError, ValueError):
    """A client message violates the protocol (wrong length, modulus, duplicate, late...)."""


class RunStopped(DpflError):
    """A run was asked to stop (SIGINT/SIGTERM); it finished its round and saved a checkpoint."""
