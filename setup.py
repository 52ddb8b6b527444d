"""Build the optional compiled kernels; all other metadata is in pyproject.toml.

* ``replaystore._sumtree``: the SumTree of prioritized sampling.
* ``replaystore._ringcopy``: the check-and-copy of the transition buffer's adds.
* ``replaystore._recency``: the draw and first-occurrence loops of recency sampling.
* ``replaystore._jsoncopy``: the in-memory experience storage's snapshot of each row.
* ``replaystore._nstep``: the n-step window walk of ``ReplayBuffer(n_step=n)`` samples.
* ``replaystore._texts``: CRC-32C checks, and the samples of format 4 steps read from
  their texts (a file-backed trajectory buffer's samples).

All are ``optional``: without a C compiler the install still succeeds and
``replaystore.sampling.SumTree`` and ``replaystore.transitions.ReplayBuffer``
use their NumPy paths.
"""

import sys

from setuptools import Extension, setup

ARGS = [] if sys.platform == "win32" else ["-O3"]
# No fused multiply-adds: the recency kernel repeats the NumPy path's roundings.
STRICT_FP = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]

setup(
    ext_modules=[
        Extension(
            "replaystore._sumtree",
            sources=["src/replaystore/_sumtree.c"],
            extra_compile_args=ARGS,
            optional=True,
        ),
        Extension(
            "replaystore._ringcopy",
            sources=["src/replaystore/_ringcopy.c"],
            extra_compile_args=ARGS,
            optional=True,
        ),
        Extension(
            "replaystore._recency",
            sources=["src/replaystore/_recency.c"],
            extra_compile_args=STRICT_FP,
            optional=True,
        ),
        Extension(
            "replaystore._jsoncopy",
            sources=["src/replaystore/_jsoncopy.c"],
            extra_compile_args=ARGS,
            optional=True,
        ),
        Extension(
            "replaystore._texts",
            sources=["src/replaystore/_texts.c"],
            extra_compile_args=ARGS,
            optional=True,
        ),
        Extension(
            "replaystore._nstep",
            sources=["src/replaystore/_nstep.c"],
            # The same float products and sums, in the same order, as the NumPy path.
            extra_compile_args=STRICT_FP,
            optional=True,
        ),
    ]
)
