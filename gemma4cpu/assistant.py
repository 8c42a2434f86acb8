"""Gemma 4 MTP assistant ("drafter"): loading, the fit check against a target, and the draft step.

Spec: ../shared/spec/gemma4.md sections 3.4 and 4. The assistant is a 4-layer Gemma 4 decoder with
no K/V of its own: every layer attends to the target's KV cache (the last producing target layer
of the same type), so it can only run next to the target `Model` it was built for.

On-disk schemas, all accepted:
  gemma4-assistant  upstream llama.cpp: `<arch>.embedding_length_out` = backbone width,
                    `nextn.pre_projection.weight`, `nextn.post_projection.weight`; the centroid head
                    (written by gemma4cpu.convert) as `masked_embd_centroids.weight` +
                    `masked_embd_ordering` (I32, HF's token permutation) with
                    `<arch>.use_ordered_embeddings`, `<arch>.n_centroids`, `<arch>.centroid_top_k`
  gemma4_mtp        ik_llama.cpp: `<arch>.backbone_embedding_length`, `mtp_pre_proj.weight`,
                    `mtp_post_proj.weight`, optional `mtp_centroids.weight` + `mtp_token_ordering.weight`
                    (I32 token -> centroid map), `<arch>.centroid_count`, `<arch>.centroid_top_k`
  gemma4_assistant  seen in published files: either key / tensor spelling under this prefix
Any of the spellings is looked up under any of the three prefixes' own arch.

Draft step (spec 4.3), for token `tok` at position P with hidden `h` (D_t):
  z = W_pre [E_t[tok] sqrt(D_t), h]; 4 Q-only layers (RoPE of the target's layer of that type,
  whatever the file carries: spec 4.8-6; scale 1; GQA over the target's kv heads; sliding layers
  see [P-W+1, P-1], the full layer [0, P-1]); zn = RMSNorm(z); logits = E_a zn (no softcap) or the
  centroid head; h_next = W_post zn.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from gemma4cpu import _kernels
from gemma4cpu import kernels as K
from gemma4cpu.config import (ASSISTANT_ARCHS, MAX_DIM, MAX_HEAD_DIM, MAX_LAYERS, INT32_MAX, _is_int, meta_float,
                              meta_int, meta_per_layer)
from gemma4cpu.gguf_io import GGUFFile, GGUFFormatError
from gemma4cpu import model as _model
from gemma4cpu.model import gelu_mul, norm_rope, rmsnorm, rope_tables
from gemma4cpu.weights import Mat, _vec

_BACKBONE_KEYS = ("embedding_length_out", "backbone_embedding_length")
_NCENT_KEYS = ("n_centroids", "centroid_count", "num_centroids")
_TOPK_KEYS = ("centroid_top_k", "centroid_intermediate_top_k")
_PRE = ("nextn.pre_projection.weight", "mtp_pre_proj.weight")
_POST = ("nextn.post_projection.weight", "mtp_post_proj.weight")
_CENT = ("masked_embd_centroids.weight", "mtp_centroids.weight", "mtp.centroids.weight")
_ORDER = ("masked_embd_ordering", "masked_embd_ordering.weight", "mtp_token_ordering.weight",
          "mtp.token_ordering.weight")


class DrafterMismatchError(ValueError):
    """The assistant was not made for this target (names both values)."""


def _first(f: GGUFFile, names) -> str | None:
    return next((n for n in names if n in f.tensors), None)


@dataclass
class AssistantConfig:
    arch: str
    n_layer: int
    n_embd: int               # D_a
    n_embd_backbone: int      # D_t: the target's width
    n_vocab: int
    n_head: int
    n_head_kv: list[int]      # per layer, as the file states (must equal the target's per type)
    head_dim: list[int]
    is_swa: list[bool]
    sliding_window: int
    n_ff: list[int]
    eps: float
    use_ordered: bool = False
    n_centroids: int = 0
    centroid_top_k: int = 0

    @staticmethod
    def from_gguf(f: GGUFFile) -> "AssistantConfig":
        arch = f.arch
        if arch not in ASSISTANT_ARCHS:
            hint = " (that is a target model: pass it as the model, and its assistant as the drafter)" \
                if arch in ("gemma4", "gemma3") else ""
            raise GGUFFormatError(f"{f.path}: architecture {arch!r} is not a Gemma 4 MTP assistant "
                                  f"(expected one of {', '.join(ASSISTANT_ARCHS)}){hint}")
        p = arch + "."

        def get_any(keys, default=None):
            for k in keys:
                v = f.get(p + k)
                if v is not None:
                    return v
            return default

        def pos_int(key, hi=MAX_DIM):   # typed and bounded (gemma4cpu.config: the file is untrusted)
            return meta_int(f, p + key, lo=1, hi=hi)

        n_layer = pos_int("block_count", hi=min(MAX_LAYERS, max(1, len(f.tensors))))

        def per_layer(key):
            return meta_per_layer(f, p + key, n_layer, None, 1, MAX_DIM)

        def opt_int(keys):
            v = get_any(keys, 0)
            if not _is_int(v) or not 0 <= v <= INT32_MAX:
                raise GGUFFormatError(f"{f.path}: {p}{keys[0]} = {v!r:.40} is not an integer in [0, {INT32_MAX}]")
            return int(v)

        backbone = get_any(_BACKBONE_KEYS)
        if backbone is None:
            raise GGUFFormatError(f"{f.path}: the backbone width is missing (one of "
                                  f"{', '.join(p + k for k in _BACKBONE_KEYS)})")
        if not _is_int(backbone) or not 1 <= backbone <= MAX_DIM:
            raise GGUFFormatError(f"{f.path}: backbone width {backbone!r:.40} is not a positive integer")
        pattern = f.require(p + "attention.sliding_window_pattern")
        if not isinstance(pattern, np.ndarray) or pattern.shape != (n_layer,):
            raise GGUFFormatError(f"{f.path}: {p}attention.sliding_window_pattern must be a bool array "
                                  f"of {n_layer} entries")
        is_swa = [bool(x) for x in pattern.tolist()]
        hd_full = pos_int("attention.key_length", hi=MAX_HEAD_DIM)
        hd_swa = meta_int(f, p + "attention.key_length_swa", hd_full, lo=1, hi=MAX_HEAD_DIM)
        tokens = f.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if isinstance(tokens, list) else f.tensor("token_embd.weight").n_rows
        use_ordered = get_any(("use_ordered_embeddings",), False)
        if not isinstance(use_ordered, (bool, np.bool_)) and not (_is_int(use_ordered) and use_ordered in (0, 1)):
            raise GGUFFormatError(f"{f.path}: {p}use_ordered_embeddings = {use_ordered!r:.40} is not a bool")
        use_ordered = bool(use_ordered)
        n_c = opt_int(_NCENT_KEYS)
        top_k = opt_int(_TOPK_KEYS)
        has_head = _first(f, _CENT) is not None and _first(f, _ORDER) is not None
        if not use_ordered and has_head and n_c and top_k:
            use_ordered = True          # ik files carry the tensors and counts without the flag
        if use_ordered and not has_head:
            use_ordered = False         # upstream drops the tensors at conversion: dense head (spec 4.5)
        if use_ordered and (n_c <= 0 or top_k <= 0 or top_k > n_c or n_vocab % n_c):
            raise GGUFFormatError(f"{f.path}: centroid head with {n_c} centroids, top-{top_k}, for a vocabulary "
                                  f"of {n_vocab} (needs 0 < top_k <= centroids and vocab divisible by centroids)")
        return AssistantConfig(
            arch=arch, n_layer=n_layer, n_embd=pos_int("embedding_length"), n_embd_backbone=int(backbone),
            n_vocab=n_vocab, n_head=pos_int("attention.head_count"), n_head_kv=per_layer("attention.head_count_kv"),
            head_dim=[hd_swa if s else hd_full for s in is_swa], is_swa=is_swa,
            sliding_window=pos_int("attention.sliding_window"), n_ff=per_layer("feed_forward_length"),
            eps=meta_float(f, p + "attention.layer_norm_rms_epsilon", 1e-6, lo=0.0, hi=1.0, lo_open=True),
            use_ordered=use_ordered, n_centroids=n_c if use_ordered else 0,
            centroid_top_k=top_k if use_ordered else 0)


@dataclass
class _Layer:
    attn_norm: np.ndarray
    attn_q: Mat
    attn_q_norm: np.ndarray
    attn_output: Mat
    post_attention_norm: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate: Mat
    ffn_up: Mat
    ffn_down: Mat
    post_ffw_norm: np.ndarray
    layer_output_scale: float
    target_layer: int          # the target layer whose cache this layer reads
    window: int                # 0 = full attention


def _clusters(order: np.ndarray, n_c: int, path) -> np.ndarray:
    """(n_c, V/n_c) token ids per centroid from HF's permutation or ik's token -> centroid map."""
    V = order.size
    per = V // n_c
    if np.array_equal(np.sort(order), np.arange(V)):
        return order.reshape(n_c, per).astype(np.int64)                 # HF token_ordering
    if order.min() >= 0 and order.max() < n_c and np.all(np.bincount(order, minlength=n_c) == per):
        return np.argsort(order, kind="stable").reshape(n_c, per).astype(np.int64)  # ik t2c map
    raise GGUFFormatError(f"{path}: the centroid token ordering is neither a permutation of the {V} tokens "
                          f"nor a token -> centroid map with {per} tokens per centroid")


class Assistant:
    """An MTP assistant bound to its target: `draft(tok, h, P, k)` proposes up to k tokens."""

    def __init__(self, path: str | os.PathLike, target):
        """path: the assistant GGUF (or an already parsed GGUFFile); target: the gemma4cpu.model.Model
        whose KV cache and embedding the drafter uses."""
        self.file = path if isinstance(path, GGUFFile) else GGUFFile(path)
        self.path = str(self.file.path)
        self.target = target
        self.cfg = cfg = AssistantConfig.from_gguf(self.file)
        self._check_fit(target)
        f, tc = self.file, target.cfg
        D = cfg.n_embd
        self.token_embd = Mat.of(f.tensor("token_embd.weight"), D, cfg.n_vocab)
        self.output = Mat.of(f.tensors["output.weight"], D, cfg.n_vocab) if "output.weight" in f.tensors \
            else self.token_embd
        self.output_norm = _vec(f, "output_norm.weight", D)
        pre, post = _first(f, _PRE), _first(f, _POST)
        if pre is None or post is None:
            raise GGUFFormatError(f"{self.path}: missing tensor {(_PRE if pre is None else _POST)[0]!r} "
                                  f"(or {(_PRE if pre is None else _POST)[1]!r})")
        self.pre_proj = Mat.of(f.tensor(pre), 2 * cfg.n_embd_backbone, D)
        self.post_proj = Mat.of(f.tensor(post), D, cfg.n_embd_backbone)
        self.layers = []
        for il in range(cfg.n_layer):
            p, hd, ff = f"blk.{il}.", cfg.head_dim[il], cfg.n_ff[il]
            scale = 1.0
            if (p + "layer_output_scale.weight") in f.tensors:
                scale = float(_vec(f, p + "layer_output_scale.weight", 1)[0])
            self.layers.append(_Layer(
                attn_norm=_vec(f, p + "attn_norm.weight", D),
                attn_q=Mat.of(f.tensor(p + "attn_q.weight"), D, cfg.n_head * hd),
                attn_q_norm=_vec(f, p + "attn_q_norm.weight", hd),
                attn_output=Mat.of(f.tensor(p + "attn_output.weight"), cfg.n_head * hd, D),
                post_attention_norm=_vec(f, p + "post_attention_norm.weight", D),
                ffn_norm=_vec(f, p + "ffn_norm.weight", D),
                ffn_gate=Mat.of(f.tensor(p + "ffn_gate.weight"), D, ff),
                ffn_up=Mat.of(f.tensor(p + "ffn_up.weight"), D, ff),
                ffn_down=Mat.of(f.tensor(p + "ffn_down.weight"), ff, D),
                post_ffw_norm=_vec(f, p + "post_ffw_norm.weight", D),
                layer_output_scale=scale, target_layer=self._target_layer[il],
                window=cfg.sliding_window if cfg.is_swa[il] else 0))
        self.centroids = self.clusters = None
        if cfg.use_ordered:
            self.centroids = Mat.of(f.tensor(_first(f, _CENT)), D, cfg.n_centroids)
            t = f.tensor(_first(f, _ORDER))
            if t.type_name != "I32" or t.n_elements != cfg.n_vocab:
                raise GGUFFormatError(f"tensor {t.name!r}: expected {cfg.n_vocab} I32 values, found "
                                      f"{t.type_name} {list(t.dims)}")
            self.clusters = _clusters(np.asarray(t.numpy()).reshape(-1), cfg.n_centroids, self.path)
        self.n_bytes = sum(m.n_bytes for m in (self.token_embd, self.pre_proj, self.post_proj)) + sum(
            m.n_bytes for lw in self.layers
            for m in (lw.attn_q, lw.attn_output, lw.ffn_gate, lw.ffn_up, lw.ffn_down))
        self._scale_t = np.float32(np.sqrt(tc.n_embd))
        self._loop, self._loop_cache, self._loop_rope = None, None, []

    # ---- fit ------------------------------------------------------------------------------------
    def _check_fit(self, target):
        cfg, tc, name = self.cfg, target.cfg, os.path.basename(self.path)
        if tc.arch != "gemma4":
            raise DrafterMismatchError(
                f"the MTP assistant {name} drafts for Gemma 4 targets; the target is {tc.arch!r} "
                "(use --spec-type ngram for a model-free drafter)")

        def need(what, a, t):
            if a != t:
                raise DrafterMismatchError(f"assistant {name} does not fit the target: {what} is {a} in the "
                                           f"assistant but {t} in the target")

        need("the backbone width (embedding_length_out / backbone_embedding_length vs embedding_length)",
             cfg.n_embd_backbone, tc.n_embd)
        need("the vocabulary size", cfg.n_vocab, tc.n_vocab)
        self._target_layer = []
        for il in range(cfg.n_layer):
            kind = "sliding" if cfg.is_swa[il] else "full"
            src = [j for j in range(tc.n_layer_kv) if tc.is_swa[j] == cfg.is_swa[il]]
            if not src:
                raise DrafterMismatchError(f"assistant {name} layer {il} reads a {kind}-attention target layer, "
                                           "but the target has none that holds K/V")
            T = src[-1]
            need(f"the {kind}-layer head dim (assistant layer {il}, target layer {T})",
                 cfg.head_dim[il], tc.head_dim[T])
            need(f"the {kind}-layer kv-head count (assistant layer {il}, target layer {T})",
                 cfg.n_head_kv[il], tc.n_head_kv[T])
            if cfg.n_head % tc.n_head_kv[T]:
                raise DrafterMismatchError(f"assistant {name}: {cfg.n_head} query heads are not a multiple of the "
                                           f"target's {tc.n_head_kv[T]} kv heads on {kind} layers")
            self._target_layer.append(T)
        if any(cfg.is_swa) and cfg.sliding_window > tc.sliding_window:
            raise DrafterMismatchError(f"assistant {name} does not fit the target: the sliding window is "
                                       f"{cfg.sliding_window} in the assistant but {tc.sliding_window} in the target "
                                       "(the target's ring does not keep the longer history)")

    # ---- compute --------------------------------------------------------------------------------
    def _mm(self, m: Mat, x: np.ndarray) -> np.ndarray:
        return K.matmul(self.target.pool, m.type_id, m.rows, m.n_in, x)

    def _hidden(self, tok: int, h: np.ndarray, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """zn (1, D_a) after the final norm, and h_next (1, D_t)."""
        cfg, tgt = self.cfg, self.target
        tc = tgt.cfg
        if pos > tgt.cache.n:
            raise ValueError(f"draft position {pos} is past the target's cache of {tgt.cache.n} positions")
        h = np.asarray(h, np.float32).reshape(1, tc.n_embd)
        x = np.concatenate([tgt.embed(np.array([tok])), h], axis=1)            # (1, 2 D_t)
        z = self._mm(self.pre_proj, x)                                          # (1, D_a)
        P = np.array([pos])
        loop = self._layer_loop()
        if loop is not None:  # the same layers in C (csrc/g4_layers.c), the same bits
            cos, sin = _model.loop_rope_tables(self._loop_rope, P)
            _model._run_layers(loop, tgt.pool, z, P.astype(np.int32), cos, sin, tgt.cache.used_slots())
            zn = rmsnorm(z, self.output_norm, cfg.eps)
            return zn, self._mm(self.post_proj, zn)
        for lw in self.layers:
            T = lw.target_layer
            hd = tc.head_dim[T]
            cos, sin = rope_tables(P, hd, tc.rope_dim[T], tc.rope_base[T], tgt.w.layers[T].rope_freq_factors)
            a = rmsnorm(z, lw.attn_norm, cfg.eps)
            q = norm_rope(self._mm(lw.attn_q, a).reshape(1, cfg.n_head, hd), lw.attn_q_norm, cfg.eps, cos, sin)
            o = tgt.cache.attention(tgt.pool, T, q.reshape(1, -1), P.astype(np.int32), cfg.n_head,
                                    scale=1.0, window=lw.window)
            # z += rmsnorm(o W_o); fn = rmsnorm(z, ffn_norm); z += rmsnorm(m): in place (z is our own)
            fn = np.empty_like(z)
            _kernels.add_rmsnorm(z, self._mm(lw.attn_output, o), lw.post_attention_norm, cfg.eps, lw.ffn_norm, fn)
            m = self._mm(lw.ffn_down, gelu_mul(self._mm(lw.ffn_gate, fn), self._mm(lw.ffn_up, fn)))
            _kernels.add_rmsnorm(z, m, lw.post_ffw_norm, cfg.eps)
            if lw.layer_output_scale != 1.0:
                z = z * np.float32(lw.layer_output_scale)
        zn = rmsnorm(z, self.output_norm, cfg.eps)
        return zn, self._mm(self.post_proj, zn)

    def _layer_loop(self):
        """The drafter's layers as a C layer loop over the target's cache (Q-only layers are the loop's
        KV-shared case), built on first use; None when the target runs its Python loop
        (GEMMA4CPU_LAYER_LOOP=python)."""
        tgt = self.target
        if not getattr(tgt, "layer_loop", False):
            return None
        if self._loop_cache is tgt.cache:
            return self._loop
        cfg, tc, cache = self.cfg, tgt.cfg, tgt.cache
        specs = []
        for il, lw in enumerate(self.layers):
            T = lw.target_layer
            specs.append((lw, self.layers[il + 1] if il + 1 < len(self.layers) else None,
                          (tc.head_dim[T], tc.rope_dim[T], tc.rope_base[T], tgt.w.layers[T].rope_freq_factors),
                          dict(n_head=cfg.n_head, hd=tc.head_dim[T], src=cache.source[T], window=lw.window, v_norm=0,
                               attn_scale=1.0, k=None, v=None, k_norm=None)))
        self._loop, self._loop_rope = _model.build_layer_loop(cache, cfg.n_embd, cfg.eps, 1, specs)
        self._loop_cache = cache
        return self._loop

    def _head(self, zn: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(scores, candidate ids): dense head -> (V,) logits, None; centroid head -> the scores of
        the top-k clusters' tokens and their ids (spec 4.5)."""
        if self.clusters is None:
            return self._mm(self.output, zn)[0], None
        c = self._mm(self.centroids, zn)[0]
        top = np.argsort(-c, kind="stable")[:self.cfg.centroid_top_k]
        cand = self.clusters[top].reshape(-1)
        s = K.matmul(self.target.pool, self.token_embd.type_id, np.ascontiguousarray(self.token_embd.rows[cand]),
                     self.cfg.n_embd, zn)[0]
        return s, cand

    def step(self, tok: int, h: np.ndarray, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """One draft step: (logits (V,) float32 without softcap, h_next (D_t,)). With the centroid
        head, tokens outside the chosen clusters get min(candidate logits) - 1 (as HF)."""
        zn, h_next = self._hidden(int(tok), h, int(pos))
        s, cand = self._head(zn)
        if cand is None:
            return s, h_next[0]
        logits = np.full(self.cfg.n_vocab, s.min() - np.float32(1.0), np.float32)
        logits[cand] = s
        return logits, h_next[0]

    def draft(self, tok: int, h: np.ndarray, pos: int, k: int, p_min: float = 0.0) -> list[int]:
        """draft_tokens with the calling thread held on the pool's first CPU for all k steps."""
        with self.target.pool.pinned():
            return self.draft_tokens(tok, h, pos, k, p_min)

    def draft_tokens(self, tok: int, h: np.ndarray, pos: int, k: int, p_min: float = 0.0) -> list[int]:
        """Up to k greedy draft tokens for the position after `tok` (at `pos`, not yet in the target
        cache; h = the target's post-norm hidden of the row that produced tok). All steps use
        position pos (spec 4.2). With p_min > 0, drafting stops at the first token whose probability
        (softmax over the whole vocabulary) is below p_min."""
        out: list[int] = []
        tok, pos = int(tok), int(pos)
        for _ in range(int(k)):
            zn, h_next = self._hidden(tok, h, pos)
            s, cand = self._head(zn)
            i = int(np.argmax(s))
            if p_min > 0.0:
                m = float(s[i])
                z = float(np.exp(s.astype(np.float64) - m).sum())
                if cand is not None:        # the masked tokens all carry min(s) - 1
                    z += (self.cfg.n_vocab - cand.size) * float(np.exp(float(s.min()) - 1.0 - m))
                if 1.0 / z < p_min:
                    break
            tok = int(cand[i]) if cand is not None else i
            out.append(tok)
            h = h_next
        return out
