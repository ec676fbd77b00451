"""Build hook for the optional C mask kernel (dpfl.secagg._maskkernel); all metadata is in pyproject.toml.

`optional=True`: where it cannot be compiled, dpfl installs without it and dpfl.secagg.prg
computes the same masks in Python (slower, same words).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dpfl.secagg._maskkernel",
            ["dpfl/secagg/_maskkernel.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
