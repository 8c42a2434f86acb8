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
(never below --min-mib, two times the L3 of this host), and marks the rows as reduced ('*').
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (ALLOWED_CPUS_AT_IMPORT, CpuNoise, fmt, header, md_table, median, parse_cpu_list,  # noqa: E402
                          parse_int_list)
from tools.numa.bandwidth import measure_runs, probe_kind  # noqa: E402

import numpy as np  # noqa: E402

from gemma4cpu import isa as isa_mod  # noqa: E402
from gemma4cpu import kernels as K  # noqa: E402
from gemma4cpu.synth import random_rows  # noqa: E402

FFN_ROWS, FFN_K = 21504, 5376  # Gemma 3/4 31B-class FFN: hidden 5376, intermediate 21504
MIB = 1 << 20
GIB = 1 << 30


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def slot_kind(isa: str, t: str) -> str:
    """'simd' or 'ref' for the product slot of type t in table isa."""
    if isa == "ref":
        return "ref"
    rep = isa_mod.table_report(isa)
    name = "gemm_" + t.lower()
    if t.endswith("_K"):
        name = "gemm_" + t[:-2].lower() + "_K"
    return rep.get(name, "?")


def build_weights(t: str, gib: float, rng) -> tuple[np.ndarray, int, int]:
    """(rows (copies*FFN_ROWS, row_bytes) uint8, copies, matrix_bytes)."""
    one = random_rows(t, FFN_ROWS, FFN_K, rng)
    mb = one.nbytes
    copies = max(1, math.ceil(gib * GIB / mb))
    w = np.empty((copies * FFN_ROWS, one.shape[1]), dtype=np.uint8)
    for c in range(copies):
        w[c * FFN_ROWS:(c + 1) * FFN_ROWS] = one
    del one
    return w, copies, mb


