"""Run-time ISA selection for the C kernels.

At import the table named by GEMMA4CPU_ISA (ref | avx2 | avx512 | amx | auto, default auto) is made
active. Asking for an ISA this CPU (or OS) cannot run is an error, never a silent downgrade.
"""
from __future__ import annotations

import contextlib
import os

from gemma4cpu import _kernels

ISA_NAMES = _kernels.ISA_NAMES


def available() -> list[str]:
    """ISAs whose table this CPU and OS can run, slowest first."""
    return [n for n in ISA_NAMES if _kernels.isa_supported(n)]


def active() -> str:
    """Name of the table every kernel call uses now."""
    return _kernels.active()


def select(name: str) -> str:
    """Make `name` (or 'auto' = best available) the active table; returns the name chosen."""
    return _kernels.set_active(name)


@contextlib.contextmanager
def use(name: str):
    """Temporarily run every kernel on the table `name` (tests sweep ISAs with this)."""
    prev = active()
    select(name)
    try:
        yield name
    finally:
        select(prev)


def table_report(name: str | None = None) -> dict[str, str]:
    """{slot: 'simd' | 'ref'} for the table `name` (default: active); 'ref' marks a fallback."""
    return _kernels.table_report(name or active())


def fallbacks(name: str | None = None) -> list[str]:
    """Slots of table `name` that point at the scalar reference instead of SIMD code."""
    name = name or active()
    if name == "ref":
        return []
    return sorted(k for k, v in table_report(name).items() if v == "ref")


def cpu_features() -> list[str]:
    return _kernels.cpu_features()


def describe() -> str:
    """One line for benchmark and test headers."""
    fb = fallbacks()
    return (f"isa={active()} available={','.join(available())} features={','.join(cpu_features())}"
            + (f" fallbacks={','.join(fb)}" if fb else ""))


_env = os.environ.get("GEMMA4CPU_ISA", "auto").strip().lower() or "auto"
try:
    select(_env)
except (ValueError, RuntimeError) as e:
    raise RuntimeError(f"GEMMA4CPU_ISA={_env!r}: {e}") from None
