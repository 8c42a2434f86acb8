"""Weights of a Gemma 3 / Gemma 4 target, as read-only views into the mapped GGUF file.

Field names are the GGUF tensor names (blk.N.<field>.weight). Matrices stay in their GGUF
quantised form (`Mat`: raw rows for the kernels); 1-D tensors (norms, scales) become float32.
Every tensor's type and shape is checked against the config before use.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemma4cpu import _kernels
from gemma4cpu.config import ModelConfig
from gemma4cpu.gguf_io import GGML_TYPES, GGUFFile, GGUFFormatError, Tensor

KERNEL_TYPES = set(_kernels.TYPE_IDS)


@dataclass
class Mat:
    """A weight matrix for y = W x: `rows` (n_out, row_bytes) uint8 raw GGUF rows, n_in = k."""
    name: str
    type_name: str
    type_id: int
    rows: np.ndarray
    n_in: int
    n_out: int

    @staticmethod
    def of(t: Tensor, n_in: int, n_out: int) -> "Mat":
        if t.type_name not in KERNEL_TYPES:
            raise GGUFFormatError(f"tensor {t.name!r} has type {t.type_name}, which gemma4cpu cannot compute with "
                                  f"(supported: {', '.join(sorted(KERNEL_TYPES))})")
        if len(t.dims) != 2 or t.dims != (n_in, n_out):
            raise GGUFFormatError(f"tensor {t.name!r} has shape {list(t.dims)}, expected [{n_in}, {n_out}]")
        return Mat(t.name, t.type_name, t.type_id, t.rows(), n_in, n_out)

    @property
    def n_bytes(self) -> int:
        return self.rows.nbytes


@dataclass
class LayerWeights:
    attn_norm: np.ndarray                    # (D,)
    attn_q: Mat                              # D -> Hq*hd
    attn_q_norm: np.ndarray                  # (hd,)
    attn_k: Mat | None                       # D -> Hkv*hd (None: KV-shared layer)
    attn_v: Mat | None                       # None: K=V full layer or KV-shared layer
    attn_k_norm: np.ndarray | None           # (hd,)
    attn_output: Mat                         # Hq*hd -> D
    post_attention_norm: np.ndarray          # (D,)
    ffn_norm: np.ndarray                     # (D,)
    ffn_gate: Mat                            # D -> F
    ffn_up: Mat                              # D -> F
    ffn_down: Mat                            # F -> D
    post_ffw_norm: np.ndarray                # (D,)
    layer_output_scale: float = 1.0
    rope_freq_factors: np.ndarray | None = None  # (hd/2,) divides the rotation frequencies (full layers)


@dataclass
class ModelWeights:
    token_embd: Mat                          # (V rows of D): embedding table and tied LM head
    output: Mat                              # LM head (token_embd when tied)
    output_norm: np.ndarray                  # (D,)
    layers: list[LayerWeights]

    @property
    def n_bytes(self) -> int:
        tot = self.token_embd.n_bytes + (0 if self.output is self.token_embd else self.output.n_bytes)
        for lw in self.layers:
            for m in (lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.ffn_gate, lw.ffn_up, lw.ffn_down):
                tot += m.n_bytes if m is not None else 0
        return tot


def _vec(f: GGUFFile, name: str, n: int) -> np.ndarray:
    t = f.tensor(name)
    if t.type_name not in ("F32", "F16", "BF16") or t.n_elements != n:
        raise GGUFFormatError(f"tensor {name!r}: expected {n} float values, found {t.type_name} {list(t.dims)}")
    if t.type_name == "BF16":
        return (t.raw().view(np.uint16).astype(np.uint32) << 16).view(np.float32).copy()
    return np.asarray(t.numpy(), dtype=np.float32).reshape(n).copy()


def load_weights(f: GGUFFile, cfg: ModelConfig) -> ModelWeights:
    D, V = cfg.n_embd, cfg.n_vocab
    if cfg.n_expert or cfg.n_embd_per_layer:
        raise GGUFFormatError(f"{f.path}: MoE and per-layer-embedding models are not supported yet")
    tok = Mat.of(f.tensor("token_embd.weight"), D, V)
    out = Mat.of(f.tensors["output.weight"], D, V) if "output.weight" in f.tensors else tok
    rope_freqs = None
    if "rope_freqs.weight" in f.tensors:
        t = f.tensor("rope_freqs.weight")
        rope_freqs = np.asarray(t.numpy(), dtype=np.float32).reshape(-1).copy()
    layers = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        hd, hq, hkv, ff = cfg.head_dim[il], cfg.n_head, cfg.n_head_kv[il], cfg.n_ff[il]
        owns_kv = il < cfg.n_layer_kv
        k = Mat.of(f.tensor(p + "attn_k.weight"), D, hkv * hd) if owns_kv else None
        v = None
        if owns_kv and (p + "attn_v.weight") in f.tensors:
            v = Mat.of(f.tensor(p + "attn_v.weight"), D, hkv * hd)
        elif owns_kv and cfg.arch != "gemma4":
            f.tensor(p + "attn_v.weight")  # raises: only Gemma 4 full layers may share K and V
        scale = 1.0
        if (p + "layer_output_scale.weight") in f.tensors:
            scale = float(_vec(f, p + "layer_output_scale.weight", 1)[0])
        ff_factors = None
        if rope_freqs is not None and not cfg.is_swa[il]:
            if rope_freqs.size != hd // 2:
                raise GGUFFormatError(f"rope_freqs.weight has {rope_freqs.size} entries, expected {hd // 2}")
            ff_factors = rope_freqs
        layers.append(LayerWeights(
            attn_norm=_vec(f, p + "attn_norm.weight", D),
            attn_q=Mat.of(f.tensor(p + "attn_q.weight"), D, hq * hd),
            attn_q_norm=_vec(f, p + "attn_q_norm.weight", hd),
            attn_k=k, attn_v=v,
            attn_k_norm=_vec(f, p + "attn_k_norm.weight", hd) if owns_kv else None,
            attn_output=Mat.of(f.tensor(p + "attn_output.weight"), hq * hd, D),
            post_attention_norm=_vec(f, p + "post_attention_norm.weight", D),
            ffn_norm=_vec(f, p + "ffn_norm.weight", D),
            ffn_gate=Mat.of(f.tensor(p + "ffn_gate.weight"), D, ff),
            ffn_up=Mat.of(f.tensor(p + "ffn_up.weight"), D, ff),
            ffn_down=Mat.of(f.tensor(p + "ffn_down.weight"), ff, D),
            post_ffw_norm=_vec(f, p + "post_ffw_norm.weight", D),
            layer_output_scale=scale, rope_freq_factors=ff_factors,
        ))
    return ModelWeights(token_embd=tok, output=out, output_norm=_vec(f, "output_norm.weight", D), layers=layers)
