"""gemma4cpu: CPU inference for Gemma 4 GGUF models.

Kernels live in C (csrc/, one table per ISA chosen at import; see gemma4cpu.isa), wrapped by
Cython (gemma4cpu._kernels); everything else is Python.
"""
__version__ = "0.1.0"

from gemma4cpu import isa  # noqa: F401  (selects the kernel table: GEMMA4CPU_ISA)


def __getattr__(name):  # `from gemma4cpu import Engine` without loading the model code at import
    if name in ("Engine", "GenerationResult", "GenerationStats"):
        from gemma4cpu import engine
        return getattr(engine, name)
    raise AttributeError(f"module 'gemma4cpu' has no attribute {name!r}")
