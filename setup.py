"""Build logic only: one static C library per ISA, each with its own flags, linked into one
Cython extension that picks a table at run time (csrc/g4_dispatch.c). No -march=native,
-Ofast or -ffast-math anywhere; -ffp-contract=off everywhere, so FMA contraction can never
make the SIMD tables differ from the scalar reference (they must agree bit for bit)."""
import os
import platform
from glob import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

BASE = ["-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration",
        "-ffp-contract=off", "-fPIC", "-fno-strict-aliasing"]
SAN = os.environ.get("GEMMA4CPU_SANITIZE")  # "1": AddressSanitizer + UBSan build (see README)
if SAN:
    BASE += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
OPT = ["-O1"] if SAN else ["-O3"]

X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
AVX2 = ["-mavx2", "-mfma", "-mf16c", "-mbmi2"]
AVX512 = AVX2 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"]
# tile instructions are inline asm (csrc/amx/amx.h); no -mamx-* flags are needed, only VBMI
AMX = AVX512 + ["-mavx512vbmi"]

# Every header is a dependency of every object: a changed struct or inline helper rebuilds the
# objects of an existing build tree (setuptools' build_clib only compares a source with its object).
HEADERS = sorted(glob("csrc/*.h") + glob("csrc/*/*.h"))


def lib(name, sources, cflags):
    return (name, {"sources": sources, "cflags": cflags, "obj_deps": {"": HEADERS}})


libraries = [lib("g4_ref", sorted(glob("csrc/ref/*.c")), BASE + ["-O2"])]
if X86:
    libraries += [
        lib("g4_avx2", sorted(glob("csrc/avx2/*.c")), BASE + OPT + AVX2),
        # amx before avx512: its table points at avx512 kernels (static libraries link in order)
        lib("g4_amx", sorted(glob("csrc/amx/*.c")), BASE + OPT + AMX),
        lib("g4_avx512", sorted(glob("csrc/avx512/*.c")), BASE + OPT + AVX512),
    ]
else:  # non-x86: only the reference table exists; dispatch reports the others as unsupported
    libraries += [lib("g4_noarch", ["csrc/noarch_tables.c"], BASE + ["-O2"])]

ext = Extension(
    "gemma4cpu._kernels",
    ["gemma4cpu/_kernels.pyx", "csrc/g4_dispatch.c", "csrc/g4_pool.c", "csrc/g4_attn.c", "csrc/g4_tok.c",
     "csrc/g4_ops.c", "csrc/g4_layers.c"],
    include_dirs=["csrc", np.get_include()],
    depends=HEADERS + ["gemma4cpu/_kernels.pxd"] + sorted(glob("gemma4cpu/*.pxi")),
    extra_compile_args=["-O2", "-Wno-unused-function", "-fno-strict-aliasing"] + (
        ["-fsanitize=address,undefined", "-g"] if SAN else []),
    extra_link_args=(["-fsanitize=address,undefined"] if SAN else []) + ["-lpthread"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

class build_ext(_build_ext):
    """Relinks the extension when a C library (an archive of build_clib) is newer than it:
    setuptools compares an extension only with its sources and `depends`, so an edited kernel
    file rebuilt its archive and left the old code linked into an existing _kernels*.so."""

    def build_extension(self, ext):
        clib = self.get_finalized_command("build_clib").build_clib
        archives = [os.path.join(clib, self.compiler.library_filename(name)) for name, _ in libraries]
        ext.depends = list(ext.depends) + [a for a in archives if os.path.exists(a)]
        super().build_extension(ext)


setup(
    cmdclass={"build_ext": build_ext},
    libraries=libraries,
    ext_modules=cythonize([ext], language_level=3, compiler_directives={"boundscheck": False, "wraparound": False}),
)
