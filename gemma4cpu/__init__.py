"""gemma4cpu: CPU inference for Gemma 4 GGUF models.

Kernels live in C (csrc/, one table per ISA chosen at import; see gemma4cpu.isa), wrapped by
Cython (gemma4cpu._kernels); everything else is Python.
"""
__version__ = "0.1.0"

from gemma4cpu import isa  # noqa: F401  (selects the kernel table: GEMMA4CPU_ISA)
