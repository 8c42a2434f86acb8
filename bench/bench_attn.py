"""Flash attention alone (gemma4cpu._kernels.flash_attn): the active ISA's kernel on Gemma-shaped
calls, one pool, the best and median of --reps calls per shape, GFLOP/s (4 x visible slots x hd
flops per (row, head)) and a hash of the output bytes (equal hashes = bit-identical results).

    python bench/bench_attn.py [--shapes prefill-270m,verify-31b-swa,...] [--kv f16] [--threads 1]
    python bench/bench_attn.py --against /tmp/old   # A/B: another build of the package, alternated

--against DIR runs each shape in fresh processes, alternately with PYTHONPATH=DIR (a directory
holding another build's `gemma4cpu/` package, e.g. a copy of HEAD's with its compiled .so) and
with this checkout, --rounds times, and prints the ratio of the minima and of the medians
(new / old); on a shared, noisy host that alternation is what makes the ratio hold.

A shape is a preset name or ROWS:SLOTS:H:HKV:HD[:WINDOW]: ROWS queries at the last ROWS
positions of a cache of SLOTS positions in slot order (causal), H query heads over HKV kv heads.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__" and not os.environ.get("G4_BENCH_ATTN_CHILD"):
    sys.path.insert(0, ROOT)

# rows, slots, H, Hkv, hd, window: per-head costs of the real models (31B / 26B sliding layers have
# 2 query heads per kv head, full layers 8 at hd 512; Gemma 3 270M 4 over 1), fewer heads so that a
# 2-CPU host runs them in seconds (time scales with the number of kv groups)
PRESETS = {
    "prefill-270m": (512, 512, 4, 1, 256, 0),          # Gemma 3 270M, pp512 (full-attention layer)
    "prefill-31b-swa": (1024, 1024, 4, 2, 256, 1024),  # 31B sliding layer, 1024-token prompt
    "prefill-31b-full": (512, 512, 8, 1, 512, 0),      # 31B full layer (hd 512)
    "verify-31b-swa": (4, 4096, 4, 2, 256, 0),         # 4-token verify batch after 4096 positions
    "decode-31b-swa": (1, 4096, 4, 2, 256, 0),         # one token after 4096 positions
}
DEFAULT = "prefill-270m,prefill-31b-swa,prefill-31b-full,verify-31b-swa,decode-31b-swa"


def parse_shape(s: str):
    if s in PRESETS:
        return PRESETS[s]
    try:
        v = [int(x) for x in s.split(":")]
    except ValueError:
        v = []
    if len(v) not in (5, 6) or min(v[:5]) < 1 or (len(v) == 6 and v[5] < 0):
        raise ValueError(f"shape {s!r}: a preset ({', '.join(PRESETS)}) or ROWS:SLOTS:H:HKV:HD[:WINDOW]")
    rows, slots, H, Hkv, hd = v[:5]
    if rows > slots or H % Hkv or hd % 32:
        raise ValueError(f"shape {s!r}: need ROWS <= SLOTS, H a multiple of HKV, HD a multiple of 32")
    return (*v, 0) if len(v) == 5 else tuple(v)


def run_one(shape, kv: str, threads: int, reps: int) -> dict:
    """Time one shape in this process: {'min_ms', 'median_ms', 'gflops', 'hash'}."""
    from gemma4cpu import _kernels
    from gemma4cpu.kv_cache import KV_TYPES

    rows, slots, H, Hkv, hd, window = shape
    rng = np.random.default_rng(0)
    t = KV_TYPES[kv]

    def store(x):
        buf = np.zeros((slots, _kernels.kv_slot_bytes(t, Hkv, hd)), np.uint8)
        _kernels.kv_store(t, x, Hkv, hd, buf, np.arange(slots, dtype=np.int64))
        return buf

    kb = store(rng.standard_normal((slots, Hkv * hd), dtype=np.float32))
    vb = store(rng.standard_normal((slots, Hkv * hd), dtype=np.float32))
    q = rng.standard_normal((rows, H * hd), dtype=np.float32)
    kv_pos = np.arange(slots, dtype=np.int32)
    q_pos = kv_pos[slots - rows:].copy()
    vis = np.minimum(q_pos + 1, window if window else slots).astype(np.float64)  # visible slots per row
    flops = 4.0 * vis.sum() * hd * H
    out = np.zeros_like(q)
    pool = _kernels.Pool(threads)
    args = (q, q_pos, kb, vb, kv_pos, t, t, H, Hkv, hd, window, 1.0 / np.sqrt(hd), 0.0)
    try:
        _kernels.flash_attn(pool, *args, out)  # warm-up
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            _kernels.flash_attn(pool, *args, out)
            ts.append(time.perf_counter() - t0)
    finally:
        pool.close()
    ts.sort()
    return {"min_ms": ts[0] * 1e3, "median_ms": ts[len(ts) // 2] * 1e3, "gflops": flops / ts[0] / 1e9,
            "hash": hashlib.sha1(out.tobytes()).hexdigest()[:10]}


def child(shape_s: str, a, pythonpath: str | None) -> dict:
    env = dict(os.environ, G4_BENCH_ATTN_CHILD="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, ROOT) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", shape_s, "--kv", a.kv,
           "--threads", str(a.threads), "--reps", str(a.reps)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"bench_attn child failed ({'old' if pythonpath else 'new'} build, {shape_s}):\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT, help=f"comma-separated presets or ROWS:SLOTS:H:HKV:HD[:WINDOW] "
                    f"(default {DEFAULT})")
    ap.add_argument("--kv", default="f16", choices=["f16", "f32", "q8_0", "q4_0"], help="K and V cache type")
    ap.add_argument("--threads", type=int, default=1, help="pool threads (default 1)")
    ap.add_argument("--reps", type=int, default=15, help="timed calls per shape and process (default 15)")
    ap.add_argument("--against", metavar="DIR", help="A/B against the gemma4cpu package under DIR")
    ap.add_argument("--rounds", type=int, default=5, help="--against: alternated process pairs (default 5)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child mode: one shape, JSON on stdout
    a = ap.parse_args(argv)
    if a.threads < 1 or a.reps < 1 or a.rounds < 1:
        ap.error("--threads, --reps and --rounds must be >= 1")
    if a.one:
        print(json.dumps(run_one(parse_shape(a.one), a.kv, a.threads, a.reps)))
        return 0
    names = [s.strip() for s in a.shapes.split(",") if s.strip()]
    try:
        shapes = [parse_shape(s) for s in names]
    except ValueError as e:
        ap.error(str(e))
    if a.against and not os.path.isdir(os.path.join(a.against, "gemma4cpu")):
        ap.error(f"--against {a.against}: no gemma4cpu package directory there")

    from bench.common import header
    from gemma4cpu import _kernels

    header("gemma4cpu flash attention bench (bench/bench_attn.py)", threads=[a.threads],
           extra={"kv": f"{a.kv}; avx2 blocks of {_kernels.attn_block('avx2')} slots, "
                        f"ref / avx512 {_kernels.attn_block('ref')}",
                  "pinning": "pool threads not pinned by the bench: they run on the allowed CPUs above (taskset)",
                  "against": a.against or "-"})
    if not a.against:
        print("| shape | rows x slots, H / Hkv x hd, window | min ms | median ms | GFLOP/s | hash |")
        print("|:---|:---|---:|---:|---:|:---|")
        for name, sh in zip(names, shapes):
            r = run_one(sh, a.kv, a.threads, a.reps)
            print(f"| {name} | {sh[0]} x {sh[1]}, {sh[2]} / {sh[3]} x {sh[4]}, {sh[5] or '-'} | {r['min_ms']:.4g} | "
                  f"{r['median_ms']:.4g} | {r['gflops']:.1f} | {r['hash']} |", flush=True)
        return 0
    print("| shape | old min / median ms | new min / median ms | new/old (min) | new/old (median) | same bits |")
    print("|:---|---:|---:|---:|---:|:---|")
    for name in names:
        old, new = [], []
        for _ in range(a.rounds):
            old.append(child(name, a, os.path.abspath(a.against)))
            new.append(child(name, a, None))
        om = sorted(r["min_ms"] for r in old)
        nm = sorted(r["min_ms"] for r in new)
        same = len({r["hash"] for r in old + new}) == 1
        print(f"| {name} | {om[0]:.4g} / {om[len(om) // 2]:.4g} | {nm[0]:.4g} / {nm[len(nm) // 2]:.4g} | "
              f"{nm[0] / om[0]:.3f} | {nm[len(nm) // 2] / om[len(om) // 2]:.3f} | {'yes' if same else 'no'} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
