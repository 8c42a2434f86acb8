"""taskset / cpuset style CPU lists ('0-3,8,10-11'), shared by the CLI, the benchmarks and tools."""
from __future__ import annotations


def parse_cpu_list(spec: str) -> list[int]:
    """taskset/cpuset style list: '0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (order kept, no dups)."""
    out: list[int] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                lo_i, hi_i = int(lo), int(hi)
                if hi_i < lo_i:
                    raise ValueError
                rng = range(lo_i, hi_i + 1)
            else:
                rng = range(int(part), int(part) + 1)
        except ValueError:
            raise ValueError(f"bad CPU range {part!r} in CPU list {spec!r} (expected e.g. '0-3,8')") from None
        for c in rng:
            if c < 0:
                raise ValueError(f"bad CPU id {c}")
            if c not in out:
                out.append(c)
    if not out:
        raise ValueError(f"empty CPU list {spec!r}")
    return out
