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

        def req_int(key, hi=MAX_DIM):
            return meta_int(f, p + key, lo=1, hi=hi)

        # every layer has tensors of its own, so a file cannot describe more layers than tensors
        n_layer = req_int("block_count", hi=min(MAX_LAYERS, max(1, len(f.tensors))))

        def per_layer(key, default=None, lo=1, hi=MAX_DIM):
            return meta_per_layer(f, p + key, n_layer, default, lo, hi)

        n_embd = req_int("embedding_length")
        n_head = req_int("attention.head_count", hi=MAX_HEADS)
        n_head_kv = per_layer("attention.head_count_kv", hi=MAX_HEADS)
        n_ff = per_layer("feed_forward_length")
        window = req_int("attention.sliding_window", hi=INT32_MAX)
        eps = meta_float(f, p + "attention.layer_norm_rms_epsilon", 1e-6, lo=0.0, hi=1.0, lo_open=True)
        hd_full = req_int("attention.key_length", hi=MAX_HEAD_DIM)
        tokens = f.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if isinstance(tokens, list) else f.tensor("token_embd.weight").n_rows
        if not 1 <= n_vocab <= INT32_MAX:
            raise GGUFFormatError(f"{f.path}: vocabulary of {n_vocab} tokens (token ids are int32)")

        if arch == "gemma4":
            pattern = f.require(p + "attention.sliding_window_pattern")
            if not isinstance(pattern, np.ndarray) or pattern.shape != (n_layer,):
                raise GGUFFormatError(f"{f.path}: {p}attention.sliding_window_pattern must be a bool array "
                                      f"of {n_layer} entries")
            is_swa = [bool(x) for x in pattern.tolist()]
            hd_swa = meta_int(f, p + "attention.key_length_swa", hd_full, lo=1, hi=MAX_HEAD_DIM)
            head_dim = [hd_swa if s else hd_full for s in is_swa]
            base_full = meta_float(f, p + "rope.freq_base", 1e6, lo=0.0, lo_open=True)
            base_swa = meta_float(f, p + "rope.freq_base_swa", 1e4, lo=0.0, lo_open=True)
            dim_full = meta_int(f, p + "rope.dimension_count", hd_full, lo=2, hi=hd_full)
            dim_swa = meta_int(f, p + "rope.dimension_count_swa", hd_swa, lo=2, hi=hd_swa)
            rope_base = [base_swa if s else base_full for s in is_swa]
            rope_dim = [dim_swa if s else dim_full for s in is_swa]
            attn_scale = 1.0
            softcap = meta_float(f, p + "final_logit_softcapping", 30.0, lo=0.0)
            v_norm = True
            n_shared = meta_int(f, p + "attention.shared_kv_layers", 0, lo=0, hi=n_layer - 1)
        else:  # gemma3: every 6th layer is global (llama.cpp's fixed pattern), local rope base 1e4
            is_swa = [(i + 1) % 6 != 0 for i in range(n_layer)]
            head_dim = [hd_full] * n_layer
            base_full = meta_float(f, p + "rope.freq_base", 1e6, lo=0.0, lo_open=True)
            rope_base = [1e4 if s else base_full for s in is_swa]
            rope_dim = [meta_int(f, p + "rope.dimension_count", hd_full, lo=2, hi=hd_full)] * n_layer
            attn_scale = meta_float(f, p + "attention.scale", 1.0 / math.sqrt(hd_full), lo=0.0, lo_open=True)
            softcap = meta_float(f, p + "final_logit_softcapping", 0.0, lo=0.0)
            v_norm = False
            n_shared = 0
        for il in range(n_layer):
            if head_dim[il] % 32:
                raise GGUFFormatError(f"{f.path}: layer {il} head dim {head_dim[il]} is not a multiple of 32 "
                                      "(the KV cache and attention kernels work in 32-value blocks)")
            if rope_dim[il] % 2:
                raise GGUFFormatError(f"{f.path}: layer {il} rotates {rope_dim[il]} dims (must be even)")

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

        n_expert = meta_int(f, p + "expert_count", 0, lo=0, hi=MAX_EXPERTS)
        n_expert_used = meta_int(f, p + "expert_used_count", 0, lo=0, hi=max(n_expert, 0))
        n_ff_exp = max(meta_per_layer(f, p + "expert_feed_forward_length", n_layer, 0, 0, MAX_DIM))
        n_embd_per_layer = meta_int(f, p + "embedding_length_per_layer_input", 0, lo=0, hi=MAX_DIM)
        bos_id = meta_int(f, "tokenizer.ggml.bos_token_id", 2, lo=0, hi=INT32_MAX)
        eos_ids = [meta_int(f, "tokenizer.ggml.eos_token_id", 1, lo=0, hi=INT32_MAX)]
        eot = meta_int(f, "tokenizer.ggml.eot_token_id", -1, lo=0, hi=INT32_MAX)
        if eot >= 0 and eot not in eos_ids:
            eos_ids.append(eot)
        name = f.get("general.name", "")
        return ModelConfig(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
            n_ctx_train=meta_int(f, p + "context_length", 8192, lo=1, hi=INT32_MAX), n_head=n_head,
            n_head_kv=n_head_kv, head_dim=head_dim, is_swa=is_swa, sliding_window=window, n_ff=n_ff,
            rope_base=rope_base, rope_dim=rope_dim, eps=eps, attn_scale=attn_scale, final_softcap=softcap,
            v_norm=v_norm, n_layer_kv=n_layer_kv, kv_source=kv_source,
            n_embd_per_layer=n_embd_per_layer, n_expert=n_expert, n_expert_used=n_expert_used,
            n_ff_exp=n_ff_exp, bos_id=bos_id, eos_ids=eos_ids, name=name if isinstance(name, str) else "",
        )


