"""pytest-benchmark kernels: (Q4_K, Q8_0, Q6_K, F16) x (n = 1, 4, 8) on one moderately sized
matrix (default 4096 rows x k=5376, $G4_BENCH_ROWS to change), through the pinned pool.

    pytest bench/ --benchmark-only                     # all 12
    pytest bench/ --benchmark-only -k Q4_K --benchmark-json=bench/out/pb.json
    G4_BENCH_THREADS=1 pytest bench/ --benchmark-only  # one thread

extra_info of each benchmark: gbs (weight bytes / median call time, from this test's own
timings), bytes, rows, k, n, threads, isa, kernel ('simd' or 'ref' fallback) and pin_plan.
Not part of the unit tests (pyproject testpaths = ["tests"]); speed is never asserted.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")

from gemma4cpu import isa as isa_mod  # noqa: E402
from gemma4cpu import kernels as K  # noqa: E402
from gemma4cpu.synth import random_rows  # noqa: E402

TYPES = ["Q4_K", "Q8_0", "Q6_K", "F16"]
NS = [1, 4, 8]
ROWS = int(os.environ.get("G4_BENCH_ROWS", "4096"))
KDIM = 5376
ROUNDS = max(5, int(os.environ.get("G4_BENCH_ROUNDS", "7")))

_weights: dict[str, np.ndarray] = {}


def weights(t: str) -> np.ndarray:
    if t not in _weights:
        _weights.clear()  # one type resident at a time (tests are ordered by type)
        _weights[t] = random_rows(t, ROWS, KDIM, np.random.default_rng(1234))
    return _weights[t]


def gemm_kind(t: str) -> str:
    if isa_mod.active() == "ref":
        return "ref"
    slot = "gemm_" + (t[:-2].lower() + "_K" if t.endswith("_K") else t.lower())
    return isa_mod.table_report().get(slot, "?")


@pytest.mark.parametrize("n", NS, ids=[f"n{n}" for n in NS])
@pytest.mark.parametrize("wtype", TYPES)
def test_matmul(benchmark, pool, wtype, n):
    w = weights(wtype)
    x = np.random.default_rng(n).standard_normal((n, KDIM), dtype=np.float32)
    out = np.empty((n, ROWS), dtype=np.float32)
    times: list[float] = []

    def call():
        t0 = time.perf_counter()
        K.matmul(pool, wtype, w, KDIM, x, out=out)
        times.append(time.perf_counter() - t0)

    benchmark.group = f"{wtype} {ROWS}x{KDIM}"
    benchmark.pedantic(call, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    timed = times[1:] if len(times) > 1 else times  # drop the warm-up call
    med = statistics.median(timed)
    benchmark.extra_info.update({
        "gbs": w.nbytes / med / 1e9, "bytes": int(w.nbytes), "rows": ROWS, "k": KDIM, "n": n,
        "gflops": 2.0 * n * ROWS * KDIM / med / 1e9, "median_s": med, "threads": pool.size,
        "isa": isa_mod.active(), "kernel": gemm_kind(wtype), "pin_plan": pool.pin_plan(),
    })
    assert np.isfinite(out).all()
