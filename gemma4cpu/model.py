"""Gemma 3 / Gemma 4 (dense) forward pass over the C kernels (spec section 2).

Matrix products go through one pool call each (gemma4cpu.kernels.matmul); the small per-token
vector work (norms, RoPE, activations) is numpy on preallocated-size arrays. Attention is a
numpy reference over the cache for now; the C flash-attention kernel replaces it.

Shapes: n = tokens in this call, D = n_embd, hd = head dim of the layer, Hq / Hkv heads.
"""
from __future__ import annotations

import math
import os

import numpy as np

from gemma4cpu import kernels as K
from gemma4cpu.config import ModelConfig
from gemma4cpu.gguf_io import GGUFFile
from gemma4cpu.weights import Mat, load_weights


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x (..., d) float32 -> x * (mean(x^2) + eps)^-1/2 * w (weight-less when w is None)."""
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float32)
    y = x * (1.0 / np.sqrt(ms + np.float32(eps))).astype(np.float32)
    return y * w if w is not None else y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def rope_tables(pos: np.ndarray, hd: int, n_rot: int, base: float, freq_factors: np.ndarray | None):
    """cos, sin (n, hd/2) for NEOX pairing (i, i + hd/2); rotation angle pos * base^(-2i/n_rot) / factor_i;
    dims with i >= n_rot/2 (or factor 1e30) are left unrotated (cos 1, sin 0)."""
    half = hd // 2
    i = np.arange(half, dtype=np.float64)
    inv = np.where(i < n_rot // 2, base ** (-2.0 * i / n_rot), 0.0)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (n, H, hd) rotated in place-free NEOX style with cos/sin (n, hd/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


class KVCache:
    """Per producing layer, K and V rows by absolute position (float32, n_ctx positions)."""

    def __init__(self, cfg: ModelConfig, n_ctx: int):
        self.n_ctx = n_ctx
        self.k = {}
        self.v = {}
        for il in range(cfg.n_layer_kv):
            shape = (n_ctx, cfg.n_head_kv[il], cfg.head_dim[il])
            self.k[il] = np.zeros(shape, np.float32)
            self.v[il] = np.zeros(shape, np.float32)
        self.n = 0  # positions [0, n) are valid

    def truncate(self, n: int):
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate a cache of {self.n} positions to {n}")
        self.n = n


class Model:
    """A loaded target model: `forward(tokens)` appends them to the cache and returns logits."""

    def __init__(self, path: str | os.PathLike, n_ctx: int = 4096, threads: int | None = None,
                 cpus: list[int] | None = None):
        self.file = GGUFFile(path)
        self.cfg = ModelConfig.from_gguf(self.file)
        self.w = load_weights(self.file, self.cfg)
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        self.n_ctx = n_ctx
        if threads is None:
            threads = len(cpus) if cpus else len(os.sched_getaffinity(0))
        self.pool = K.Pool(threads, cpus)
        self.cache = KVCache(self.cfg, n_ctx)

    def _mm(self, m: Mat, x: np.ndarray) -> np.ndarray:
        return K.matmul(self.pool, m.type_id, m.rows, m.n_in, x)

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
            y = self._mm(moe.down[e], gelu_tanh(gu[:, :I]) * gu[:, I:])
            out[tok_idx] += wt[tok_idx, slot][:, None] * y
        return out

    def _attention(self, il: int, q: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """q (n, Hq, hd) at absolute positions pos -> (n, Hq*hd), over the cache of kv_source[il]."""
        cfg = self.cfg
        src = cfg.kv_source[il]
        n_kv = int(pos[-1]) + 1
        K_ = self.cache.k[src][:n_kv]            # (n_kv, Hkv, hd)
        V_ = self.cache.v[src][:n_kv]
        g = cfg.n_head // cfg.n_head_kv[src]
        kpos = np.arange(n_kv)
        mask = kpos[None, :] <= pos[:, None]      # (n, n_kv) causal
        if cfg.is_swa[il]:
            mask &= (pos[:, None] - kpos[None, :]) < cfg.sliding_window
        out = np.empty(q.shape, np.float32)
        # one query row at a time (matrix-vector products): a row's result must not depend on
        # how many rows share the call, or greedy speculative decoding would drift from plain
        # decoding (quantised activations turn last-bit differences into whole quantisation steps)
        for i in range(q.shape[0]):
            vis = np.flatnonzero(mask[i])
            for h in range(cfg.n_head):
                kh = np.ascontiguousarray(K_[vis, h // g, :])
                s = (kh @ q[i, h]) * np.float32(cfg.attn_scale)         # (n_vis,)
                s = np.exp(s - s.max())
                s /= s.sum()
                out[i, h] = s @ V_[vis, h // g, :]
        return out.reshape(q.shape[0], -1)

    def forward(self, tokens, logits_for: str = "last") -> tuple[np.ndarray, np.ndarray]:
        """Append `tokens` at positions cache.n .. cache.n + n - 1. Returns (logits, hidden):
        logits (m, V) for the last row ('last') or every row ('all'); hidden (n, D) post-final-norm."""
        cfg, w = self.cfg, self.w
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = tokens.size
        if n == 0:
            raise ValueError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            raise ValueError(f"token ids must be in [0, {cfg.n_vocab}), got {tokens.min()}..{tokens.max()}")
        p0 = self.cache.n
        if p0 + n > self.n_ctx:
            raise ValueError(f"context full: {p0} + {n} tokens > n_ctx={self.n_ctx}")
        pos = np.arange(p0, p0 + n)
        x = self.embed(tokens)                                        # (n, D)
        ple = self._per_layer_inputs(tokens, x) if cfg.n_embd_per_layer else None  # (n, L, Dp)
        for il, lw in enumerate(w.layers):
            hd, hq = cfg.head_dim[il], cfg.n_head
            cos, sin = rope_tables(pos, hd, cfg.rope_dim[il], cfg.rope_base[il], lw.rope_freq_factors)
            a = rmsnorm(x, lw.attn_norm, cfg.eps)
            q = self._mm(lw.attn_q, a).reshape(n, hq, hd)
            q = apply_rope(rmsnorm(q, lw.attn_q_norm, cfg.eps), cos, sin)
            if lw.attn_k is not None:
                hkv = cfg.n_head_kv[il]
                kraw = self._mm(lw.attn_k, a).reshape(n, hkv, hd)
                vraw = self._mm(lw.attn_v, a).reshape(n, hkv, hd) if lw.attn_v is not None else kraw
                k = apply_rope(rmsnorm(kraw, lw.attn_k_norm, cfg.eps), cos, sin)
                v = rmsnorm(vraw, None, cfg.eps) if cfg.v_norm else vraw
                self.cache.k[il][p0:p0 + n] = k
                self.cache.v[il][p0:p0 + n] = v
            o = self._attention(il, q, pos)
            x = x + rmsnorm(self._mm(lw.attn_output, o), lw.post_attention_norm, cfg.eps)
            f = rmsnorm(x, lw.ffn_norm, cfg.eps)
            m = self._mm(lw.ffn_down, gelu_tanh(self._mm(lw.ffn_gate, f)) * self._mm(lw.ffn_up, f))
            if lw.moe is not None:
                m = rmsnorm(m, lw.moe.post_ffw_norm_1, cfg.eps) + rmsnorm(
                    self._moe(lw.moe, x), lw.moe.post_ffw_norm_2, cfg.eps)
            x = x + rmsnorm(m, lw.post_ffw_norm, cfg.eps)
            if lw.ple is not None:
                g = gelu_tanh(self._mm(lw.ple.inp_gate, x)) * ple[:, il, :]
                x = x + rmsnorm(self._mm(lw.ple.proj, g), lw.ple.post_norm, cfg.eps)
            if lw.layer_output_scale != 1.0:
                x = x * np.float32(lw.layer_output_scale)
        self.cache.n = p0 + n
        hidden = rmsnorm(x, w.output_norm, cfg.eps)                  # (n, D)
        rows = hidden[-1:] if logits_for == "last" else hidden
        logits = self._mm(w.output, rows)                             # (m, V)
        if cfg.final_softcap:
            c = np.float32(cfg.final_softcap)
            logits = np.tanh(logits / c) * c
        return logits, hidden
