"""Paired A/B of one Q4_K matrix in row layout against its Q4_K_R8 repack (gemma4cpu.repack), through
the pool, in one process: per round both products run once, in alternating order, and the figure is
the median of the per-round time ratios (R8 / row) with its quartiles. On a shared host this is the
comparison that holds; back-to-back groups (bench_kernels.py --types Q4_K,Q4_K_R8) drift apart.

    python bench/ab_repack.py [--rows 131072] [--k 5376] [--tokens 1,2,4,8,12,16] [--threads 2] [--rounds 9]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemma4cpu import isa as isa_mod  # noqa: E402
from gemma4cpu import kernels as K  # noqa: E402
from gemma4cpu.synth import random_rows  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=131072, help="matrix rows (multiple of 8; default 131072)")
    ap.add_argument("--k", type=int, default=5376, help="inputs per row (multiple of 256; default 5376)")
    ap.add_argument("--tokens", default="1,2,4,8,12,16", help="token counts (default 1,2,4,8,12,16)")
    ap.add_argument("--threads", type=int, default=2, help="pool threads, pinned to the first allowed CPUs")
    ap.add_argument("--rounds", type=int, default=9, help="paired rounds per token count (default 9)")
    a = ap.parse_args(argv)
    if a.rows <= 0 or a.rows % 8 or a.k <= 0 or a.k % 256 or a.threads < 1 or a.rounds < 1:
        ap.error("rows must be a positive multiple of 8, k of 256; threads and rounds >= 1")
    try:
        ns = [int(t) for t in a.tokens.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--tokens: a comma-separated list of integers, got {a.tokens!r}")
    if not ns or min(ns) < 1:
        ap.error("--tokens: token counts must be >= 1")
    cpus = sorted(os.sched_getaffinity(0))[:a.threads]
    rng = np.random.default_rng(1)
    one = random_rows("Q4_K", min(a.rows, 21504), a.k, rng)
    w = np.concatenate([one] * (-(-a.rows // one.shape[0])))[:a.rows]
    p = K.repack_q4_K_r8(w, a.k)
    pool = K.Pool(a.threads, cpus if len(cpus) == a.threads else None)
    print(f"machine  {platform.machine()} {platform.processor() or ''} | isa {isa_mod.active()} | "
          f"threads {a.threads} pinned to CPUs {cpus if len(cpus) == a.threads else 'none'}")
    print(f"matrix   {a.rows} x {a.k} Q4_K, {w.nbytes / 2**20:.0f} MiB per layout; {a.rounds} paired rounds")
    print("| n | row ms | R8 ms | R8/row median | quartiles |")
    print("|---:|---:|---:|---:|---|")
    for n in ns:
        x = rng.standard_normal((n, a.k), dtype=np.float32)
        out = np.empty((n, a.rows), np.float32)
        K.matmul(pool, "Q4_K", w, a.k, x, out=out)
        K.matmul(pool, K.Q4_K_R8, p, a.k, x, out=out)
        ta, tb = [], []
        for r in range(a.rounds):
            res = {}
            order = [("row", "Q4_K", w), ("r8", K.Q4_K_R8, p)]
            for name, t, ww in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                K.matmul(pool, t, ww, a.k, x, out=out)
                res[name] = time.perf_counter() - t0
            ta.append(res["row"])
            tb.append(res["r8"])
        rat = np.array(tb) / np.array(ta)
        print(f"| {n} | {np.median(ta) * 1e3:.1f} | {np.median(tb) * 1e3:.1f} | {np.median(rat):.3f} | "
              f"{np.percentile(rat, 25):.3f}-{np.percentile(rat, 75):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