class Runner:
    def __init__(self, pools: dict[int, K.Pool]):
        self.pools = pools

    def call(self, t: str, threads: int, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> float:
        p = self.pools[threads]
        t0 = time.perf_counter()
        K.matmul(p, t, w, FFN_K, x, out=out)
        return time.perf_counter() - t0


def pick_rows(run: Runner, t: str, threads: int, w: np.ndarray, n: int, rng, max_call_s: float,
              min_rows: int, probe_rows: int, align: int) -> tuple[int, float]:
    """Rows of w to time so that one n-token call takes about max_call_s at most (>= min_rows).
    Returns (rows, estimated seconds of one n-token call on all rows)."""
    total = w.shape[0]
    probe_rows = min(total, probe_rows)
    x = rng.standard_normal((n, FFN_K), dtype=np.float32)
    out = np.empty((n, probe_rows), dtype=np.float32)
    run.call(t, threads, w[:probe_rows], x, out)  # warm (page tables, pool spin-up)
    dt = min(run.call(t, threads, w[:probe_rows], x, out) for _ in range(2))
    est_full = dt * total / probe_rows
    if est_full <= max_call_s:
        return total, est_full
    rows = int(total * max_call_s / est_full)
    rows = max(min_rows, rows // align * align)
    return min(total, rows), est_full


def bench_type(t: str, isas: list[str], threads: list[int], run: Runner, args, bw: dict[int, float], rng) -> list[dict]:
    t_build = time.perf_counter()
    w, copies, mat_bytes = build_weights(t, args.gib, rng)
    rb = w.shape[1]
    log(f"[{t}] built {copies} x {mat_bytes / MIB:.1f} MiB = {w.nbytes / GIB:.2f} GiB in "
        f"{time.perf_counter() - t_build:.1f} s")
    results = []
    tmin = min(threads)
    for isa in isas:
        with isa_mod.use(isa):
            kind = slot_kind(isa, t)
            # ---- batch group: one row count for every (threads, n), calibrated on the slowest case
            nmax = max(args.batches)
            min_rows = min(w.shape[0], max(1, args.min_mib * MIB // rb))
            rows, est = pick_rows(run, t, tmin, w, nmax, rng, args.max_call_s, min_rows,
                                  probe_rows=max(256, min(w.shape[0], 32 * MIB // rb)), align=FFN_ROWS // 16)
            wv = w[:rows]
            log(f"[{t}/{isa}] batch: {rows} of {w.shape[0]} rows ({wv.nbytes / MIB:.0f} MiB); est. full n={nmax} "
                f"call {est:.2f} s on {tmin} thread(s)")
            xs = {n: rng.standard_normal((n, FFN_K), dtype=np.float32) for n in args.batches}
            outs = {n: np.empty((n, rows), dtype=np.float32) for n in args.batches}
            cells = [(th, n) for th in threads for n in args.batches]
            for th, n in cells:  # warm-up round
                run.call(t, th, wv, xs[n], outs[n])
            times = {c: [] for c in cells}
            noise = CpuNoise(args.cpus_list).start()
            for r in range(args.runs):
                k0 = r % len(cells)
                for th, n in cells[k0:] + cells[:k0]:
                    times[(th, n)].append(run.call(t, th, wv, xs[n], outs[n]))
            others = noise.stop()
            for th in threads:
                t1 = median(times[(th, 1)]) if 1 in args.batches else None
                for n in args.batches:
                    m = median(times[(th, n)])
                    gbs = wv.nbytes / m / 1e9
                    results.append({
                        "group": "batch", "type": t, "isa": isa, "kernel": kind, "threads": th, "n": n,
                        "rows": rows, "rows_total": w.shape[0], "reduced": rows < w.shape[0], "k": FFN_K,
                        "bytes": wv.nbytes, "median_s": m, "runs_s": times[(th, n)], "gbs": gbs,
                        "pct_bw": 100.0 * gbs / bw[th] if bw.get(th) else None,
                        "ratio_n1": m / t1 if t1 else None,
                        "gflops": 2.0 * n * rows * FFN_K / m / 1e9,
                        "tok_s": n / m * rows / w.shape[0],  # tokens/s over the whole working set
                        "others_pct": others,
                    })
            del xs, outs
            # ---- prefill group: the single 21504 x 5376 matrix
            if args.prefill:
                mat = w[:FFN_ROWS]
                npmax = max(args.prefill)
                prows, pest = pick_rows(run, t, tmin, mat, npmax, rng, args.max_call_s, min_rows=256,
                                        probe_rows=512, align=64)
                mv = mat[:prows]
                log(f"[{t}/{isa}] prefill: {prows} of {FFN_ROWS} rows; est. full n={npmax} call {pest:.2f} s "
                    f"on {tmin} thread(s)")
                xs = {n: rng.standard_normal((n, FFN_K), dtype=np.float32) for n in args.prefill}
                outs = {n: np.empty((n, prows), dtype=np.float32) for n in args.prefill}
                cells = [(th, n) for th in threads for n in args.prefill]
                for th, n in cells:
                    run.call(t, th, mv, xs[n], outs[n])
                times = {c: [] for c in cells}
                noise = CpuNoise(args.cpus_list).start()
                for r in range(args.runs):
                    k0 = r % len(cells)
                    for th, n in cells[k0:] + cells[:k0]:
                        times[(th, n)].append(run.call(t, th, mv, xs[n], outs[n]))
                others = noise.stop()
                for th, n in cells:
                    m = median(times[(th, n)])
                    results.append({
                        "group": "prefill", "type": t, "isa": isa, "kernel": kind, "threads": th, "n": n,
                        "rows": prows, "rows_total": FFN_ROWS, "reduced": prows < FFN_ROWS, "k": FFN_K,
                        "bytes": mv.nbytes, "median_s": m, "runs_s": times[(th, n)],
                        "gflops": 2.0 * n * prows * FFN_K / m / 1e9,
                        "full_matrix_s": m * FFN_ROWS / prows,
                        "tok_s": n / (m * FFN_ROWS / prows),
                        "others_pct": others,
                    })
                del xs, outs
    del w
    gc.collect()
    return results


def print_tables(results: list[dict], bw: dict[int, float], file=sys.stdout):
    batch = [r for r in results if r["group"] == "batch"]
    if batch:
        rows = []
        for r in batch:
            star = "*" if r["reduced"] else ""
            rows.append([r["type"], f"{r['isa']} ({r['kernel']})", r["threads"], r["n"],
                         f"{r['bytes'] / MIB:.0f}{star}", fmt(r["median_s"] * 1e3, 2), fmt(r["gbs"], 2),
                         fmt(r["pct_bw"], 1), fmt(r["ratio_n1"], 2), fmt(r["gflops"], 1),
                         fmt(r["others_pct"], 0)])
        print("## GEMV / small-batch GEMM (same weights for every n)\n", file=file)
        print(md_table(["type", "isa (gemm)", "thr", "n", "MiB", "ms", "GB/s", "% of BW", "t(n)/t(1)",
                        "GFLOP/s", "others %"], rows, "llrrrrrrrrr"), file=file)
        print("\nGB/s = weight bytes read per call / median time; % of BW = against the probe's "
              "median for the same thread count" + (" (" + ", ".join(f"{t} thr {v:.1f} GB/s" for t, v in
                                                                      sorted(bw.items())) + ")" if bw else "")
              + ". '*' = a row prefix of the working set (calibrated to --max-call-s). others % = CPU time of "
              "the pinned CPUs used by other processes during that group's timed rounds (shared host).\n", file=file)
    pre = [r for r in results if r["group"] == "prefill"]
    if pre:
        rows = []
        for r in pre:
            star = "*" if r["reduced"] else ""
            rows.append([r["type"], f"{r['isa']} ({r['kernel']})", r["threads"], r["n"], f"{r['rows']}{star}",
                         fmt(r["median_s"] * 1e3, 2), fmt(r["gflops"], 2), fmt(r["full_matrix_s"] * 1e3, 1),
                         fmt(r["tok_s"], 1), fmt(r["others_pct"], 0)])
        print("## Prefill GEMM on one 21504 x 5376 matrix\n", file=file)
        print(md_table(["type", "isa (gemm)", "thr", "n", "rows", "ms", "GFLOP/s", "full-matrix ms", "tok/s",
                        "others %"], rows, "llrrrrrrrr"), file=file)
        print("\nGFLOP/s = 2*n*rows*5376 / median time; full-matrix ms and tok/s scale a reduced ('*') row "
              "count up to all 21504 rows.\n", file=file)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default: 1 and all --cpus)")
    ap.add_argument("--cpus", default=None, help="taskset-style CPU list; a T-thread pool uses the first T "
                                                 "(default: the process's allowed CPUs)")
    ap.add_argument("--types", default="Q4_K,Q8_0", help="weight types (default Q4_K,Q8_0; any of "
                    + ",".join(K.TYPE_IDS) + ")")
    ap.add_argument("--gib", type=float, default=1.0, help="weight working set per type in GiB (default 1)")
    ap.add_argument("--batches", default="1,2,4,8,16", help="token counts for the batch group")
    ap.add_argument("--prefill", default="64,512", help="token counts for prefill ('' to skip)")
    ap.add_argument("--runs", type=int, default=5, help="timed rounds, median reported (>= 5)")
    ap.add_argument("--isa", default=None, help="comma list of tables, or 'all' = every table this CPU "
                                                "runs (default: the active one, GEMMA4CPU_ISA)")
    ap.add_argument("--max-call-s", type=float, default=1.0,
                    help="time a row prefix when the largest call would exceed this (default 1.0 s)")
    ap.add_argument("--min-mib", type=int, default=64, help="smallest batch working set when reduced (MiB)")
    ap.add_argument("--bw-gib", type=float, default=2.0, help="bandwidth probe buffer (GiB, default 2)")
    ap.add_argument("--bw", type=float, default=None, help="skip the probe; use this GB/s for every thread count")
    ap.add_argument("--quick", action="store_true", help="0.25 GiB, n=1,4,16, prefill 64, 1 GiB probe, "
                                                         "0.5 s call cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="write header, bandwidth and every cell as JSON")
    a = ap.parse_args(argv)
    if a.quick:
        a.gib, a.batches, a.prefill, a.bw_gib, a.max_call_s = 0.25, "1,4,16", "64", 1.0, 0.5
    if a.runs < 5:
        ap.error("--runs must be >= 5")
    cpus = parse_cpu_list(a.cpus) if a.cpus else list(ALLOWED_CPUS_AT_IMPORT)
    a.cpus_list = cpus[:max(parse_int_list(a.threads))] if a.threads else cpus
    threads = parse_int_list(a.threads) if a.threads else sorted({1, len(cpus)})
    if max(threads) > len(cpus):
        ap.error(f"{max(threads)} threads need that many CPUs; --cpus gives {cpus}")
    a.batches = parse_int_list(a.batches)
    a.prefill = parse_int_list(a.prefill) if a.prefill.strip() else []
    types = [K.TYPE_NAMES[K.type_id(t.strip())] for t in a.types.split(",") if t.strip()]
    isas = isa_mod.available() if a.isa == "all" else ([s.strip() for s in a.isa.split(",")] if a.isa
                                                        else [isa_mod.active()])
    for s in isas:
        if s not in isa_mod.available():
            ap.error(f"ISA {s!r} is not available here (available: {', '.join(isa_mod.available())})")

    t_start = time.perf_counter()
    # bandwidth first: before any Pool pins this thread, and before the weights take memory
    bw: dict[int, float] = {}
    bw_runs: dict[int, list[float]] = {}
    if a.bw is not None:
        bw = {t: a.bw for t in threads}
    else:
        for t in threads:
            bw_runs[t] = measure_runs(t, cpus, a.bw_gib, runs=5)
            bw[t] = median(bw_runs[t])
            log(f"probe: {t} thread(s) {bw[t]:.1f} GB/s (runs {', '.join(f'{v:.1f}' for v in bw_runs[t])})")

    pools = {t: K.Pool(t, cpus[:t]) for t in threads}
    run = Runner(pools)
    rng = np.random.default_rng(a.seed)
    # one tiny call per pool so worker 0's tid shows in the pin plan
    tiny = random_rows("Q8_0", 8, 256, rng)
    for p in pools.values():
        K.matmul(p, "Q8_0", tiny, 256, np.ones((1, 256), np.float32))
    probe_desc = (f"{a.bw_gib:g} GiB, {probe_kind()} loads, median of 5: "
                  + ", ".join(f"{t} thr {v:.1f} GB/s" for t, v in sorted(bw.items()))) if a.bw is None else \
        f"given: {a.bw} GB/s"
    h = header("gemma4cpu kernel bench (bench/bench_kernels.py)", threads=threads, pools=pools,
               extra={"bw": probe_desc,
                      "config": f"types={','.join(types)} isa={','.join(isas)} gib={a.gib:g} "
                                f"batches={','.join(map(str, a.batches))} "
                                f"prefill={','.join(map(str, a.prefill)) or '-'} runs={a.runs} "
                                f"max_call_s={a.max_call_s:g}"})
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
