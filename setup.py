"""Build of the compiled grouping core; all other configuration lives in pyproject.toml."""

import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("VIDEOFLOW_DEBUG") == "1"

# The one place compiler directives are set: a debug build turns the checks back on.
DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": False,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}
CFLAGS = ["-O0", "-g"] if DEBUG else ["-O3"]
if os.name == "nt":
    CFLAGS = ["/Od", "/Zi"] if DEBUG else ["/O2"]


def extension(name: str) -> Extension:
    """One compiled module of videoflow.messaging, built from csrc/videoflow/messaging/."""
    return Extension(
        f"videoflow.messaging.{name}",
        [f"csrc/videoflow/messaging/{name}.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=CFLAGS,
    )


extensions = [extension("_timeline"), extension("_grouping_core")]

# force: pip builds in the source tree, and cythonize/build_ext judge staleness by
# timestamps alone, so switching VIDEOFLOW_DEBUG would otherwise reuse the other mode's
# generated C and compiled module. Regenerating the C makes build_ext recompile too.
setup(
    ext_modules=cythonize(
        extensions, compiler_directives=DIRECTIVES, include_path=["csrc"], force=True
    )
)
