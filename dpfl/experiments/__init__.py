"""Thesis tables (configs, `reproduce`), reports and plots, the published docs."""

from importlib import resources
from pathlib import Path


def configs_root() -> Path:
    """The built-in run configs: `dpfl/experiments/configs/`."""
    return Path(str(resources.files("dpfl.experiments") / "configs"))
