"""Gemma 3 / Gemma 4 (dense) forward pass over the C kernels (spec section 2).

Matrix products go through one pool call each (gemma4cpu.kernels.matmul); the small per-token
vector work is C (RMSNorm, fused norm + RoPE and residual + norm: csrc/g4_ops.c, on the calling
thread; the gated GELU over the pool). Calls of up to LOOP_MAX_TOK tokens (decode, speculative
verify) run every layer in one C loop (csrc/g4_layers.c, gemma4cpu/_layers.pxi), which makes the
same calls in the same order as the Python loop of _forward_chunk (the same bits); longer calls
(prefill chunks) and models with experts or per-layer embeddings use the Python loop. Attention
is one C flash-attention call per layer over the KV cache (gemma4cpu.kv_cache: f16 by default,
f32/q8_0/q4_0 as options, sliding layers in a ring that allows rolling back rejected drafts). A call with more tokens than `max_batch` runs
through the whole network in chunks of `max_batch` (prefill); every kernel is batch-invariant, so
the chunking never changes a result.

Shapes: n = tokens in this call, D = n_embd, hd = head dim of the layer, Hq / Hkv heads.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import mmap as _mmap
import os
import sys
import threading
import time

import numpy as np

from gemma4cpu import _kernels
from gemma4cpu import kernels as K
from gemma4cpu import placement
from gemma4cpu import memory
from gemma4cpu import repack
from gemma4cpu.config import ModelConfig
from gemma4cpu.gguf_io import GGUFFile
from gemma4cpu.kv_cache import KVCache, kv_type_id
from gemma4cpu.weights import Mat, load_weights


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float, pool: K.Pool | None = None) -> np.ndarray:
    """x (..., d) float32 -> x * (mean(x^2) + eps)^-1/2 * w (weight-less when w is None), per row
    in C (gemma4cpu/_ops.pxi): one call, no temporaries; large calls split their rows over `pool`
    (the same bits)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    d = x.shape[-1]
    _kernels.rmsnorm_rows(x.reshape(-1, d), w, eps, out.reshape(-1, d), pool)
    return out


def gelu_mul(g: np.ndarray, u: np.ndarray, pool: K.Pool | None = None) -> np.ndarray:
    """gelu_tanh(g) * u for (n, d) float32 arrays, in one C call (gemma4cpu/_ops.pxi), split over
    `pool`'s workers when given (same bits: each element is computed on its own)."""
    out = np.empty(g.shape, np.float32)
    _kernels.gelu_mul(g, u, out, pool)
    return out


def norm_rope(x: np.ndarray, w: np.ndarray | None, eps: float, cos: np.ndarray, sin: np.ndarray,
              pool: K.Pool | None = None) -> np.ndarray:
    """apply_rope(rmsnorm(x, w, eps), cos, sin) for x (n, H, hd) in one C call per projection
    (gemma4cpu/_ops.pxi norm_rope): the same float32 ops, without numpy's temporaries."""
    n, h, hd = x.shape
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(n * h, hd)
    out = np.empty_like(x)
    _kernels.norm_rope(x, w, eps, cos, sin, h, out, pool)
    return out.reshape(n, h, hd)


