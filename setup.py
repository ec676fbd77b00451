"""Build hook for the optional C kernels (dpfl.secagg._maskkernel, dpfl.rng._gausskernel); all
metadata is in pyproject.toml.

`optional=True`: where one cannot be compiled, dpfl installs without it and dpfl.secagg.prg /
dpfl.rng.gauss compute the same words and values in Python (slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dpfl.secagg._maskkernel",
            ["dpfl/secagg/_maskkernel.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "dpfl.rng._gausskernel",
            ["dpfl/rng/_gausskernel.c"],
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
