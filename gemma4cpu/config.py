"""Model configuration from GGUF metadata (spec sections 3.2, 3.5; Gemma 3 per llama.cpp's gemma3).

One function builds it, `ModelConfig.from_gguf`; every per-layer quantity is a list of length
n_layer, whether the file stores a scalar or a per-layer array. Names follow the GGUF keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gemma4cpu.gguf_io import GGUFFile, GGUFFormatError

TARGET_ARCHS = ("gemma4", "gemma3")
ASSISTANT_ARCHS = ("gemma4-assistant", "gemma4_mtp", "gemma4_assistant")


@dataclass
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int                       # D
    n_vocab: int
    n_ctx_train: int
    n_head: int                       # query heads (same on every layer)
    n_head_kv: list[int]              # per layer
    head_dim: list[int]               # per layer (sliding: key_length_swa, full: key_length)
    is_swa: list[bool]                # per layer: sliding-window attention
    sliding_window: int
    n_ff: list[int]                   # per layer dense MLP width
    rope_base: list[float]            # per layer
    rope_dim: list[int]               # per layer rotated dims (n_rot)
    eps: float
    attn_scale: float                 # gemma4: 1.0; gemma3: 1/sqrt(head_dim)
    final_softcap: float              # 0 = none
    v_norm: bool                      # gemma4: weight-less RMSNorm on V
    n_layer_kv: int                   # layers [0, n_layer_kv) own a KV cache
    kv_source: list[int]              # per layer: the layer whose cache it reads (itself if it owns one)
    n_embd_per_layer: int = 0         # PLE width Dp (E2B/E4B), 0 = none
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    bos_id: int = 2
    eos_ids: list[int] = field(default_factory=lambda: [1])
    name: str = ""

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.n_embd)

    @staticmethod
    def from_gguf(f: GGUFFile) -> "ModelConfig":
        arch = f.arch
        if arch in ASSISTANT_ARCHS:
            raise GGUFFormatError(f"{f.path} is a Gemma 4 MTP assistant ({arch}); load it as a drafter "
                                  f"next to its target model, not as the model")
        if arch not in TARGET_ARCHS:
            raise GGUFFormatError(f"{f.path}: architecture {arch!r} is not supported "
                                  f"(supported: {', '.join(TARGET_ARCHS)})")
        p = arch + "."

        def req_int(key):
            v = f.require(p + key)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise GGUFFormatError(f"{f.path}: {p + key} = {v!r} is not a positive integer")
            return int(v)

        n_layer = req_int("block_count")

        def per_layer(key, default=None, cast=int):
            v = f.get(p + key, default)
            if v is None:
                raise GGUFFormatError(f"{f.path}: required metadata key {p + key!r} is missing")
            if isinstance(v, np.ndarray):
                if v.shape != (n_layer,):
                    raise GGUFFormatError(f"{f.path}: {p + key} has {v.size} entries for {n_layer} layers")
                return [cast(x) for x in v.tolist()]
            if isinstance(v, (list, str)):
                raise GGUFFormatError(f"{f.path}: {p + key} has an unexpected type")
            return [cast(v)] * n_layer

        n_embd = req_int("embedding_length")
        n_head = req_int("attention.head_count")
        n_head_kv = per_layer("attention.head_count_kv")
        n_ff = per_layer("feed_forward_length")
        window = req_int("attention.sliding_window")
        eps = float(f.get(p + "attention.layer_norm_rms_epsilon", 1e-6))
        hd_full = req_int("attention.key_length")
        tokens = f.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if isinstance(tokens, list) else f.tensor("token_embd.weight").n_rows

        if arch == "gemma4":
            pattern = f.require(p + "attention.sliding_window_pattern")
            if not isinstance(pattern, np.ndarray) or pattern.shape != (n_layer,):
                raise GGUFFormatError(f"{f.path}: {p}attention.sliding_window_pattern must be a bool array "
                                      f"of {n_layer} entries")
            is_swa = [bool(x) for x in pattern.tolist()]
            hd_swa = int(f.get(p + "attention.key_length_swa", hd_full))
            head_dim = [hd_swa if s else hd_full for s in is_swa]
            base_full = float(f.get(p + "rope.freq_base", 1e6))
            base_swa = float(f.get(p + "rope.freq_base_swa", 1e4))
            dim_full = int(f.get(p + "rope.dimension_count", hd_full))
            dim_swa = int(f.get(p + "rope.dimension_count_swa", hd_swa))
            rope_base = [base_swa if s else base_full for s in is_swa]
            rope_dim = [dim_swa if s else dim_full for s in is_swa]
            attn_scale = 1.0
            softcap = float(f.get(p + "final_logit_softcapping", 30.0))
            v_norm = True
            n_shared = int(f.get(p + "attention.shared_kv_layers", 0))
        else:  # gemma3: every 6th layer is global (llama.cpp's fixed pattern), local rope base 1e4
            is_swa = [(i + 1) % 6 != 0 for i in range(n_layer)]
            head_dim = [hd_full] * n_layer
            base_full = float(f.get(p + "rope.freq_base", 1e6))
            rope_base = [1e4 if s else base_full for s in is_swa]
            rope_dim = [int(f.get(p + "rope.dimension_count", hd_full))] * n_layer
            attn_scale = float(f.get(p + "attention.scale", 1.0 / math.sqrt(hd_full)))
            softcap = float(f.get(p + "final_logit_softcapping", 0.0))
            v_norm = False
            n_shared = 0

        if not 0 <= n_shared < n_layer:
            raise GGUFFormatError(f"{f.path}: shared_kv_layers={n_shared} for {n_layer} layers")
        n_layer_kv = n_layer - n_shared
        kv_source = list(range(n_layer))
        for il in range(n_layer_kv, n_layer):  # the last non-shared layer of the same type
            src = [j for j in range(n_layer_kv) if is_swa[j] == is_swa[il]]
            if not src:
                raise GGUFFormatError(f"{f.path}: KV-shared layer {il} has no producer layer of its type")
            kv_source[il] = src[-1]
        if any(h <= 0 for h in n_head_kv) or any(n_head % h for h in n_head_kv):
            raise GGUFFormatError(f"{f.path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")

        eos = f.get("tokenizer.ggml.eos_token_id", 1)
        eos_ids = [int(eos)]
        eot = f.get("tokenizer.ggml.eot_token_id")
        if eot is not None and int(eot) not in eos_ids:
            eos_ids.append(int(eot))
        return ModelConfig(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
            n_ctx_train=int(f.get(p + "context_length", 8192)), n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, is_swa=is_swa, sliding_window=window, n_ff=n_ff, rope_base=rope_base,
            rope_dim=rope_dim, eps=eps, attn_scale=attn_scale, final_softcap=softcap, v_norm=v_norm,
            n_layer_kv=n_layer_kv, kv_source=kv_source,
            n_embd_per_layer=int(f.get(p + "embedding_length_per_layer_input", 0)),
            n_expert=int(f.get(p + "expert_count", 0)), n_expert_used=int(f.get(p + "expert_used_count", 0)),
            n_ff_exp=int(np.max(f.get(p + "expert_feed_forward_length", 0))),
            bos_id=int(f.get("tokenizer.ggml.bos_token_id", 2)), eos_ids=eos_ids,
            name=str(f.get("general.name", "")),
        )