def rope_inv_freq(hd: int, n_rot: int, base: float, freq_factors: np.ndarray | None) -> np.ndarray:
    """(hd/2,) float64 rotation frequencies base^(-2i/n_rot) / factor_i, 0 for i >= n_rot/2."""
    i = np.arange(hd // 2, dtype=np.float64)
    inv = np.where(i < n_rot // 2, base ** (-2.0 * i / n_rot), 0.0)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    return inv


def rope_tables(pos: np.ndarray, hd: int, n_rot: int, base: float, freq_factors: np.ndarray | None,
                inv: np.ndarray | None = None):
    """cos, sin (n, hd/2) for NEOX pairing (i, i + hd/2); rotation angle pos * base^(-2i/n_rot) / factor_i;
    dims with i >= n_rot/2 (or factor 1e30) are left unrotated (cos 1, sin 0). inv: rope_inv_freq's
    result for these arguments, when the caller keeps it."""
    if inv is None:
        inv = rope_inv_freq(hd, n_rot, base, freq_factors)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (n, H, hd) rotated in place-free NEOX style with cos/sin (n, hd/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


MAX_CTX = (1 << 31) - 1    # positions are int32 in the kernels (the memory check refuses what cannot fit)


def check_int(name: str, v, lo: int, hi: int) -> int:
    """v as an int in [lo, hi], or ValueError naming the parameter (bools and floats are refused:
    2.5 threads or n_ctx=True are mistakes, not values)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {v}")
    return int(v)


# Interrupt latency. Python runs a signal handler (Ctrl-C's KeyboardInterrupt) only between
# bytecodes, so the calling thread must come back from C often: no C call may do more than about
# SLICE_MACS multiply-adds or read more than SLICE_BYTES of weights per pool thread (measured on
# the 2-core dev box: longest call of a 270M prefill 30-65 ms, against 46 ms for one ffn product of
# a 256-token chunk and 88 ms for its LM head, 160 ms for attention at 2k context, before; costs
# 3-8% of prefill time there, halving the budget doubled that). Bigger products run as several calls:
# token slices first (multiples of the kernels' 16-token tile, never fewer than MIN_SLICE_TOKENS,
# so each weight row is still read once per 16+ tokens), then row slices. Results are bit-identical.
SLICE_MACS = 128 << 20
SLICE_BYTES = 64 << 20
MIN_SLICE_TOKENS = 16


def call_slices(n_tok: int, n_rows: int, k: int, row_bytes: int, threads: int) -> tuple[int, int]:
    """(tokens, rows) per C call for an (n_tok x k) . (k x n_rows) product on `threads` threads."""
    macs, nbytes = SLICE_MACS * max(1, threads), SLICE_BYTES * max(1, threads)
    per_tok = max(1, n_rows * k)
    if n_tok * per_tok <= macs:
        tok = n_tok
    else:
        tok = max(MIN_SLICE_TOKENS, macs // per_tok // MIN_SLICE_TOKENS * MIN_SLICE_TOKENS)
        tok = min(tok, n_tok)
    rows = min(n_rows, max(16, macs // max(1, tok * k)), max(16, nbytes // max(1, row_bytes)))
    rows = n_rows if rows >= n_rows else max(16, rows // 16 * 16)
    return tok, rows


_call_slices = functools.lru_cache(maxsize=4096)(call_slices)


def _pool_matmul(pool, tid, rows, k, x, out, r0, r1, placement):
    """Model._mm's C product (a module-level hook: bench/bench_model.py times the calls)."""
    pool.matmul(tid, rows, k, x, out, r0, r1, placement)


def _run_layers(loop, pool, x, pos, cos, sin, used):
    """The C layer loop of a decode / verify step (a module-level hook, like _pool_matmul)."""
    loop.run(pool, x, pos, cos, sin, used)


def build_layer_loop(cache: KVCache, n_embd: int, eps: float, max_tok: int, specs):
    """A C LayerLoop (gemma4cpu/_layers.pxi) over `cache` for the layers in `specs`, one
    (lw, nxt, rope, fields) each: lw and the next layer nxt (None for the last) with the dense layer's
    attributes (attn_q, attn_output, ffn_gate / ffn_up / ffn_down, attn_norm, attn_q_norm,
    post_attention_norm, ffn_norm, post_ffw_norm, layer_output_scale: a target's LayerWeights or an
    MTP assistant's layer), rope = (hd, n_rot, base, freq_factors), and `fields` the entries that
    depend on the model (n_head, hd, src, window, v_norm, attn_scale, k, v, k_norm).
    Returns (loop, rope) with rope the distinct tables' (hd, n_rot, base, inverse frequencies), the
    order loop_rope_tables feeds them to LayerLoop.run."""
    keys, rope, layers = [], [], []
    for lw, nxt, (hd, n_rot, base, ff), fields in specs:
        key = (hd, n_rot, base, id(ff))
        if key not in keys:  # the layers share two or three distinct tables
            keys.append(key)
            rope.append((hd, n_rot, base, rope_inv_freq(hd, n_rot, base, ff)))
        layers.append(dict(
            fields, rope=keys.index(key), q=lw.attn_q, o=lw.attn_output, gate=lw.ffn_gate, up=lw.ffn_up,
            down=lw.ffn_down, attn_norm=lw.attn_norm, q_norm=lw.attn_q_norm, post_attn_norm=lw.post_attention_norm,
            ffn_norm=lw.ffn_norm, post_ffw_norm=lw.post_ffw_norm, out_scale=float(lw.layer_output_scale),
            fuse_next=int(nxt is not None and lw.layer_output_scale == 1.0),
            next_attn_norm=nxt.attn_norm if nxt is not None else None))
    kv = [dict(k=cache.k[i], v=cache.v[i], pos=cache.pos[i], n_head_kv=s.n_head_kv, hd=s.head_dim)
          for i, s in enumerate(cache.specs)]
    return _kernels.LayerLoop(layers, kv, n_embd, float(eps), cache._tk, cache._tv, max_tok, len(keys)), rope


def loop_rope_tables(rope, pos: np.ndarray) -> tuple[tuple, tuple]:
    """(cos tables, sin tables) for LayerLoop.run at positions pos, from build_layer_loop's rope."""
    tables = [rope_tables(pos, hd, n_rot, base, None, inv) for hd, n_rot, base, inv in rope]
    return tuple(c for c, _ in tables), tuple(t for _, t in tables)


# Steps of up to LOOP_MAX_TOK tokens (decode, speculative verify) run the layers in C
# (csrc/g4_layers.c: same calls, same bits as the Python loop below, without ~15 Python-level calls
# a layer: measured 9-11 % of a 270M decode step with 2 threads). Longer chunks (prefill) keep the
# Python loop, whose product slicing bounds each C call for Ctrl-C. GEMMA4CPU_LAYER_LOOP=python
# turns the C loop off (for comparison and debugging).
LOOP_MAX_TOK = 16


def _env_choice(name: str, choices: dict[str, str]) -> str:
    """The value of environment variable `name`, one of `choices` (value -> what it means; the
    first is the default, also for an empty value), stripped and lower-cased. Anything else is
    refused, so that a misspelt value does not silently leave the default on."""
    default = next(iter(choices))
    v = os.environ.get(name, default).strip().lower() or default
    if v not in choices:
        raise ValueError(f"{name}={v!r}: expected " + " or ".join(f"{k!r} ({what})" for k, what in choices.items()))
    return v


def layer_loop_from_env() -> bool:
    """GEMMA4CPU_LAYER_LOOP: 'c' (default) or 'python'; anything else is refused."""
    return _env_choice("GEMMA4CPU_LAYER_LOOP", {"c": "default: the C layer loop",
                                                 "python": "the Python loop, for comparison"}) == "c"


# glibc gives a freed block above its mmap threshold (128 KiB, raised by itself only up to 32 MiB)
# back to the kernel at once, and trims free memory at the top of the heap above the trim threshold.
# A prefill chunk allocates and frees some ten arrays of 1-200 MB a layer, so every layer faulted its
# activations in anew: 50k minor faults (~200 MB) per 270M pp512, each zeroing a page and taking
# the address-space lock the other workers fault under too. Both thresholds raised, the blocks stay
# in the heap for the next layer and forward: no faults after the first forward, the same peak
# memory (which gemma4cpu.memory counts). Measured on the Zen 3 VM, 2 threads, same session:
# pp512 383 -> 479 and 391 -> 511 t/s (median of 4, two alternating pairs of processes).
MALLOC_MMAP_THRESHOLD = 256 << 20
MALLOC_TRIM_THRESHOLD = 512 << 20
_malloc_tuned: bool | None = None


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once; see above), unless
    GEMMA4CPU_MALLOC_TUNE=0. Returns whether they are raised: False with '0', or where the C library
    is not glibc (its mallopt refuses or is absent). Values other than '0' / '1' are refused."""
    global _malloc_tuned
    if _env_choice("GEMMA4CPU_MALLOC_TUNE", {"1": "default: raise glibc's mmap and trim thresholds",
                                             "0": "leave malloc alone"}) == "0":
        return bool(_malloc_tuned)
    if _malloc_tuned is None:
        _malloc_tuned = False
        try:
            import ctypes
            libc = ctypes.CDLL(None)
            if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt"):
                M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
                _malloc_tuned = (libc.mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) == 1
                                 and libc.mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD) == 1)
        except OSError:
            pass
    return _malloc_tuned


# The CPUs this process was allowed at import: a pool pins the thread that calls it, so reading the
# affinity later would see only that one CPU.
_ALLOWED_CPUS = sorted(os.sched_getaffinity(0))


def _make_pool(threads: int | None, cpus: list[int] | None) -> K.Pool:
    """The model's pool. Without a CPU list its workers are pinned one per CPU to the first
    `threads` CPUs this process may run on (and the calling thread to the first): measured here,
    an unpinned spinning worker that the scheduler puts beside the caller makes a small product
    cost ~270 us instead of ~33 us (2 threads, 256 x 640 Q8_0), which is 10x on a whole decode step
    of a small model. More threads than allowed CPUs run unpinned, without spinning."""
    allowed = _ALLOWED_CPUS
    if cpus is not None:
        cpus = [int(c) for c in cpus]
        if threads is not None and threads != len(cpus):
            raise ValueError(f"threads={threads} but {len(cpus)} CPUs given ({cpus}); give one CPU per thread")
        return K.Pool(len(cpus), cpus)
    threads = len(allowed) if threads is None else int(threads)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if threads <= len(allowed):
        return K.Pool(threads, allowed[:threads])
    return K.Pool(threads, None, 0)


class _LoadProgress:
    """Stage messages on stderr for a load that takes more than `after` seconds: silent for a quick
    load, then the current stage once a second until done, and a closing summary."""

    def __init__(self, path, enabled: bool, after: float = 1.0):
        self.path, self.enabled, self.after = str(path), enabled, after
        self.t0 = time.perf_counter()
        self.stage = "opening"
        self.shown = False
        self._stop = threading.Event()
        if enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self):
        if self._stop.wait(self.after):
            return
        while True:
            self.shown = True
            print(f"gemma4cpu: loading {self.path}: {self.stage} ({time.perf_counter() - self.t0:.1f} s)",
                  file=sys.stderr, flush=True)
            if self._stop.wait(1.0):
                return

    def done(self, summary: str | None):
        self._stop.set()
        if self.enabled:
            self._thread.join()
            if self.shown and summary:
                print(f"gemma4cpu: loaded {self.path}: {summary} in {time.perf_counter() - self.t0:.1f} s",
                      file=sys.stderr, flush=True)


class Model:
    """A loaded target model: `forward(tokens)` appends them to the cache and returns logits."""

    def _repack_q4k(self, copied: bool, mem_limit, pr, workers: int) -> None:
        """Repack the Q4_K layer matrices 8 rows at a time where GEMMA4CPU_REPACK and the active
        table say so (gemma4cpu.repack); self.repack reports what was done or why not. Mapped
        weights need new memory: counted in the memory check, and skipped in 'auto' mode (refused
        with '1') when it does not fit."""
        rp = self.repack
        ok, why = repack.decide(rp.mode, self._speculative)
        if ok and not copied:
            need = repack.new_bytes(self.w)
            if need:
                p = dataclasses.replace(self.memory_plan, extra={**self.memory_plan.extra,
                                                                 "repacked Q4_K weights": need})
                try:
                    memory.check(p, f"{self.file.path} with its Q4_K matrices repacked ({repack.ENV}={rp.mode})",
                                 mem_limit)
                    self.memory_plan = p
                except memory.InsufficientMemoryError:
                    if rp.mode == "1":
                        raise
                    ok, why = False, (f"no memory for the repacked copy ({need / 2**30:.2f} GiB); "
                                      f"{repack.ENV}=0 silences this")
        if not ok:
            rp.why = why
            return
        pr.stage = "repacking the Q4_K matrices"
        fm = getattr(self.file, "_mm", None)
        repack.apply(self.w, copied, workers=workers,
                     file_map=fm if isinstance(fm, _mmap.mmap) else None, report=rp)

    def __init__(self, path: str | os.PathLike, n_ctx: int = 4096, threads: int | None = None,
                 cpus: list[int] | None = None, cache_type_k: str = "f16", cache_type_v: str = "f16",
                 threads_batch: int | None = None, numa: str = "auto", numa_nodes: list[int] | None = None,
                 smt: bool = False, mmap: bool = True, mlock: bool = False, thp: bool = False, topology=None,
                 max_draft: int = 16, max_batch: int = 256, progress: bool = True, mem_limit=None,
                 swa_full: bool = False, memory_extra: dict | None = None, speculative: bool = False):
        """path: a GGUF file (or an already parsed GGUFFile). progress: print stage messages on
        stderr if loading takes more than a second. mem_limit: bytes (or '8G') this model may use,
        instead of the available memory (gemma4cpu.memory; GEMMA4CPU_MEM_LIMIT does the same).
        swa_full: sliding layers keep the whole context (KVCache swa_full). memory_extra: {name:
        bytes} the caller will hold beside the model (an assistant, ring checkpoints), counted in
        the memory check. speculative: the caller will verify draft batches (GEMMA4CPU_REPACK=auto
        then keeps Q4_K in row layout; gemma4cpu.repack)."""
        n_ctx = check_int("n_ctx", n_ctx, 1, MAX_CTX)
        max_batch = check_int("max_batch", max_batch, 1, 1 << 16)
        max_draft = check_int("max_draft", max_draft, 0, 1 << 10)
        kv_type_id(cache_type_k), kv_type_id(cache_type_v)  # refuse an unknown cache type before loading
        layer_loop = layer_loop_from_env()
        self.repack = repack.Report(mode=repack.mode_from_env())  # a bad value is refused before loading
        self._speculative = bool(speculative)
        tune_malloc()
        pr = _LoadProgress(getattr(path, "path", path), progress)
        summary = None
        try:
            self.file = path if isinstance(path, GGUFFile) else GGUFFile(path)
            pr.stage = "reading the configuration"
            self.cfg = ModelConfig.from_gguf(self.file)
            # the NUMA plan first: it decides how many copies of the weights placement makes
            planned = placement.make_plan(threads, cpus, threads_batch, numa, numa_nodes, smt, topology)
            copies = placement.weight_copies(planned[1], mmap, thp)
            # refuse before anything large exists (KV cache, copies of weights), not by the OOM killer
            self.memory_plan = memory.plan(self.file, self.cfg, n_ctx, cache_type_k, cache_type_v, max_draft,
                                           max_batch, copies=copies, swa_full=swa_full, extra=memory_extra)
            memory.check(self.memory_plan, f"{self.file.path} with n_ctx={n_ctx} "
                         f"({cache_type_k}/{cache_type_v} cache"
                         + (f", {copies} cop{'y' if copies == 1 else 'ies'} of the weights" if copies else "")
                         + ")", mem_limit)
            pr.stage = f"mapping the weights of {self.cfg.n_layer} layers"
            self.w = load_weights(self.file, self.cfg)
            self.n_ctx = n_ctx
            # mapped weights: repacked into new memory before placement, which then places it
            workers = max(1, min(16, planned[1].decode.threads))
            if not copies:
                self._repack_q4k(False, mem_limit, pr, workers)
            pr.stage = f"placing threads and weights (numa {numa})"
            # threads, pools and weight pages by the NUMA plan (gemma4cpu.numa, gemma4cpu.placement):
            # pool serves one-token calls, pool_batch (-tb) the others; warnings as NumaWarning
            self.numa = placement.setup(self.file, self.w, threads, cpus, threads_batch, numa, numa_nodes, smt,
                                        mmap, mlock, thp, topology, planned=planned)
            self.numa_plan, self.pool, self.pool_batch = self.numa.plan, self.numa.pool, self.numa.pool_batch
            self._pool = self.pool  # the pool of the call in progress (forward picks it)
            if copies:   # copies of the weights: repacked in place
                self._repack_q4k(True, mem_limit, pr, workers)
            self.max_batch = max_batch
            pr.stage = f"allocating the KV cache for {n_ctx} positions"
            try:
                self.cache = KVCache.from_config(self.cfg, n_ctx, max_draft=max_draft, max_batch=self.max_batch,
                                                 type_k=cache_type_k, type_v=cache_type_v, swa_full=swa_full)
            except MemoryError as e:
                raise MemoryError(f"not enough memory for a KV cache of {n_ctx} positions "
                                  f"({cache_type_k}/{cache_type_v}): {e}; lower n_ctx (-c) or use a "
                                  "quantized cache type (q8_0, q4_0)") from None
            self.numa.place_kv(self.cache)
            self._loop, self._loop_cache = None, None
            self._inv_freq = {}
            self.layer_loop = layer_loop
            summary = (f"{self.cfg.arch}, {self.cfg.n_layer} layers, {self.w.n_bytes / 2**30:.2f} GiB weights, "
                       f"KV cache {self.cache.nbytes / 2**20:.0f} MiB ({cache_type_k}/{cache_type_v})"
                       + (f", {self.repack.mats} Q4_K matrices repacked" if self.repack.done else ""))
        finally:
            pr.done(summary)

    def _mm(self, m: Mat, x: np.ndarray) -> np.ndarray:
        pool = self._pool
        tok_step, row_step = _call_slices(x.shape[0], m.n_out, m.n_in, m.rows.shape[1], pool.size)
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], m.n_out), np.float32)
        if tok_step >= x.shape[0] and row_step >= m.n_out:
            # straight to the pool: m.rows was checked when the weights were loaded, so the
            # kernels.matmul wrapper's per-call checks (type lookups, row view) are skipped; ~126
            # products per 270M token made them ~4 % of a decode step
            _pool_matmul(pool, m.type_id, m.rows, m.n_in, x, out, 0, m.n_out, m.placement)
            return out
        # a product too big for one C call (see call_slices): token slices, then row slices, all
        # bit-identical to the one call (every row and every token is computed on its own)
        for t0 in range(0, x.shape[0], tok_step):
            xs, ys = x[t0:t0 + tok_step], out[t0:t0 + tok_step]
            for r0 in range(0, m.n_out, row_step):
                K.matmul(pool, m.type_id, m.rows, m.n_in, xs, out=ys, r0=r0, r1=min(m.n_out, r0 + row_step),
                         placement=m.placement)
        return out

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(self.w.token_embd.rows[tokens])
        x = K.dequantize(self.w.token_embd.type_id, rows, self.cfg.n_embd)
        return x * np.float32(self.cfg.embed_scale)

    def _per_layer_inputs(self, tokens: np.ndarray, x0: np.ndarray) -> np.ndarray:
        """PLE (spec 2.3): ((RMSNorm(W_plmp x0 / sqrt(D)) + E_pl[tok] sqrt(Dp)) / sqrt(2)), (n, L, Dp)."""
        cfg, w = self.cfg, self.w
        L, Dp = cfg.n_layer, cfg.n_embd_per_layer
        rows = np.ascontiguousarray(w.per_layer_token_embd.rows[tokens])
        tok = K.dequantize(w.per_layer_token_embd.type_id, rows, L * Dp).reshape(-1, L, Dp)
        tok = tok * np.float32(math.sqrt(Dp))
        ctx = self._mm(w.per_layer_model_proj, x0).reshape(-1, L, Dp) * np.float32(cfg.n_embd ** -0.5)
        ctx = rmsnorm(ctx, w.per_layer_proj_norm, cfg.eps)
        return (ctx + tok) * np.float32(2 ** -0.5)

    def _moe(self, moe, h: np.ndarray) -> np.ndarray:
        """Expert branch (spec 2.7) on the residual h (n, D): router on RMSNorm0(h) * scale / sqrt(D),
        softmax over all experts, top-k renormalised, times the per-expert scale."""
        cfg = self.cfg
        r = rmsnorm(h, None, cfg.eps) * moe.ffn_gate_inp_scale * np.float32(cfg.n_embd ** -0.5)
        logits = self._mm(moe.ffn_gate_inp, r)                               # (n, E)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        top = np.argsort(-p, axis=1, kind="stable")[:, :moe.n_used]          # (n, k)
        wt = np.take_along_axis(p, top, axis=1)
        wt = wt / wt.sum(axis=1, keepdims=True) * moe.down_scale[top]
        e_in = rmsnorm(h, moe.pre_ffw_norm_2, cfg.eps)
        out = np.zeros_like(h)
        I = moe.gate_up[0].n_out // 2
        for e in np.unique(top):
            # one product per used expert over the tokens routed to it (a row's result does not
            # depend on which other tokens share the call: the kernels are batch-invariant)
            tok_idx, slot = np.nonzero(top == e)
            gu = self._mm(moe.gate_up[e], np.ascontiguousarray(e_in[tok_idx]))
            y = self._mm(moe.down[e], gelu_mul(gu[:, :I], gu[:, I:], self._pool))
            out[tok_idx] += wt[tok_idx, slot][:, None] * y
        return out

    def _attention(self, il: int, q: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """q (n, Hq, hd) at absolute positions pos -> (n, Hq*hd): one C call over the cache of
        kv_source[il], masked causally and, on sliding layers, to the window of the reading layer.
        Each query row is computed on its own (batch-invariant), as speculative decoding needs."""
        cfg = self.cfg
        window = cfg.sliding_window if cfg.is_swa[il] else 0
        q, pos = np.ascontiguousarray(q.reshape(q.shape[0], -1)), pos.astype(np.int32)
        n, n_slots = q.shape[0], self.cache.view(self.cache.source[il])[2].shape[0]
        step = max(1, SLICE_MACS * self._pool.size // max(1, 2 * n_slots * q.shape[1]))
        if step >= n:
            return self.cache.attention(self._pool, il, q, pos, cfg.n_head, scale=cfg.attn_scale, window=window)
        out = np.empty_like(q)             # query slices: each query row is computed on its own
        for i0 in range(0, n, step):
            self.cache.attention(self._pool, il, q[i0:i0 + step], pos[i0:i0 + step], cfg.n_head,
                                 scale=cfg.attn_scale, window=window, out=out[i0:i0 + step])
        return out

    def forward(self, tokens, logits_for: str = "last") -> tuple[np.ndarray, np.ndarray]:
        """Append `tokens` at positions cache.n .. cache.n + n - 1 (see _forward). One token runs on
        `pool`, more on `pool_batch`; the calling thread holds the pool's first CPU for the call."""
        self._pool = self.pool if np.size(tokens) == 1 else self.pool_batch
        with self._pool.pinned():
            return self._forward(tokens, logits_for)

    def _forward(self, tokens, logits_for: str = "last") -> tuple[np.ndarray, np.ndarray]:
        """Append `tokens` at positions cache.n .. cache.n + n - 1. Returns (logits, hidden):
        logits (m, V) for the last row ('last') or every row ('all'); hidden (n, D) post-final-norm.
        If the call fails or is interrupted part-way, the cache is rolled back to where it was."""
        cfg = self.cfg
        if logits_for not in ("last", "all"):
            raise ValueError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
        tokens = np.asarray(tokens).reshape(-1)
        if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"token ids must be integers, got dtype {tokens.dtype}")
        tokens = tokens.astype(np.int64)
        n = tokens.size
        if n == 0:
            raise ValueError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            raise ValueError(f"token ids must be in [0, {cfg.n_vocab}), got {tokens.min()}..{tokens.max()}")
        p0 = self.cache.n
        if p0 + n > self.n_ctx:
            raise ValueError(f"context full: {p0} + {n} tokens > n_ctx={self.n_ctx}")
        hidden = np.empty((n, cfg.n_embd), np.float32)
        try:
            for c0 in range(0, n, self.max_batch):
                c1 = min(n, c0 + self.max_batch)
                hidden[c0:c1] = self._forward_chunk(tokens[c0:c1], p0 + c0)
        except BaseException:
            self.cache.truncate(p0)  # every layer holds at least p0 positions
            raise
        rows = hidden[-1:] if logits_for == "last" else hidden
        logits = self._mm(self.w.output, rows)                        # (m, V)
        if cfg.final_softcap:
            c = np.float32(cfg.final_softcap)
            logits = np.tanh(logits / c) * c
        return logits, hidden

    def _forward_chunk(self, tokens: np.ndarray, p0: int) -> np.ndarray:
        """Run n <= max_batch tokens at positions p0.. through every layer; returns the
        post-final-norm hidden states (n, D)."""
        cfg, w = self.cfg, self.w
        n = tokens.size
        pos = np.arange(p0, p0 + n)
        loop = self._layer_loop() if n <= LOOP_MAX_TOK else None
        if loop is not None:
            return self._forward_loop(loop, tokens, pos)
        rope = {}
        x = self.embed(tokens)                                        # (n, D)
        a = None                                                      # attn_norm(x), when the last layer made it
        ple = self._per_layer_inputs(tokens, x) if cfg.n_embd_per_layer else None  # (n, L, Dp)
        pool = self._pool  # the norms split large calls (prefill chunks) over it: the same bits
        for il, lw in enumerate(w.layers):
            hd, hq = cfg.head_dim[il], cfg.n_head
            key = (hd, cfg.rope_dim[il], cfg.rope_base[il], id(lw.rope_freq_factors))
            if key not in rope:  # the layers share two or three distinct tables
                rope[key] = rope_tables(pos, hd, cfg.rope_dim[il], cfg.rope_base[il], lw.rope_freq_factors,
                                        self._inv(key, lw.rope_freq_factors))
            cos, sin = rope[key]
            if a is None:
                a = rmsnorm(x, lw.attn_norm, cfg.eps, pool)
            q = norm_rope(self._mm(lw.attn_q, a).reshape(n, hq, hd), lw.attn_q_norm, cfg.eps, cos, sin, pool)
            if lw.attn_k is not None:
                hkv = cfg.n_head_kv[il]
                kraw = self._mm(lw.attn_k, a).reshape(n, hkv, hd)
                vraw = self._mm(lw.attn_v, a).reshape(n, hkv, hd) if lw.attn_v is not None else kraw
                k = norm_rope(kraw, lw.attn_k_norm, cfg.eps, cos, sin, pool)
                v = rmsnorm(vraw, None, cfg.eps, pool) if cfg.v_norm else vraw
                self.cache.append(il, k, v)
            o = self._attention(il, q, pos)
            # x += rmsnorm(o W_o, post_attention_norm); f = rmsnorm(x, ffn_norm): one C call, in place
            # (x is this call's own array: embed, the numpy steps below and layer scaling make new ones)
            f = np.empty_like(x)
            _kernels.add_rmsnorm(x, self._mm(lw.attn_output, o), lw.post_attention_norm, cfg.eps, lw.ffn_norm, f, pool)
            m = self._mm(lw.ffn_down, gelu_mul(self._mm(lw.ffn_gate, f), self._mm(lw.ffn_up, f), self._pool))
            if lw.moe is not None:
                m = rmsnorm(m, lw.moe.post_ffw_norm_1, cfg.eps) + rmsnorm(
                    self._moe(lw.moe, x), lw.moe.post_ffw_norm_2, cfg.eps)
            # x += rmsnorm(m, post_ffw_norm), and the next layer's attn_norm of x in the same pass
            # when nothing else changes x in between
            nxt = w.layers[il + 1] if il + 1 < len(w.layers) else None
            fuse_next = nxt is not None and lw.ple is None and lw.layer_output_scale == 1.0
            a = np.empty_like(x) if fuse_next else None
            _kernels.add_rmsnorm(x, m, lw.post_ffw_norm, cfg.eps, nxt.attn_norm if fuse_next else None, a, pool)
            if lw.ple is not None:
                g = gelu_mul(self._mm(lw.ple.inp_gate, x), ple[:, il, :], self._pool)
                x = x + rmsnorm(self._mm(lw.ple.proj, g), lw.ple.post_norm, cfg.eps)
            if lw.layer_output_scale != 1.0:
                x = x * np.float32(lw.layer_output_scale)
        return rmsnorm(x, w.output_norm, cfg.eps, pool)               # (n, D)

    # ---- the C layer loop (decode and verify steps) -------------------------------------------------
    def _inv(self, key, freq_factors) -> np.ndarray:
        """rope_inv_freq for a rope key (hd, n_rot, base, id(factors)), computed once."""
        inv = self._inv_freq.get(key)
        if inv is None:
            inv = self._inv_freq[key] = rope_inv_freq(key[0], key[1], key[2], freq_factors)
        return inv

    def _layer_loop(self):
        """The C layer loop for this model and cache (built on first use), or None where the Python
        loop must run: GEMMA4CPU_LAYER_LOOP=python, or a layer with experts or per-layer embeddings."""
        if not self.layer_loop:
            return None
        if self._loop_cache is self.cache:
            return self._loop
        cfg, w, cache = self.cfg, self.w, self.cache
        loop = None
        if not cfg.n_embd_per_layer and all(lw.moe is None and lw.ple is None for lw in w.layers):
            specs = []
            for il, lw in enumerate(w.layers):
                src = cache.source[il]
                if lw.attn_k is not None and src != il:
                    raise ValueError(f"layer {il} has its own K/V but reads cache {src}")
                specs.append((lw, w.layers[il + 1] if il + 1 < len(w.layers) else None,
                              (cfg.head_dim[il], cfg.rope_dim[il], cfg.rope_base[il], lw.rope_freq_factors),
                              dict(n_head=cfg.n_head, hd=cfg.head_dim[il], src=src,
                                   window=cfg.sliding_window if cfg.is_swa[il] else 0, v_norm=int(bool(cfg.v_norm)),
                                   attn_scale=float(cfg.attn_scale), k=lw.attn_k,
                                   v=lw.attn_v if lw.attn_k is not None else None, k_norm=lw.attn_k_norm)))
            loop, self._loop_rope = build_layer_loop(cache, cfg.n_embd, cfg.eps, LOOP_MAX_TOK, specs)
        self._loop, self._loop_cache = loop, self.cache
        return loop

    def _forward_loop(self, loop, tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """_forward_chunk's layers in one C loop (n <= LOOP_MAX_TOK tokens): the cache bookkeeping
        first (KVCache.reserve: the same checks as append, nothing changed if one fails), then the
        layers, then the final norm."""
        x = self.embed(tokens)                                        # (n, D), this call's own array
        used = self.cache.reserve(tokens.size)
        cos, sin = loop_rope_tables(self._loop_rope, pos)
        _run_layers(loop, self._pool, x, pos.astype(np.int32), cos, sin, used)
        return rmsnorm(x, self.w.output_norm, self.cfg.eps)           # (n, D)
