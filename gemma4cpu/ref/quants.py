"""Reference activation quantisers and exact float64 views of quantised data.

quantize_row_q8_K / quantize_row_q8_0 define the activation rounding every ISA must match bit
for bit (float32 arithmetic, round half to even = np.rint). Weight dequantisation is gguf's
own (`gguf.quants.dequantize`), the external oracle for our reading of the block layouts.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from gemma4cpu.ref.blocks import block_q8_0, block_q8_K

QK_K = 256
Q8K_TINY = np.float32(2.0 ** -80)


def quantize_row_q8_K(x: np.ndarray) -> np.ndarray:
    """x (k,) float32, k % 256 == 0 -> (k/256,) block_q8_K, exactly as the C kernels:
    iscale = -127/max (max = the signed element of largest magnitude, first on ties),
    q = min(127, rint(iscale*x)), d = 1/iscale, bsums over groups of 16. A block whose largest |x| is
    below Q8K_TINY = 2**-80 is all zeros with d = 0 (csrc/g4_blocks.h says why)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, QK_K)
    out = np.zeros(x.shape[0], dtype=block_q8_K)
    imax = np.abs(x).argmax(axis=1)
    mx = x[np.arange(x.shape[0]), imax]
    nz = np.abs(mx) >= Q8K_TINY
    with np.errstate(divide="ignore"):
        iscale = np.where(nz, np.float32(-127.0) / np.where(nz, mx, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(iscale[:, None] * x), np.float32(127)).astype(np.int8)
    q[~nz] = 0
    out["qs"] = q
    out["bsums"] = q.reshape(-1, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
    with np.errstate(divide="ignore"):
        out["d"] = np.where(nz, np.float32(1) / np.where(nz, iscale, np.float32(1)), np.float32(0))
    return out


def quantize_row_q8_0(x: np.ndarray) -> np.ndarray:
    """x (k,) float32, k % 32 == 0 -> block_q8_0: d = amax/127, q = rint(x * (1/d)), d as f16."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    out = np.zeros(x.shape[0], dtype=block_q8_0)
    d = (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    out["qs"] = np.rint(x * idv[:, None]).astype(np.int8)
    with np.errstate(over="ignore"):  # |x| > ~8e6 overflows the f16 scale, as in ggml
        out["d"] = d.astype(np.float16)
    return out


def dequant_act(blocks: np.ndarray) -> np.ndarray:
    """Quantised activation blocks -> exact float64 values (d * q)."""
    return (blocks["d"].astype(np.float64)[:, None] * blocks["qs"].astype(np.float64)).reshape(-1)


def act_error_bound(x: np.ndarray, kind: str) -> np.ndarray:
    """Per-element bound on |x - dequant(quantize(x))| (float64), derived:
    q8_K: x - d*q = d*(iscale*x - q) + x*(1 - d*iscale); |iscale*x - q| <= 1/2 + rounding of the
          product (u*|iscale*x|), |1 - d*iscale| <= u  =>  <= |d|/2 + 2u*|x|  (u = 2^-24);
          a block quantised to zero (amax < Q8K_TINY) errs by |x| itself.
    q8_0: q = rint(x*id), id = fl(1/d), stored d16 = fp16(d):  |x - d16*q| <= |x - d*q| + |d - d16|*|q|
          with |x - d*q| <= d/2 + 2u*|x| as above, |q| <= 127."""
    u = 2.0 ** -24
    x = np.asarray(x, dtype=np.float32)
    if kind == "q8_K":
        b = quantize_row_q8_K(x)
        d = np.repeat(np.abs(b["d"].astype(np.float64)), QK_K)
        ax = np.abs(x.astype(np.float64)).reshape(-1)
        return d / 2 + 2 * u * ax + np.where(d == 0, ax, 0.0)
    b = quantize_row_q8_0(x)
    xb = x.reshape(-1, 32).astype(np.float64)
    d32 = (np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)).astype(np.float32).astype(np.float64)
    d16 = b["d"].astype(np.float64)
    return (d32[:, None] / 2 + 2 * u * np.abs(xb) + np.abs(d32 - d16)[:, None] * 127).reshape(-1)


def dequantize(data: np.ndarray, type_name: str) -> np.ndarray:
    """gguf's dequantisation (float32) of raw rows (n, row_bytes) -> (n, k)."""
    return gq.dequantize(np.asarray(data), T[type_name])


def weight_magnitudes(data: np.ndarray, type_name: str) -> np.ndarray:
    """Per-element |d*sc*q| + |dmin*m| (float64): the magnitudes of the two terms whose
    difference a K-quant weight is; for other types |w|. Used to bound rounding errors."""
    w = np.abs(dequantize(data, type_name).astype(np.float64))
    if type_name not in ("Q4_K", "Q5_K"):
        return w
    blocks = np.asarray(data).view(np.uint8).reshape(-1, gq.GGML_QUANT_SIZES[T[type_name]][1])
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)  # (nb, 1)
    _, m = gq.Q4_K.get_scale_min(blocks[:, 4:16].copy())
    mins = np.repeat(dmin * m.astype(np.float64), 32, axis=1)           # (nb, 256)
    return (w.reshape(-1, QK_K) + 2 * mins).reshape(w.shape)            # |d sc q| <= |w| + |dmin m|
