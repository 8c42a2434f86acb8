"""float64 numpy references of the per-token operations (spec 2.1, 2.4, 2.5): the specification
the C kernels are tested against. Slow and obvious on purpose; inputs of any float dtype are
computed in float64.
"""
from __future__ import annotations

import math

import numpy as np


def rmsnorm(x, w=None, eps: float = 1e-6) -> np.ndarray:
    """x (..., d) -> x / sqrt(mean(x^2) + eps) * w (plain weight; w None = weight-less, v_norm)."""
    x = np.asarray(x, dtype=np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * np.asarray(w, dtype=np.float64)


def gelu_tanh(x) -> np.ndarray:
    """tanh-approximated GELU (HF gelu_pytorch_tanh)."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_inv_freq(hd: int, n_rot: int, base: float, freq_factors=None) -> np.ndarray:
    """(hd/2,) angles per position: base^(-2i/n_rot) / factor_i for i < n_rot/2, else 0 (spec 2.5)."""
    i = np.arange(hd // 2, dtype=np.float64)
    inv = np.where(i < n_rot // 2, base ** (-2.0 * i / n_rot), 0.0)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
    return inv


def rope_neox(x, pos, inv_freq) -> np.ndarray:
    """NEOX / rotate-half RoPE: x (n, H, hd), pos (n,); pair (i, i + hd/2) rotated by pos * inv_freq[i]."""
    x = np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    ang = np.asarray(pos, dtype=np.float64)[:, None] * np.asarray(inv_freq, dtype=np.float64)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def visible_mask(q_pos, kv_pos, window: int) -> np.ndarray:
    """(n_q, n_slots) bool: slot s is visible from row i iff kv_pos[s] >= 0, kv_pos[s] <= q_pos[i]
    and (window == 0 or q_pos[i] - kv_pos[s] < window). Slots may be in any order (ring buffers)."""
    qp = np.asarray(q_pos, dtype=np.int64)[:, None]
    kp = np.asarray(kv_pos, dtype=np.int64)[None, :]
    vis = (kp >= 0) & (kp <= qp)
    if window:
        vis &= qp - kp < window
    return vis


def attention(q, k, v, q_pos, kv_pos, window: int = 0, scale: float = 1.0, softcap: float = 0.0,
              return_weights: bool = False):
    """Naive attention over a cache, float64, full score matrix (the flash kernel's oracle).

    q (n_q, Hq, hd) at positions q_pos (n_q,); k, v (n_slots, Hkv, hd) with kv_pos (n_slots,)
    (-1 = empty slot). Query head h reads kv head h // (Hq / Hkv). s = scale * q.k, then
    softcap * tanh(s / softcap) if softcap > 0; softmax over the visible slots; a row that sees
    no slot gives 0. Returns out (n_q, Hq, hd), and with return_weights also the normalised
    weights p (Hq, n_q, n_slots) and the scores s (Hq, n_q, n_slots) (masked entries: p 0, s -inf).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads is not a multiple of {hkv} kv heads")
    g = hq // hkv
    kk = np.repeat(k, g, axis=1)
    vv = np.repeat(v, g, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    vis = visible_mask(q_pos, kv_pos, window)[None]
    s = np.where(vis, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    tot = e.sum(axis=-1, keepdims=True)
    p = e / np.where(tot > 0, tot, 1.0)
    out = np.einsum("hij,jhd->ihd", p, vv)
    return (out, p, s) if return_weights else out
