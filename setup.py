"""Build the optional compiled SumTree kernel; all other metadata is in pyproject.toml.

The extension is ``optional``: without a C compiler the install still succeeds and
``replaystore.sampling.SumTree`` uses its NumPy fallback.
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "replaystore._sumtree",
            sources=["src/replaystore/_sumtree.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
            optional=True,
        )
    ]
)
