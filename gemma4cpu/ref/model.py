"""Reference forward pass of Gemma 4 (dense, MoE, E-style) and Gemma 3, read straight from a GGUF.

Slow, obvious numpy (float64 by default, float32 on request), no cache: every call recomputes the
whole sequence with a full causal / sliding-window score matrix. This is the oracle the fast engine
is tested against, so it follows ../shared/spec/gemma4.md section 2 line by line; section numbers
in the comments point there. Weights come from gguf.GGUFReader + gguf.quants.dequantize, so
anything gguf-py can read (F32, F16, BF16, Q8_0, Q4_K, Q5_0, Q6_K, ...) works.

    m = Model("tiny.gguf")
    logits, hidden = m.forward([2, 17, 99])     # (n, V), (n, D) post-final-norm
    tokens = m.greedy([2, 17, 99], 8)           # 8 new tokens
    Assistant("drafter.gguf").step(m, kv, tok, h, P)   # one MTP draft step (spec 4.3), see Assistant

Shapes below: n = tokens, D = embedding_length, V = vocab, Hq/Hkv heads, hd head dim of the layer.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants as gq

# Weights are dequantised once and kept when the model is small; bigger models (the real 270M)
# dequantise per use and compute the vocabulary projection in row chunks to bound memory.
CACHE_LIMIT = 50_000_000  # elements
HEAD_CHUNK = 16384  # vocabulary rows per chunk of the output projection


# ---------------------------------------------------------------------------------------------
# ops
# ---------------------------------------------------------------------------------------------


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x (..., d) -> x / sqrt(mean(x^2) + eps) * w (spec 2.1: plain w; Gemma 3 files carry 1+w)."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))  # a Python float keeps float32 inputs float32


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU (HF gelu_pytorch_tanh)."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))


def rope_neox(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """NEOX / rotate-half RoPE (spec 2.5). x (n, H, hd), pos (n,), inv_freq (hd/2,) -> (n, H, hd).
    Pair (i, i + hd/2) is rotated by angle pos * inv_freq[i]."""
    half = x.shape[-1] // 2
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # (n, hd/2)
    cos = np.cos(ang)[:, None, :].astype(x.dtype)
    sin = np.sin(ang)[:, None, :].astype(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def attention(q, k, v, scale: float, window: int, softcap: float | None = None,
              qpos: np.ndarray | None = None, kpos: np.ndarray | None = None) -> np.ndarray:
    """Causal (window = 0) or sliding-window attention with GQA.

    q (nq, Hq, hd) at positions qpos (nq,), k/v (nk, Hkv, hd) at positions kpos (nk,); both default
    to 0..n-1. Returns (nq, Hq, hd). Query head h uses kv head h // (Hq / Hkv).
    Key j is visible from query i iff kpos[j] <= qpos[i] and, sliding, qpos[i] - kpos[j] < window
    (spec 2.4 masks: a window of W positions including the query's own).
    """
    hq = q.shape[1]
    qpos = np.arange(q.shape[0]) if qpos is None else np.asarray(qpos)
    kpos = np.arange(k.shape[0]) if kpos is None else np.asarray(kpos)
    g = hq // k.shape[1]
    kk = np.repeat(k, g, axis=1)  # (nk, Hq, hd)
    vv = np.repeat(v, g, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) * scale  # (Hq, nq, nk)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    i = qpos[:, None]
    j = kpos[None, :]
    visible = j <= i
    if window:
        visible &= j > i - window
    s = np.where(visible[None], s, -np.inf)
    p = softmax(s, axis=-1)
    return np.einsum("hij,jhd->ihd", p, vv)


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------


class Model:
    """A Gemma 4 (`gemma4`) or Gemma 3 (`gemma3`) GGUF, ready for `forward` (`gemma4-assistant`
    files load through the Assistant subclass)."""

    def __init__(self, path, dtype=np.float64):
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        self.r = GGUFReader(self.path)
        self.t = {t.name: t for t in self.r.tensors}
        self.arch = self._kv("general.architecture")
        if self.arch not in ("gemma4", "gemma3", "gemma4-assistant"):
            raise ValueError(f"{path}: arch {self.arch!r} not supported by the reference model")
        self.cache = sum(int(np.prod(t.shape)) for t in self.r.tensors) <= CACHE_LIMIT
        self._w: dict[str, np.ndarray] = {}
        self._read_hparams()

    # -- metadata ------------------------------------------------------------------------------

    def _kv(self, key, default=None):
        f = self.r.fields.get(key)
        return default if f is None else f.contents()

    def _a(self, key, default=None):
        return self._kv(f"{self.arch}.{key}", default)

    def _per_layer(self, key, default=None) -> list:
        v = self._a(key, default)
        return list(v) if isinstance(v, list) else [v] * self.n_layer

    def _read_hparams(self):
        a = self.arch
        self.n_layer = L = int(self._a("block_count"))
        self.n_embd = int(self._a("embedding_length"))
        self.n_head = int(self._a("attention.head_count"))
        self.eps = float(self._a("attention.layer_norm_rms_epsilon", 1e-6))
        self.n_head_kv = [int(x) for x in self._per_layer("attention.head_count_kv")]
        self.n_ff = [int(x) for x in self._per_layer("feed_forward_length")]
        self.window = int(self._a("attention.sliding_window", 0))
        pat = self._a("attention.sliding_window_pattern")
        if pat is None:  # llama.cpp's gemma3 rule: every 6th layer is global
            pat = [(i + 1) % 6 != 0 for i in range(L)]
        self.is_swa = [bool(p) for p in pat]
        hd_full = int(self._a("attention.key_length"))
        hd_swa = int(self._a("attention.key_length_swa", hd_full))
        self.head_dim = [hd_swa if s else hd_full for s in self.is_swa]
        self.theta_full = float(self._a("rope.freq_base", 1e6))
        self.theta_swa = float(self._a("rope.freq_base_swa", 1e4))
        self.n_rot_full = int(self._a("rope.dimension_count", hd_full))
        self.n_rot_swa = int(self._a("rope.dimension_count_swa", hd_swa))
        self.n_shared_kv = int(self._a("attention.shared_kv_layers", 0))
        self.n_embd_pl = int(self._a("embedding_length_per_layer_input", 0))
        self.n_expert_used = int(self._a("expert_used_count", 0))
        if a.startswith("gemma4"):
            # spec 2.8: target default 30 when the key is missing; the assistant never caps (4.8-7)
            self.softcap = float(self._a("final_logit_softcapping", 30.0 if a == "gemma4" else 0.0))
            self.attn_scale = 1.0  # spec 2.4
            self.attn_softcap = None
            self.rope_scale_full = 1.0
        else:
            self.softcap = float(self._a("final_logit_softcapping", 0.0))
            self.attn_scale = float(self._a("attention.scale", hd_full ** -0.5))
            self.attn_softcap = self._a("attn_logit_softcapping")
            self.rope_scale_full = float(self._a("rope.scaling.factor", 1.0))
        self.n_vocab = self.t["token_embd.weight"].shape[1]
        # KV sharing (spec 2.6): layer l >= first_shared reads the last earlier non-shared layer of its type
        # (the assistant shares every layer with the target: its K/V are passed in, see Assistant)
        first = L - self.n_shared_kv
        self.kv_src = list(range(L))
        for l in range(first, L):
            if a != "gemma4-assistant":
                self.kv_src[l] = max(j for j in range(first) if self.is_swa[j] == self.is_swa[l])

    # -- weights -------------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self.t

    def w(self, name: str) -> np.ndarray:
        """Dequantised tensor in numpy order (ggml {ne0, ne1, ne2} -> (ne2, ne1, ne0))."""
        if name in self._w:
            return self._w[name]
        t = self.t[name]
        shape = tuple(int(s) for s in reversed(t.shape))
        if t.tensor_type in (T.F32, T.F16):
            x = np.asarray(t.data).reshape(shape).astype(self.dtype)
        else:
            x = gq.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(self.dtype)
        if self.cache:
            self._w[name] = x
        return x

    def rows(self, name: str, idx) -> np.ndarray:
        """Rows idx (k,) of a 2-D tensor (ne1 rows of ne0) -> (k, ne0), dequantising only those."""
        t = self.t[name]
        if self.cache or name in self._w:
            return self.w(name)[np.asarray(idx)]
        data = np.asarray(t.data)[np.asarray(idx)]
        if t.tensor_type in (T.F32, T.F16):
            return data.astype(self.dtype)
        return gq.dequantize(data, t.tensor_type).astype(self.dtype)

    def matmul(self, x: np.ndarray, name: str) -> np.ndarray:
        """x (n, ne0) @ W.T where W is the GGUF 2-D tensor {ne0, ne1} -> (n, ne1)."""
        t = self.t[name]
        n_out = int(t.shape[1])
        if self.cache or n_out <= HEAD_CHUNK:
            return x @ self.w(name).T
        out = np.empty((x.shape[0], n_out), dtype=self.dtype)
        for r0 in range(0, n_out, HEAD_CHUNK):
            r1 = min(n_out, r0 + HEAD_CHUNK)
            out[:, r0:r1] = x @ self.rows(name, np.arange(r0, r1)).T
        return out

    # -- RoPE ----------------------------------------------------------------------------------

    def inv_freq(self, l: int) -> np.ndarray:
        """(hd/2,) angle per position for each rotated pair of layer l (spec 2.5).
        Sliding: base_swa^(-2i/n_rot_swa). Full: base^(-2i/n_rot) / rope_freqs[i] (1e30 = not rotated)."""
        hd = self.head_dim[l]
        i = np.arange(hd // 2, dtype=np.float64)
        if self.is_swa[l]:
            return self.theta_swa ** (-2.0 * i / self.n_rot_swa)
        f = self.theta_full ** (-2.0 * i / self.n_rot_full) / self.rope_scale_full
        if self.has("rope_freqs.weight"):
            f = f / self.w("rope_freqs.weight").astype(np.float64)[: hd // 2]
        return f

    # -- blocks --------------------------------------------------------------------------------

    def per_layer_inputs(self, tokens: np.ndarray, x0: np.ndarray) -> np.ndarray:
        """PLE (spec 2.3): tokens (n,), x0 (n, D) scaled embedding -> (n, L, Dp)."""
        n, L, Dp = len(tokens), self.n_layer, self.n_embd_pl
        tokpart = self.rows("per_layer_token_embd.weight", tokens).reshape(n, L, Dp) * float(np.sqrt(Dp))
        ctx = self.matmul(x0, "per_layer_model_proj.weight") * self.n_embd ** -0.5  # (n, L*Dp)
        ctx = rmsnorm(ctx.reshape(n, L, Dp), self.w("per_layer_proj_norm.weight"), self.eps)
        return (ctx + tokpart) * 2.0 ** -0.5

    def mlp(self, f: np.ndarray, p: str) -> np.ndarray:
        """Dense gated MLP: f (n, D) -> (n, D) = down(gelu(gate f) * up f)."""
        return self.matmul(gelu_tanh(self.matmul(f, p + "ffn_gate.weight")) * self.matmul(f, p + "ffn_up.weight"),
                           p + "ffn_down.weight")

    def moe(self, h: np.ndarray, p: str) -> np.ndarray:
        """MoE branch (spec 2.7) on the residual h (n, D) -> (n, D)."""
        D = self.n_embd
        r = rmsnorm(h, None, self.eps) * self.w(p + "ffn_gate_inp.scale") * D ** -0.5
        probs = softmax(self.matmul(r, p + "ffn_gate_inp.weight"), axis=-1)  # (n, E) over all experts
        k = self.n_expert_used
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # (n, k)
        wt = np.take_along_axis(probs, top, axis=-1)
        wt = wt / wt.sum(axis=-1, keepdims=True) * self.w(p + "ffn_down_exps.scale")[top]
        e_in = rmsnorm(h, self.w(p + "pre_ffw_norm_2.weight"), self.eps)
        gate_up = self.w(p + "ffn_gate_up_exps.weight")  # (E, 2I, D): gate rows first
        down = self.w(p + "ffn_down_exps.weight")  # (E, D, I)
        I = down.shape[2]
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(k):
                e = top[t, j]
                gu = gate_up[e] @ e_in[t]  # (2I,)
                out[t] += wt[t, j] * (down[e] @ (gelu_tanh(gu[:I]) * gu[I:]))
        return out

    def layer(self, l: int, h: np.ndarray, pos: np.ndarray, kv: dict, ple: np.ndarray | None,
              kpos: np.ndarray | None = None, window: int | None = None) -> np.ndarray:
        """Decoder layer l (spec 2.4): h (n, D) at positions pos -> (n, D).

        kv[l] = (K, V) (nk, Hkv, hd) at positions kpos (default pos): written here by producer
        layers, read by KV-shared ones; if kv already holds l (assistant), it is used as given.
        window overrides the sliding window of sliding layers."""
        p = f"blk.{l}."
        n, eps, hd = h.shape[0], self.eps, self.head_dim[l]
        g4 = self.arch == "gemma4"
        a = rmsnorm(h, self.w(p + "attn_norm.weight"), eps)
        q = self.matmul(a, p + "attn_q.weight").reshape(n, self.n_head, hd)
        q = rope_neox(rmsnorm(q, self.w(p + "attn_q_norm.weight"), eps), pos, self.inv_freq(l))
        if self.kv_src[l] == l and l not in kv:
            kraw = self.matmul(a, p + "attn_k.weight").reshape(n, self.n_head_kv[l], hd)
            vraw = self.matmul(a, p + "attn_v.weight").reshape(n, self.n_head_kv[l], hd) \
                if self.has(p + "attn_v.weight") else kraw  # K=V full layers
            k = rope_neox(rmsnorm(kraw, self.w(p + "attn_k_norm.weight"), eps), pos, self.inv_freq(l))
            v = rmsnorm(vraw, None, eps) if g4 else vraw  # gemma4 v_norm: no weight
            kv[l] = (k, v)
        k, v = kv[self.kv_src[l]]
        w = self.window if window is None else window
        o = attention(q, k, v, self.attn_scale, w if self.is_swa[l] else 0, self.attn_softcap,
                      qpos=pos, kpos=pos if kpos is None else kpos)
        o = self.matmul(o.reshape(n, -1), p + "attn_output.weight")
        h = h + rmsnorm(o, self.w(p + "post_attention_norm.weight"), eps)

        f = rmsnorm(h, self.w(p + "ffn_norm.weight"), eps)
        m = self.mlp(f, p)
        if self.has(p + "ffn_gate_inp.weight"):
            m = rmsnorm(m, self.w(p + "post_ffw_norm_1.weight"), eps)
            m = m + rmsnorm(self.moe(h, p), self.w(p + "post_ffw_norm_2.weight"), eps)
        h = h + rmsnorm(m, self.w(p + "post_ffw_norm.weight"), eps)

        if ple is not None:
            gt = gelu_tanh(self.matmul(h, p + "inp_gate.weight")) * ple[:, l]  # (n, Dp)
            h = h + rmsnorm(self.matmul(gt, p + "proj.weight"), self.w(p + "post_norm.weight"), eps)
        if self.has(p + "layer_output_scale.weight"):
            h = h * self.w(p + "layer_output_scale.weight")[0]
        return h

    def forward(self, tokens, return_kv: bool = False):
        """tokens (n,) at positions 0..n-1 -> (logits (n, V), post-final-norm hidden (n, D)),
        plus {layer: (K (n, Hkv, hd), V)} of the KV-producing layers if return_kv."""
        tokens = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(len(tokens))
        x = self.rows("token_embd.weight", tokens) * float(np.sqrt(self.n_embd))  # (n, D), spec 2.2
        ple = self.per_layer_inputs(tokens, x) if self.n_embd_pl else None
        kv: dict = {}
        for l in range(self.n_layer):
            x = self.layer(l, x, pos, kv, ple)
        hn = rmsnorm(x, self.w("output_norm.weight"), self.eps)  # spec 2.8
        head = "output.weight" if self.has("output.weight") else "token_embd.weight"
        logits = self.matmul(hn, head)
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return (logits, hn, kv) if return_kv else (logits, hn)

    def greedy(self, tokens, n_new: int) -> list[int]:
        """n_new greedy tokens after `tokens` (full recompute each step)."""
        seq = [int(t) for t in tokens]
        out = []
        for _ in range(n_new):
            logits, _ = self.forward(seq)
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            seq.append(nxt)
        return out


class Assistant(Model):
    """Gemma 4 MTP drafter (`gemma4-assistant` GGUF, spec 4.3): one draft step at a time.

        target = Model("target.gguf"); drafter = Assistant("assistant.gguf")
        logits, h, kv = target.forward(prompt, return_kv=True)      # P = len(prompt)
        tok = argmax(logits[-1]);  d_logits, h_next = drafter.step(target, kv, tok, h[-1], P)

    Visible target positions follow llama.cpp (spec 4.4): full layers [0, P-1], sliding layers
    [P-W+1, P-1]. HF (transformers 5.24) shows the sliding layers the last W+1 target entries
    instead, [P-W-1, P-1] (measured; spec 4.4 / open question 4): hf_window=True reproduces that.
    The two agree while P < W.

    Files with use_ordered_embeddings (E2B/E4B) get HF's centroid head (spec 4.5) unless
    dense_head=True (what llama.cpp and ik_llama.cpp compute).
    """

    def __init__(self, path, dtype=np.float64, hf_window: bool = False, dense_head: bool = False):
        super().__init__(path, dtype)
        self.hf_window = hf_window
        if self.arch != "gemma4-assistant":
            raise ValueError(f"{path}: arch {self.arch!r} is not gemma4-assistant")
        self.n_embd_out = int(self._a("embedding_length_out"))
        ordered = bool(self._a("use_ordered_embeddings", False)) and not dense_head
        self.n_centroids = int(self._a("n_centroids")) if ordered else 0
        self.centroid_top_k = int(self._a("centroid_top_k")) if ordered else 0

    def target_layer(self, target: Model, l: int) -> int:
        """Target layer whose K/V assistant layer l reads: the last non-KV-shared target layer of the
        same type (spec 4.4)."""
        first = target.n_layer - target.n_shared_kv
        return max(j for j in range(first) if target.is_swa[j] == self.is_swa[l])

    def step(self, target: Model, target_kv: dict, tok: int, h_prev: np.ndarray, pos: int):
        """One draft step. tok: last token (position pos, not in target_kv); h_prev (D_t,): target
        post-norm hidden of the row that produced tok (or the previous step's h_next);
        target_kv: Model.forward(..., return_kv=True)[2] covering positions 0..pos-1.
        Returns (logits (V,) without softcap, h_next (D_t,)); with the centroid head only the
        top_k * V / n_centroids candidate tokens are scored, the rest hold min(scored) - 1."""
        if target.n_embd != self.n_embd_out:
            raise ValueError(f"assistant expects a target with D={self.n_embd_out}, got {target.n_embd}")
        e = target.rows("token_embd.weight", [tok]) * float(np.sqrt(target.n_embd))  # (1, D_t)
        x = np.concatenate([e, np.asarray(h_prev, dtype=self.dtype).reshape(1, -1)], axis=1)  # (1, 2 D_t)
        z = self.matmul(x, "nextn.pre_projection.weight")  # (1, D_a)
        P = np.array([pos])
        for l in range(self.n_layer):
            K, V = target_kv[self.target_layer(target, l)]  # (>= pos, Hkv, hd)
            K, V = K[:pos].astype(self.dtype), V[:pos].astype(self.dtype)
            w = self.window + 2 if self.hf_window else self.window  # visible: pos - kpos < w
            z = self.layer(l, z, P, {l: (K, V)}, None, kpos=np.arange(pos), window=w)
        zn = rmsnorm(z, self.w("output_norm.weight"), self.eps)  # (1, D_a)
        head = "output.weight" if self.has("output.weight") else "token_embd.weight"
        h_next = self.matmul(zn, "nextn.post_projection.weight")[0]
        if not self.n_centroids:
            return self.matmul(zn, head)[0], h_next
        # spec 4.5, HF Gemma4AssistantMaskedEmbedder: score the tokens of the top_k best clusters only
        c = self.matmul(zn, "masked_embd_centroids.weight")[0]  # (n_c,)
        top = np.argsort(-c, kind="stable")[: self.centroid_top_k]
        order = np.asarray(self.t["masked_embd_ordering"].data, dtype=np.int64)
        cand = order.reshape(self.n_centroids, -1)[top].reshape(-1)  # cluster i = order[i*V/n_c : (i+1)*V/n_c]
        s = self.rows(head, cand) @ zn[0]
        logits = np.full(self.n_vocab, s.min() - 1.0, dtype=self.dtype)
        logits[cand] = s
        return logits, h_next


def load(path, dtype=np.float64) -> Model:
    return Model(path, dtype)
