"""Python-facing kernel API: numpy in, numpy out, over the active C table (gemma4cpu.isa).

Weights are passed as raw GGUF rows: a uint8 array (n_rows, row_bytes), which is what
gguf.GGUFReader gives for quantised tensors (`as_rows` turns float tensors into that view
without copying). `k` is the number of elements per row.
"""
from __future__ import annotations

import numpy as np

from gemma4cpu import _kernels
from gemma4cpu._kernels import Pool, RowPlacement  # noqa: F401  (re-exported)

TYPE_IDS = dict(_kernels.TYPE_IDS)          # the GGUF types the kernels compute with
# gemma4cpu's own layout (not in GGUF files): Q4_K with 8 rows interleaved, made by repack_q4_K_r8
Q4_K_R8 = _kernels.TYPE_Q4_K_R8
TYPE_NAMES = {v: k for k, v in TYPE_IDS.items()} | {Q4_K_R8: "Q4_K_R8"}


def type_id(t) -> int:
    """ggml type id from an int, a gguf.GGMLQuantizationType or a name like 'Q4_K'."""
    if isinstance(t, str):
        if t.upper() == "Q4_K_R8":
            return Q4_K_R8
        try:
            return TYPE_IDS[t] if t in TYPE_IDS else TYPE_IDS[{k.upper(): k for k in TYPE_IDS}[t.upper()]]
        except KeyError:
            raise ValueError(f"unsupported weight type {t!r}; supported: {', '.join(TYPE_IDS)}") from None
    t = int(t)
    if t not in TYPE_NAMES:
        raise ValueError(f"unsupported weight type id {t}; supported: {', '.join(TYPE_IDS)}")
    return t


def type_info(t) -> tuple[int, int, int, str]:
    """(block_size, block_bytes, k_multiple, activation format) of a weight type."""
    return _kernels.type_info(type_id(t))


def row_bytes(t, k: int) -> int:
    bs, bb, _, _ = type_info(t)
    if k % bs:
        raise ValueError(f"k={k} is not a multiple of the {TYPE_NAMES[type_id(t)]} block size {bs}")
    return k // bs * bb


def as_rows(data: np.ndarray, t, k: int) -> np.ndarray:
    """View tensor data as (n_rows, row_bytes) uint8 without copying (C-contiguous input)."""
    rb = row_bytes(t, k)
    a = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if a.size % rb:
        raise ValueError(f"{a.size} bytes is not a whole number of {rb}-byte rows")
    return a.reshape(-1, rb)


def quantize_act(t, x: np.ndarray) -> np.ndarray:
    """Activation rows x (n, k) float32 -> (n, act_row_bytes) uint8 in the format that weight
    type t multiplies with (Q8_K for K-quants, Q8_0 for the 32-blocks)."""
    tid = type_id(t)
    x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
    out = np.empty((x.shape[0], _kernels.act_row_bytes(tid, x.shape[1])), dtype=np.uint8)
    _kernels.quantize_act(tid, x, out)
    return out


def dequantize(t, w: np.ndarray, k: int) -> np.ndarray:
    """Raw rows (n_rows, row_bytes) -> float32 (n_rows, k), bit-identical to gguf.quants."""
    tid = type_id(t)
    w = as_rows(w, tid, k)
    out = np.empty((w.shape[0], k), dtype=np.float32)
    if tid == Q4_K_R8:
        w, tid = unpack_q4_K_r8(w, k), TYPE_IDS["Q4_K"]
    _kernels.dequantize_rows(tid, w, k, out)
    return out


def repack_q4_K_r8(w: np.ndarray, k: int, out: np.ndarray | None = None) -> np.ndarray:
    """Q4_K rows (n_rows, row_bytes), n_rows a multiple of 8 -> the same bytes as Q4_K_R8 (the
    8 rows of each group interleaved, csrc/g4_blocks.h), into `out` (may be `w`: in place)."""
    w = as_rows(w, "Q4_K", k)
    out = np.empty_like(w) if out is None else out
    _kernels.repack_q4_K_r8(w, out, k)
    return out


def unpack_q4_K_r8(w: np.ndarray, k: int, out: np.ndarray | None = None) -> np.ndarray:
    """The inverse of repack_q4_K_r8: Q4_K_R8 rows -> Q4_K rows."""
    w = as_rows(w, Q4_K_R8, k)
    out = np.empty_like(w) if out is None else out
    _kernels.unpack_q4_K_r8(w, out, k)
    return out


def gemm_rows(t, w: np.ndarray, k: int, xa: np.ndarray, y: np.ndarray, r0: int = 0, r1: int | None = None):
    """Single-threaded direct call of the product on rows [r0, r1) with activations `xa` already
    in the product's format (quantize_act output; float32 rows for float weights)."""
    tid = type_id(t)
    w = as_rows(w, tid, k)
    xa = np.ascontiguousarray(xa)
    if xa.dtype == np.float32:
        xa = xa.view(np.uint8)
    _kernels.gemm_rows(tid, w, k, xa, y, r0, w.shape[0] if r1 is None else r1)
    return y


def matmul(pool: Pool, t, w: np.ndarray, k: int, x: np.ndarray, out: np.ndarray | None = None,
           r0: int = 0, r1: int | None = None, placement: RowPlacement | None = None) -> np.ndarray:
    """y = x @ W.T over the pool: w raw rows (n_rows, row_bytes), x (n_tok, k) float32 ->
    y (n_tok, n_rows) float32. Activations are quantised inside the call as the type requires.
    placement: which worker group computes which rows, from which copy (NUMA; gemma4cpu.numa)."""
    tid = type_id(t)
    w = as_rows(w, tid, k)
    x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
    if out is None:
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    pool.matmul(tid, w, k, x, out, r0, w.shape[0] if r1 is None else r1, placement)
    return out
