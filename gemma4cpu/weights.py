"""Weights of a Gemma 3 / Gemma 4 target, as read-only views into the mapped GGUF file.

Field names are the GGUF tensor names (blk.N.<field>.weight). Matrices stay in their GGUF
quantised form (`Mat`: raw rows for the kernels); 1-D tensors (norms, scales) become float32.
Every tensor's type and shape is checked against the config before use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    placement: Any = None  # kernels.RowPlacement: rows per NUMA node (gemma4cpu.placement), None = plain

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
    moe: "MoEWeights | None" = None
    ple: "PLELayerWeights | None" = None


@dataclass
class MoEWeights:
    """26B-A4B expert branch (spec 2.7). Expert e's matrices are row slices of the 3-D tensors."""
    ffn_gate_inp: Mat                        # router D -> E
    ffn_gate_inp_scale: np.ndarray           # (D,) router scale (raw HF router.scale)
    pre_ffw_norm_2: np.ndarray               # (D,)
    post_ffw_norm_1: np.ndarray              # (D,)
    post_ffw_norm_2: np.ndarray              # (D,)
    gate_up: list[Mat]                       # per expert: D -> 2I (gate rows first, then up)
    down: list[Mat]                          # per expert: I -> D
    down_scale: np.ndarray                   # (E,) per-expert output scale
    n_used: int


@dataclass
class PLELayerWeights:
    inp_gate: Mat                            # D -> Dp
    proj: Mat                                # Dp -> D
    post_norm: np.ndarray                    # (D,)


@dataclass
class ModelWeights:
    token_embd: Mat                          # (V rows of D): embedding table and tied LM head
    output: Mat                              # LM head (token_embd when tied)
    output_norm: np.ndarray                  # (D,)
    layers: list[LayerWeights]
    per_layer_token_embd: Mat | None = None  # (V rows of L*Dp)
    per_layer_model_proj: Mat | None = None  # D -> L*Dp
    per_layer_proj_norm: np.ndarray | None = None  # (Dp,)

    def mats(self) -> list[Mat]:
        """Every weight matrix once (the tied LM head is the embedding), in file order of use."""
        out = [self.token_embd] + ([self.output] if self.output is not self.token_embd else [])
        out += [m for m in (self.per_layer_token_embd, self.per_layer_model_proj) if m is not None]
        for lw in self.layers:
            out += [m for m in (lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.ffn_gate, lw.ffn_up,
                                lw.ffn_down) if m is not None]
            if lw.moe is not None:
                out += [lw.moe.ffn_gate_inp] + list(lw.moe.gate_up) + list(lw.moe.down)
            if lw.ple is not None:
                out += [lw.ple.inp_gate, lw.ple.proj]
        return out

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
            moe=_moe(f, cfg, il) if cfg.n_expert else None,
            ple=PLELayerWeights(Mat.of(f.tensor(p + "inp_gate.weight"), D, cfg.n_embd_per_layer),
                                Mat.of(f.tensor(p + "proj.weight"), cfg.n_embd_per_layer, D),
                                _vec(f, p + "post_norm.weight", D)) if cfg.n_embd_per_layer else None,
        ))
    mw = ModelWeights(token_embd=tok, output=out, output_norm=_vec(f, "output_norm.weight", D), layers=layers)
    if cfg.n_embd_per_layer:
        LDp = cfg.n_layer * cfg.n_embd_per_layer
        mw.per_layer_token_embd = Mat.of(f.tensor("per_layer_token_embd.weight"), LDp, V)
        mw.per_layer_model_proj = Mat.of(f.tensor("per_layer_model_proj.weight"), D, LDp)
        mw.per_layer_proj_norm = _vec(f, "per_layer_proj_norm.weight", cfg.n_embd_per_layer)
    return mw


def _experts(t: Tensor, n_in: int, n_out: int, n_expert: int) -> list[Mat]:
    """Split a 3-D expert tensor {n_in, n_out, E} into E matrices (row slices, no copy)."""
    if t.type_name not in KERNEL_TYPES:
        raise GGUFFormatError(f"tensor {t.name!r} has type {t.type_name}, which gemma4cpu cannot compute with")
    if t.dims != (n_in, n_out, n_expert):
        raise GGUFFormatError(f"tensor {t.name!r} has shape {list(t.dims)}, expected [{n_in}, {n_out}, {n_expert}]")
    rows = t.rows()  # (E * n_out, row_bytes)
    return [Mat(f"{t.name}[{e}]", t.type_name, t.type_id, rows[e * n_out:(e + 1) * n_out], n_in, n_out)
            for e in range(n_expert)]


def _moe(f: GGUFFile, cfg: ModelConfig, il: int) -> MoEWeights:
    p, D, E, I = f"blk.{il}.", cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    if not 0 < cfg.n_expert_used <= E or I <= 0:
        raise GGUFFormatError(f"{f.path}: bad MoE config: {cfg.n_expert_used} of {E} experts, width {I}")
    if (p + "ffn_gate_up_exps.weight") in f.tensors:
        gate_up = _experts(f.tensor(p + "ffn_gate_up_exps.weight"), D, 2 * I, E)
    else:  # split form: stack gate and up per expert is not possible without a copy; keep pairs
        g = _experts(f.tensor(p + "ffn_gate_exps.weight"), D, I, E)
        u = _experts(f.tensor(p + "ffn_up_exps.weight"), D, I, E)
        gate_up = [Mat(a.name, a.type_name, a.type_id, np.concatenate([a.rows, b.rows]), D, 2 * I)
                   for a, b in zip(g, u)]
    return MoEWeights(
        ffn_gate_inp=Mat.of(f.tensor(p + "ffn_gate_inp.weight"), D, E),
        ffn_gate_inp_scale=_vec(f, p + "ffn_gate_inp.scale", D),
        pre_ffw_norm_2=_vec(f, p + "pre_ffw_norm_2.weight", D),
        post_ffw_norm_1=_vec(f, p + "post_ffw_norm_1.weight", D),
        post_ffw_norm_2=_vec(f, p + "post_ffw_norm_2.weight", D),
        gate_up=gate_up, down=_experts(f.tensor(p + "ffn_down_exps.weight"), I, D, E),
        down_scale=_vec(f, p + "ffn_down_exps.scale", E), n_used=cfg.n_expert_used)