# Plausibility bounds for metadata from an untrusted file. They are far above every Gemma (31B: D 5376,
# ff 21504, 60 layers, 32 heads, head dim 512, 128 experts) and keep per-layer lists and products of
# sizes small before any tensor shape is compared with them.
MAX_DIM = 1 << 20
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_HEAD_DIM = 1 << 16
MAX_EXPERTS = 1 << 16
INT32_MAX = (1 << 31) - 1
_REQUIRED = object()


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def meta_int(f: GGUFFile, key: str, default=_REQUIRED, lo: int = 0, hi: int = INT32_MAX) -> int:
    """An integer metadata value in [lo, hi] (default when absent); anything else is a GGUFFormatError
    naming the key."""
    v = f.require(key) if default is _REQUIRED else f.get(key, default)
    if not _is_int(v):
        raise GGUFFormatError(f"{f.path}: {key} = {_short(v)} is not an integer")
    if v == default and default is not _REQUIRED:
        return int(v)
    if not lo <= v <= hi:
        what = "a positive integer" if lo == 1 else f"an integer in [{lo}, {hi}]"
        raise GGUFFormatError(f"{f.path}: {key} = {int(v)} is not {what}" + (f" (at most {hi})" if lo == 1 else ""))
    return int(v)


def meta_float(f: GGUFFile, key: str, default=_REQUIRED, lo: float = -math.inf, hi: float = math.inf,
               lo_open: bool = False) -> float:
    """A finite real metadata value in [lo, hi] ((lo, hi] with lo_open)."""
    v = f.require(key) if default is _REQUIRED else f.get(key, default)
    if not (_is_int(v) or isinstance(v, (float, np.floating))):
        raise GGUFFormatError(f"{f.path}: {key} = {_short(v)} is not a number")
    x = float(v)
    if not math.isfinite(x) or x < lo or x > hi or (lo_open and x == lo):
        raise GGUFFormatError(f"{f.path}: {key} = {x!r} is outside {'(' if lo_open else '['}{lo}, {hi}]")
    return x


def meta_per_layer(f: GGUFFile, key: str, n_layer: int, default=None, lo: int = 1, hi: int = MAX_DIM) -> list[int]:
    """A per-layer integer: a scalar for every layer or an integer array of n_layer entries."""
    v = f.get(key, default)
    if v is None:
        raise GGUFFormatError(f"{f.path}: required metadata key {key!r} is missing")
    if isinstance(v, np.ndarray):
        if v.shape != (n_layer,):
            raise GGUFFormatError(f"{f.path}: {key} has {v.size} entries for {n_layer} layers")
        if not np.issubdtype(v.dtype, np.integer):
            raise GGUFFormatError(f"{f.path}: {key} is a {v.dtype} array, not integers")
        out = [int(x) for x in v.tolist()]
    elif _is_int(v):
        out = [int(v)] * n_layer
    else:
        raise GGUFFormatError(f"{f.path}: {key} has an unexpected type ({type(v).__name__})")
    bad = [x for x in out if not lo <= x <= hi]
    if bad:
        raise GGUFFormatError(f"{f.path}: {key} = {bad[0]} is outside [{lo}, {hi}]")
    return out


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."
