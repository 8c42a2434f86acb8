#!/usr/bin/env python3
"""Kernel speed: GEMV and small-batch GEMM on the same >= 1 GiB of weights, plus prefill GEMM.

    python bench/bench_kernels.py                                  # defaults (about 2-3 min)
    python bench/bench_kernels.py --quick                          # about 1 min
    python bench/bench_kernels.py --threads 1,2 --types Q4_K,Q8_0 --gib 1 --json out.json
    python bench/bench_kernels.py --isa all --quick                # sweep every table this CPU runs

What it does, per weight type:
  * builds one 31B-sized FFN matrix (21504 rows of k=5376: gate/up, i.e. a 5376 x 21504 GGUF
    tensor) of valid random blocks and copies it until the working set is >= --gib GiB, so
    nothing stays in cache between calls;
  * "batch": times matmul with n = 1, 2, 4, 8, 16 tokens over that SAME working set in one call
    each, rounds interleaved (every round times every (threads, n) once, in a rotated order),
    median of --runs rounds; reports ms, weight GB/s, % of the read bandwidth the probe
    measured in this same run for that thread count, and time(n) / time(n=1);
  * "prefill": n = 64 and 512 on the single 21504 x 5376 matrix; reports GFLOP/s
    (2 * n * rows * k / t) and tokens/s for the whole matrix.

Scalar reference kernels (today's fallbacks) are far too slow for the full sizes, so every
(type, ISA) group is first calibrated on a small slice: if the largest call would take more than
--max-call-s on the full working set, the bench times a row prefix of the SAME array instead
(never below --min-mib, default 64 MiB = 2x the 32 MiB L3 here) and marks those rows '*'.
Activation quantisation is inside the timed call, as in the real model.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # repo root, for `python bench/...`

from bench.common import (ALLOWED_CPUS_AT_IMPORT, CpuNoise, fmt, header, md_table,  # noqa: E402
                          median, parse_cpu_list, parse_int_list, probe_bandwidth)

import numpy as np  # noqa: E402

from gemma4cpu import isa as isa_mod  # noqa: E402
from gemma4cpu import kernels as K  # noqa: E402
from gemma4cpu.synth import random_rows  # noqa: E402

FFN_ROWS, FFN_K = 21504, 5376  # Gemma 31B-class FFN: hidden 5376, intermediate 21504
MIB = 1 << 20
GIB = 1 << 30


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def slot_kind(isa: str, t: str) -> str:
    """'simd' or 'ref' for the product slot of weight type t in table `isa`."""
    if isa == "ref":
        return "ref"
    name = "gemm_q4_K_r8" if t == "Q4_K_R8" else "gemm_" + (t[:-2].lower() + "_K" if t.endswith("_K") else t.lower())
    return isa_mod.table_report(isa).get(name, "?")


def build_weights(t: str, gib: float, rng) -> tuple[np.ndarray, int, int]:
    """(rows (copies * FFN_ROWS, row_bytes) uint8, copies, bytes of one matrix): one random
    FFN matrix copied until the array holds >= gib GiB (distinct pages, same values)."""
    one = random_rows("Q4_K" if t == "Q4_K_R8" else t, FFN_ROWS, FFN_K, rng)
    if t == "Q4_K_R8":  # the engine's repacked Q4_K (gemma4cpu.repack)
        one = K.repack_q4_K_r8(one, FFN_K)
    copies = max(1, math.ceil(gib * GIB / one.nbytes))
    w = np.empty((copies * FFN_ROWS, one.shape[1]), dtype=np.uint8)
    for c in range(copies):
        w[c * FFN_ROWS:(c + 1) * FFN_ROWS] = one
    return w, copies, one.nbytes


class Runner:
    """Times one matmul call on the pool of a given thread count."""

    def __init__(self, pools: dict[int, K.Pool]):
        self.pools = pools

    def call(self, t: str, threads: int, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> float:
        p = self.pools[threads]
        t0 = time.perf_counter()
        K.matmul(p, t, w, FFN_K, x, out=out)
        return time.perf_counter() - t0

    def rounds(self, t: str, w: np.ndarray, threads: list[int], ns: list[int], runs: int, rng, cpus):
        """One warm-up round, then `runs` rounds; each round times every (threads, n) once,
        starting one cell later than the round before. -> ({(threads, n): [s]}, others %)."""
        xs = {n: rng.standard_normal((n, FFN_K), dtype=np.float32) for n in ns}
        outs = {n: np.empty((n, w.shape[0]), dtype=np.float32) for n in ns}
        cells = [(th, n) for th in threads for n in ns]
        for th, n in cells:
            self.call(t, th, w, xs[n], outs[n])
        times = {c: [] for c in cells}
        noise = CpuNoise(cpus).start()
        for r in range(runs):
            k0 = r % len(cells)
            for th, n in cells[k0:] + cells[:k0]:
                times[(th, n)].append(self.call(t, th, w, xs[n], outs[n]))
        return times, noise.stop()


def pick_rows(run: Runner, t: str, threads: int, w: np.ndarray, n: int, rng, max_call_s: float,
              min_rows: int, probe_rows: int, align: int) -> tuple[int, float]:
    """Rows of w to time so that one n-token call takes about max_call_s at most (>= min_rows),
    from a calibration on the first probe_rows rows. -> (rows, est. seconds on all rows)."""
    total = w.shape[0]
    probe_rows = min(total, probe_rows)
    x = rng.standard_normal((n, FFN_K), dtype=np.float32)
    out = np.empty((n, probe_rows), dtype=np.float32)
    run.call(t, threads, w[:probe_rows], x, out)  # warm (page tables, pool spin-up)
    dt = min(run.call(t, threads, w[:probe_rows], x, out) for _ in range(2))
    est_full = dt * total / probe_rows
    if est_full <= max_call_s:
        return total, est_full
    rows = max(min_rows, int(total * max_call_s / est_full) // align * align)
    return min(total, rows), est_full


def bench_type(t: str, isas: list[str], threads: list[int], run: Runner, a, bw: dict[int, float],
               rng) -> list[dict]:
    t_build = time.perf_counter()
    w, copies, mat_bytes = build_weights(t, a.gib, rng)
    rb = w.shape[1]
    log(f"[{t}] built {copies} x {mat_bytes / MIB:.1f} MiB = {w.nbytes / GIB:.2f} GiB in "
        f"{time.perf_counter() - t_build:.1f} s")
    results = []
    tmin = min(threads)
    for isa in isas:
        with isa_mod.use(isa):
            kind = slot_kind(isa, t)
            common = {"type": t, "isa": isa, "kernel": kind, "k": FFN_K}
            # batch group: one row count for every (threads, n), calibrated on the slowest cell
            nmax = max(a.batches)
            min_rows = min(w.shape[0], max(1, a.min_mib * MIB // rb))
            rows, est = pick_rows(run, t, tmin, w, nmax, rng, a.max_call_s, min_rows,
                                  probe_rows=max(256, 32 * MIB // rb), align=FFN_ROWS // 16)
            wv = w[:rows]
            log(f"[{t}/{isa}] batch: {rows} of {w.shape[0]} rows ({wv.nbytes / MIB:.0f} MiB); "
                f"est. n={nmax} call on all rows {est:.2f} s with {tmin} thread(s)")
            times, others = run.rounds(t, wv, threads, a.batches, a.runs, rng, a.cpus_list)
            for th in threads:
                t1 = median(times[(th, 1)]) if 1 in a.batches else None
                for n in a.batches:
                    m = median(times[(th, n)])
                    gbs = wv.nbytes / m / 1e9
                    results.append({
                        "group": "batch", **common, "threads": th, "n": n, "rows": rows,
                        "rows_total": w.shape[0], "reduced": rows < w.shape[0], "bytes": wv.nbytes,
                        "median_s": m, "runs_s": times[(th, n)], "gbs": gbs,
                        "pct_bw": 100.0 * gbs / bw[th] if bw.get(th) else None,
                        "ratio_n1": m / t1 if t1 else None,
                        "gflops": 2.0 * n * rows * FFN_K / m / 1e9,
                        "tok_s": n / m * rows / w.shape[0],  # tokens/s through the whole working set
                        "others_pct": others,
                    })
            # prefill group: the single 21504 x 5376 matrix
            if a.prefill:
                npmax = max(a.prefill)
                prows, pest = pick_rows(run, t, tmin, w[:FFN_ROWS], npmax, rng, a.max_call_s,
                                        min_rows=256, probe_rows=512, align=64)
                mv = w[:prows]
                log(f"[{t}/{isa}] prefill: {prows} of {FFN_ROWS} rows; est. n={npmax} call on all rows "
                    f"{pest:.2f} s with {tmin} thread(s)")
                times, others = run.rounds(t, mv, threads, a.prefill, a.runs, rng, a.cpus_list)
                for th in threads:
                    for n in a.prefill:
                        m = median(times[(th, n)])
                        full = m * FFN_ROWS / prows
                        results.append({
                            "group": "prefill", **common, "threads": th, "n": n, "rows": prows,
                            "rows_total": FFN_ROWS, "reduced": prows < FFN_ROWS, "bytes": mv.nbytes,
                            "median_s": m, "runs_s": times[(th, n)],
                            "gflops": 2.0 * n * prows * FFN_K / m / 1e9,
                            "full_matrix_s": full, "tok_s": n / full, "others_pct": others,
                        })
    del w
    gc.collect()
    return results


def print_tables(results: list[dict], bw: dict[int, float], file=None):
    file = file or sys.stdout
    batch = [r for r in results if r["group"] == "batch"]
    if batch:
        rows = [[r["type"], f"{r['isa']} ({r['kernel']})", r["threads"], r["n"],
                 f"{r['bytes'] / MIB:.0f}" + ("*" if r["reduced"] else ""), fmt(r["median_s"] * 1e3, 2),
                 fmt(r["gbs"], 2), fmt(r["pct_bw"], 1), fmt(r["ratio_n1"], 2), fmt(r["gflops"], 1),
                 fmt(r["others_pct"], 0)] for r in batch]
        bw_txt = " (" + ", ".join(f"{t} thr {v:.1f} GB/s" for t, v in sorted(bw.items())) + ")" if bw else ""
        print("## GEMV / small-batch GEMM (same weights for every n)\n", file=file)
        print(md_table(["type", "isa (gemm)", "thr", "n", "MiB", "ms", "GB/s", "% of BW", "t(n)/t(1)",
                        "GFLOP/s", "others %"], rows, "llrrrrrrrrr"), file=file)
        print(f"\nGB/s = weight bytes read per call / median time; % of BW = against the probe's median "
              f"for the same thread count{bw_txt}. '*' = a row prefix of the working set (calibrated to "
              f"--max-call-s). others % = CPU time of the allowed CPUs used by other processes during "
              f"the group's timed rounds (shared host).\n", file=file)
    pre = [r for r in results if r["group"] == "prefill"]
    if pre:
        rows = [[r["type"], f"{r['isa']} ({r['kernel']})", r["threads"], r["n"],
                 f"{r['rows']}" + ("*" if r["reduced"] else ""), fmt(r["median_s"] * 1e3, 2),
                 fmt(r["gflops"], 2), fmt(r["full_matrix_s"] * 1e3, 1), fmt(r["tok_s"], 1),
                 fmt(r["others_pct"], 0)] for r in pre]
        print(f"## Prefill GEMM on one {FFN_ROWS} x {FFN_K} matrix\n", file=file)
        print(md_table(["type", "isa (gemm)", "thr", "n", "rows", "ms", "GFLOP/s", "full-matrix ms", "tok/s",
                        "others %"], rows, "llrrrrrrrr"), file=file)
        print(f"\nGFLOP/s = 2*n*rows*{FFN_K} / median time; full-matrix ms and tok/s scale a reduced ('*') "
              f"row count up to all {FFN_ROWS} rows.\n", file=file)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default: 1 and all --cpus)")
    ap.add_argument("--cpus", default=None, help="taskset-style CPU list; a T-thread pool uses the first T "
                                                 "(default: the process's allowed CPUs)")
    ap.add_argument("--types", default="Q4_K,Q8_0",
                    help="weight types (default Q4_K,Q8_0; any of " + ",".join(K.TYPE_IDS) + ", or Q4_K_R8: Q4_K repacked as the engine does on avx2)")
    ap.add_argument("--gib", type=float, default=1.0, help="weight working set per type in GiB (default 1)")
    ap.add_argument("--batches", default="1,2,4,8,16", help="token counts, batch group (default 1,2,4,8,16)")
    ap.add_argument("--prefill", default="64,512", help="token counts, prefill (default 64,512; '' to skip)")
    ap.add_argument("--runs", type=int, default=5, help="timed rounds, median reported (>= 5, default 5)")
    ap.add_argument("--isa", default=None, help="comma list of tables, or 'all' = every table this CPU "
                                                "runs (default: the active one, GEMMA4CPU_ISA)")
    ap.add_argument("--max-call-s", type=float, default=1.0,
                    help="time a row prefix when the largest call would exceed this (default 1.0 s)")
    ap.add_argument("--min-mib", type=int, default=64,
                    help="smallest batch working set when reduced (MiB, default 64)")
    ap.add_argument("--bw-gib", type=float, default=2.0, help="bandwidth probe buffer (GiB, default 2)")
    ap.add_argument("--bw", type=float, default=None,
                    help="skip the probe; use this GB/s for every thread count")
    ap.add_argument("--quick", action="store_true",
                    help="0.25 GiB of weights, n=1,4,16, prefill 64, 0.5 s call cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="write header, bandwidth and every cell as JSON")
    a = ap.parse_args(argv)
    if a.quick:
        a.gib, a.batches, a.prefill, a.max_call_s = 0.25, "1,4,16", "64", 0.5
    if a.runs < 5:
        ap.error("--runs must be >= 5")
    cpus = parse_cpu_list(a.cpus) if a.cpus else list(ALLOWED_CPUS_AT_IMPORT)
    threads = parse_int_list(a.threads) if a.threads else sorted({1, len(cpus)})
    if max(threads) > len(cpus):
        ap.error(f"{max(threads)} threads need that many CPUs; --cpus gives {cpus}")
    a.cpus_list = cpus[:max(threads)]
    a.batches = parse_int_list(a.batches)
    a.prefill = parse_int_list(a.prefill) if a.prefill.strip() else []
    types = [K.TYPE_NAMES[K.type_id(t.strip())] for t in a.types.split(",") if t.strip()]
    avail = isa_mod.available()
    isas = (avail if a.isa == "all" else [s.strip() for s in a.isa.split(",")] if a.isa
            else [isa_mod.active()])
    for s in isas:
        if s not in avail:
            ap.error(f"ISA {s!r} is not available here (available: {', '.join(avail)})")

    t_start = time.perf_counter()
    # bandwidth first: before any Pool pins this thread, and before the weights take memory
    bw: dict[int, float] = {}
    bw_runs: dict[int, list[float]] = {}
    if a.bw is not None:
        bw = {t: a.bw for t in threads}
        probe_desc = f"given: {a.bw} GB/s"
    else:
        bw, bw_runs, probe_desc = probe_bandwidth(threads, cpus, a.bw_gib, log)

    pools = {t: K.Pool(t, cpus[:t]) for t in threads}
    run = Runner(pools)
    rng = np.random.default_rng(a.seed)
    tiny = random_rows("Q8_0", 8, 256, rng)
    for p in pools.values():  # one tiny call per pool so worker 0's tid shows in the pin plan
        K.matmul(p, "Q8_0", tiny, 256, np.ones((1, 256), np.float32))
    config = (f"types={','.join(types)} isa={','.join(isas)} gib={a.gib:g} "
              f"batches={','.join(map(str, a.batches))} prefill={','.join(map(str, a.prefill)) or '-'} "
              f"runs={a.runs} max_call_s={a.max_call_s:g} min_mib={a.min_mib}")
    h = header("gemma4cpu kernel bench (bench/bench_kernels.py)", threads=threads, pools=pools,
               extra={"bw": probe_desc, "config": config})
    results = []
    for t in types:
        results += bench_type(t, isas, threads, run, a, bw, rng)
    print_tables(results, bw)
    elapsed = time.perf_counter() - t_start
    print(f"total {elapsed:.0f} s")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"header": h, "bandwidth": {"gbs": bw, "runs": bw_runs},
                                            "results": results, "elapsed_s": elapsed}, indent=1) + "\n")
        log(f"wrote {a.json}")
    for p in pools.values():
        p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
