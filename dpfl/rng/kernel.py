"""The optional C kernel of the Gaussian and discrete-Gaussian samplers (`_gausskernel.c`)."""

import importlib


def c_kernel():
    """The C kernel (built by setup.py; the same values as the NumPy / torch code), or None where it
    is not built. Loaded by name: a compiled module, needing neither torch nor dpfl.rng.gauss."""
    try:
        return importlib.import_module("dpfl.rng._gausskernel")
    except ImportError:  # pragma: no cover - depends on the build
        return None
