"""Weight quantisers used by gemma4cpu.convert: float -> GGUF block bytes.

Q8_0 and BF16 come from gguf.quants (its reference code). Q4_K is ours: gguf-py can read Q4_K but
cannot write it. Layout (ggml ggml-common.h; csrc/g4_blocks.h block_q4_K, 144 bytes per 256 values):

    d     f16      super-block scale of the 6-bit sub-block scales
    dmin  f16      super-block scale of the 6-bit sub-block mins
    scales[12]     8 scales sc[j] + 8 mins m[j], 6 bits each:
                     j < 4 : sc = scales[j] & 63          m = scales[j+4] & 63
                     j >= 4: sc = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4
                             m  = (scales[j+4] >> 4) | (scales[j]   >> 6) << 4
    qs[128]        4-bit q: qs[32g+i] low nibble = element 64g+i, high nibble = element 64g+32+i

    value(element e of sub-block j) = d*sc[j] * q[e] - dmin*m[j]

The search per 32-value sub-block follows the idea of ggml's make_qkx2_quants (weighted least squares
over a sweep of candidate scales, importance w = rms(sub-block) + |x|), written fresh and vectorised
over all sub-blocks of a tensor.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

QK_K = 256
Q4_K_BYTES = 144


def _fit_sub_blocks(x: np.ndarray):
    """x (n, 32) float64 -> (scale (n,), mn (n,)) with x ~ scale*L + mn, L in 0..15, mn <= 0.

    Tries 21 candidate inverse scales around the min-max one; for each it rounds L, then solves
    the weighted least-squares problem for (scale, mn) given L (mn clamped to <= 0, since Q4_K
    stores a non-negative min that is subtracted). Keeps the candidate of least weighted error.
    """
    w = np.sqrt((x * x).mean(axis=1, keepdims=True)) + np.abs(x)  # (n, 32) importance
    xmin = np.minimum(x.min(axis=1), 0.0)  # (n,)
    xmax = x.max(axis=1)
    rng = xmax - xmin
    flat = rng <= 0
    rng = np.where(flat, 1.0, rng)

    best_scale = rng / 15.0
    best_mn = xmin.copy()
    L0 = np.clip(np.rint((x - xmin[:, None]) / best_scale[:, None]), 0, 15)
    best_err = (w * (best_scale[:, None] * L0 + best_mn[:, None] - x) ** 2).sum(axis=1)

    sw = w.sum(axis=1)
    wx = w * x
    sx = wx.sum(axis=1)
    sxx = (wx * x).sum(axis=1)
    shifted = x - xmin[:, None]  # (n, 32) >= 0
    for step in np.linspace(-1.0, 1.0, 21):
        iscale = (15.0 + step) / rng
        L = np.minimum(np.rint(iscale[:, None] * shifted), 15.0)  # shifted >= 0, so L >= 0
        wL = w * L
        sl = wL.sum(axis=1)
        sl2 = (wL * L).sum(axis=1)
        sxl = (wx * L).sum(axis=1)
        det = sw * sl2 - sl * sl
        ok = det > 0
        det = np.where(ok, det, 1.0)
        scale = (sw * sxl - sx * sl) / det
        mn = (sl2 * sx - sl * sxl) / det
        pos = mn > 0  # min must be <= 0: refit scale alone through the origin
        scale = np.where(pos, sxl / np.where(sl2 > 0, sl2, 1.0), scale)
        mn = np.where(pos, 0.0, mn)
        # sum w (scale L + mn - x)^2, expanded so no (n, 32) temporary is needed
        err = (scale * scale * sl2 + 2 * scale * mn * sl + mn * mn * sw
               - 2 * scale * sxl - 2 * mn * sx + sxx)
        better = ok & (scale > 0) & (err < best_err)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_mn = np.where(better, mn, best_mn)

    best_scale = np.where(flat, 0.0, best_scale)
    best_mn = np.where(flat, xmin, best_mn)
    return best_scale, best_mn


CHUNK_BLOCKS = 4096  # super-blocks per quantisation chunk: bounds the float64 temporaries (~50 MB)


def quantize_q4_K(data: np.ndarray) -> np.ndarray:
    """data (..., k) float, k % 256 == 0 -> uint8 (..., k/256*144) Q4_K rows (gguf raw layout)."""
    data = np.asarray(data, dtype=np.float32)
    if data.shape[-1] % QK_K:
        raise ValueError(f"Q4_K needs the row length to be a multiple of {QK_K}, got {data.shape}")
    lead = data.shape[:-1]
    flat = data.reshape(-1, QK_K)  # (nb, 256)
    out = np.empty((flat.shape[0], Q4_K_BYTES), dtype=np.uint8)
    for b0 in range(0, flat.shape[0], CHUNK_BLOCKS):
        out[b0:b0 + CHUNK_BLOCKS] = _quantize_q4_K_blocks(flat[b0:b0 + CHUNK_BLOCKS])
    return out.reshape(*lead, -1)


def _quantize_q4_K_blocks(data: np.ndarray) -> np.ndarray:
    """(nb, 256) float32 -> (nb, 144) uint8."""
    x = data.astype(np.float64)  # (nb, 256)
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32)
    scale, mn = _fit_sub_blocks(sub)
    scale = scale.reshape(nb, 8)
    mins = (-mn).reshape(nb, 8)  # >= 0

    # 6-bit sub-block scales relative to the block maximum, super-block scales in f16
    max_scale = scale.max(axis=1)
    max_min = mins.max(axis=1)
    inv_s = np.where(max_scale > 0, 63.0 / np.where(max_scale > 0, max_scale, 1.0), 0.0)
    inv_m = np.where(max_min > 0, 63.0 / np.where(max_min > 0, max_min, 1.0), 0.0)
    ls = np.clip(np.rint(scale * inv_s[:, None]), 0, 63).astype(np.uint8)  # (nb, 8)
    lm = np.clip(np.rint(mins * inv_m[:, None]), 0, 63).astype(np.uint8)
    d16 = (max_scale / 63.0).astype(np.float16)
    dmin16 = (max_min / 63.0).astype(np.float16)

    # requantise every value against the scales as they will be decoded
    d_eff = d16.astype(np.float64)[:, None] * ls  # (nb, 8)
    m_eff = dmin16.astype(np.float64)[:, None] * lm
    xs = x.reshape(nb, 8, 32)
    safe = np.where(d_eff > 0, d_eff, 1.0)
    q = np.clip(np.rint((xs + m_eff[:, :, None]) / safe[:, :, None]), 0, 15)
    q = np.where(d_eff[:, :, None] > 0, q, 0).astype(np.uint8).reshape(nb, 4, 2, 32)

    out = np.zeros((nb, Q4_K_BYTES), dtype=np.uint8)
    out[:, 0:2] = d16.reshape(nb, 1).view(np.uint8)
    out[:, 2:4] = dmin16.reshape(nb, 1).view(np.uint8)
    sc = np.zeros((nb, 12), dtype=np.uint8)
    sc[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    sc[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    sc[:, 8:12] = (ls[:, 4:8] & 15) | ((lm[:, 4:8] & 15) << 4)
    out[:, 4:16] = sc
    out[:, 16:] = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128)
    return out


def unpack_q4_K_scales(blocks: np.ndarray):
    """uint8 (nb, 144) -> (d_eff (nb, 8), m_eff (nb, 8)) float64: the per-sub-block step and min."""
    blocks = np.asarray(blocks, dtype=np.uint8).reshape(-1, Q4_K_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)  # (nb, 1)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
    s = blocks[:, 4:16]
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return d * sc, dmin * m


def quantize(data: np.ndarray, qtype: T) -> np.ndarray:
    """float array (..., k) -> array ready for GGUFWriter (float for F32/F16, uint8 bytes otherwise)."""
    if qtype == T.F32:
        return np.asarray(data, dtype=np.float32)
    if qtype == T.F16:
        return np.asarray(data, dtype=np.float32).astype(np.float16)
    if qtype == T.Q4_K:
        return quantize_q4_K(data)
    if qtype in (T.BF16, T.Q8_0):
        return gq.quantize(np.asarray(data, dtype=np.float32), qtype)
    raise ValueError(f"unsupported output type {qtype.name}")


def can_quantize(ne0: int, qtype: T) -> bool:
    """Whether a row of ne0 values fits whole blocks of qtype."""
    block = gq.GGML_QUANT_SIZES[qtype][0]
    return ne0 % block == 0
