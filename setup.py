"""Build of the compiled modules (grouping core, envelope decoder); all other configuration
lives in pyproject.toml."""

import os
import sys

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
# A release build carries no debug information and no symbol table: the interpreter's
# own CFLAGS (sysconfig) usually hold -g, which -g0 after them overrides, and the linker
# drops the local symbols (3.3 MB of modules -> 0.5 MB on Linux). The exported PyInit_*
# entry points live in the dynamic symbol table, which stripping keeps.
if os.name == "nt":
    CFLAGS, LDFLAGS = (["/Od", "/Zi"], ["/DEBUG"]) if DEBUG else (["/O2"], [])
elif DEBUG:
    CFLAGS, LDFLAGS = ["-O0", "-g"], []
else:
    CFLAGS = ["-O3", "-g0"]
    LDFLAGS = ["-Wl,-S", "-Wl,-x"] if sys.platform == "darwin" else ["-s"]


def extension(package: str, name: str) -> Extension:
    """One compiled module of videoflow.<package>, built from csrc/videoflow/<package>/."""
    return Extension(
        f"videoflow.{package}.{name}",
        [f"csrc/videoflow/{package}/{name}.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
    )


extensions = [
    extension("messaging", "_timeline"),
    extension("messaging", "_grouping_core"),
    extension("wire", "_envelope"),
]

# force: pip builds in the source tree, and cythonize/build_ext judge staleness by
# timestamps alone, so switching VIDEOFLOW_DEBUG would otherwise reuse the other mode's
# generated C and compiled module. Regenerating the C makes build_ext recompile too.
# Both steps use every core: the modules are independent, and CI builds them twice (the
# dev install, the packaging test's wheel). cythonize's workers are processes, which
# spawn-start platforms would re-run this script in: POSIX only.
WORKERS = os.cpu_count() or 1
setup(
    ext_modules=cythonize(
        extensions, compiler_directives=DIRECTIVES, include_path=["csrc"], force=True,
        nthreads=WORKERS if os.name == "posix" else 0,
    ),
    options={"build_ext": {"parallel": WORKERS}},
)
