"""Hugging Face Gemma 4 / Gemma 3 checkpoint (config.json + *.safetensors) -> GGUF.

    python -m gemma4cpu.convert HF_DIR -o OUT.gguf --outtype f32|f16|bf16|q8_0|q4_k

Follows ../shared/spec/gemma4.md section 3: arch `gemma4` (keys of 3.2, per-layer arrays where the
layers differ, tensor names of 3.3, `rope_freqs` for proportional partial RoPE, norm weights raw,
`layer_output_scale`), arch `gemma4-assistant` (3.4a) for Gemma4AssistantForCausalLM (plus, for the
E2B/E4B centroid head, spec 4.5: `masked_embd_centroids.weight` and the I32 permutation
`masked_embd_ordering`, llama.cpp's names, which upstream declares but does not write), and arch
`gemma3` the way llama.cpp writes it (norm weights with +1 baked in). 1-D tensors are always F32.
Matrices take --outtype; a matrix whose row length is not a whole number of blocks falls back
(q4_k -> q8_0 -> f16) and the fallback is logged.

Reads safetensors with its own small parser (no torch needed); BF16/F16/F32 inputs (I64/I32 for
the token ordering).
Streams: tensor data is converted and written one tensor at a time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from gemma4cpu.convert_quant import can_quantize, quantize

OUTTYPES = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_k": T.Q4_K}
FILE_TYPES = {
    T.F32: gguf.LlamaFileType.ALL_F32,
    T.F16: gguf.LlamaFileType.MOSTLY_F16,
    T.BF16: gguf.LlamaFileType.MOSTLY_BF16,
    T.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    T.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_S,  # every matrix Q4_K (no Q6_K mix as in llama.cpp's _M)
}
FALLBACK = {T.Q4_K: T.Q8_0, T.Q8_0: T.F16, T.BF16: T.F16, T.F16: T.F32, T.F32: T.F32}

SUPPORTED = {
    "Gemma4ForCausalLM": ("gemma4", "model."),
    "Gemma4ForConditionalGeneration": ("gemma4", "model.language_model."),
    "Gemma4AssistantForCausalLM": ("gemma4-assistant", "model."),
    "Gemma3ForCausalLM": ("gemma3", "model."),
    "Gemma3ForConditionalGeneration": ("gemma3", "model.language_model."),
}
# tensors of other modalities in multimodal checkpoints: not part of the text model
SKIP_PREFIXES = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
                 "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector.")


class ConvertError(Exception):
    """A user-facing error: bad input directory, unsupported model, inconsistent tensors."""


# --------------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
              "I64": np.int64, "I32": np.int32}


@dataclass
class _STensor:
    file: Path
    dtype: str
    shape: tuple
    begin: int  # absolute byte offset in file
    end: int


def read_safetensors_index(hf_dir: Path) -> dict[str, _STensor]:
    """name -> location of every tensor in model.safetensors or the shards of its index."""
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted({hf_dir / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"no *.safetensors files in {hf_dir}")
    out = {}
    for f in files:
        if not f.exists():
            raise ConvertError(f"missing shard {f}")
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in _ST_DTYPES:
                raise ConvertError(f"{f.name}: tensor {name} has unsupported dtype {info['dtype']}")
            b, e = info["data_offsets"]
            out[name] = _STensor(f, info["dtype"], tuple(info["shape"]), base + b, base + e)
    return out


def load_tensor(t: _STensor) -> np.ndarray:
    """float32 numpy array of one safetensors tensor (bf16 widened exactly); integers as int64."""
    raw = np.memmap(t.file, dtype=np.uint8, mode="r", offset=t.begin, shape=(t.end - t.begin,))
    a = np.frombuffer(raw, dtype=_ST_DTYPES[t.dtype]).reshape(t.shape)
    if t.dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    if t.dtype.startswith("I"):
        return a.astype(np.int64)
    return a.astype(np.float32)


# --------------------------------------------------------------------------------------------
# config -> per-layer hyperparameters
# --------------------------------------------------------------------------------------------


@dataclass
class Hparams:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_vocab: int
    layer_types: list  # "sliding_attention" | "full_attention" per layer
    head_dim: list  # per layer
    n_head_kv: list  # per layer
    n_ff: list  # per layer (dense MLP width)
    sliding_window: int
    eps: float
    ctx: int
    theta_full: float
    theta_swa: float
    rope_factor_full: float = 1.0
    partial_full: float = 1.0
    rope_type_full: str = "default"
    n_shared_kv: int = 0
    n_embd_per_layer: int = 0
    softcap_final: float | None = None
    softcap_attn: float | None = None
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    query_pre_attn_scalar: float | None = None
    n_embd_backbone: int = 0  # assistant
    n_centroids: int = 0  # assistant centroid head (0: dense head)
    centroid_top_k: int = 0
    tied: bool = True
    extra: dict = field(default_factory=dict)


def _rope_params(tc: dict, layer_type: str, default_theta: float) -> dict:
    rp = tc.get("rope_parameters") or {}
    if layer_type in rp and isinstance(rp[layer_type], dict):
        return rp[layer_type]
    if "rope_theta" in rp:  # flat form
        return rp
    return {"rope_type": "default", "rope_theta": tc.get("rope_theta", default_theta)}


def hparams_from_config(cfg: dict, arch: str, tensors: dict[str, _STensor], prefix: str) -> Hparams:
    """Per-layer hyperparameters from config.json, checked against the tensor shapes."""
    if arch == "gemma4-assistant":
        tc = cfg.get("text_config") or {}
    else:
        tc = cfg.get("text_config", cfg) if "text_config" in cfg else cfg
    try:
        L = int(tc["num_hidden_layers"])
        D = int(tc["hidden_size"])
        Hq = int(tc["num_attention_heads"])
    except KeyError as e:
        raise ConvertError(f"config.json lacks {e}") from None
    types = list(tc.get("layer_types") or [])
    if not types:
        pat = int(tc.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pat else "full_attention" for i in range(L)]
    if arch.startswith("gemma4"):
        types[-1] = "full_attention"  # Gemma4TextConfig forces it
    if len(types) != L:
        raise ConvertError(f"layer_types has {len(types)} entries for {L} layers")

    def tshape(name):
        t = tensors.get(prefix + name)
        return t.shape if t is not None else None

    hd, kv, ff = [], [], []
    for i in range(L):
        qn = tshape(f"layers.{i}.self_attn.q_norm.weight")
        if qn is None:
            raise ConvertError(f"missing tensor {prefix}layers.{i}.self_attn.q_norm.weight")
        hd.append(int(qn[0]))
        kp = tshape(f"layers.{i}.self_attn.k_proj.weight")
        kv.append(int(kp[0]) // hd[i] if kp is not None else None)
        gp = tshape(f"layers.{i}.mlp.gate_proj.weight")
        ff.append(int(gp[0]) if gp is not None else int(tc["intermediate_size"]))
    # KV-shared layers (no k_proj): kv heads of the config for that layer
    plc = {str(k): v for k, v in (tc.get("per_layer_config") or {}).items()}
    for i in range(L):
        if kv[i] is None:
            over = plc.get(str(i), plc.get(types[i], {})) or {}
            kv[i] = int(over.get("num_key_value_heads", tc.get("num_key_value_heads", 1)))
        if arch == "gemma4-assistant" and kv[i] is None:
            kv[i] = 1

    n_vocab = tensors[prefix + "embed_tokens.weight"].shape[0]
    full_rp = _rope_params(tc, "full_attention", 1e6)
    swa_rp = _rope_params(tc, "sliding_attention", 1e4)
    for name, rp in (("full_attention", full_rp), ("sliding_attention", swa_rp)):
        if rp.get("rope_type", "default") not in ("default", "proportional", "linear"):
            raise ConvertError(f"unsupported rope_type {rp.get('rope_type')!r} for {name}")
    hp = Hparams(
        arch=arch, n_layer=L, n_embd=D, n_head=Hq, n_vocab=n_vocab, layer_types=types,
        head_dim=hd, n_head_kv=kv, n_ff=ff,
        sliding_window=int(tc.get("sliding_window") or 0),
        eps=float(tc.get("rms_norm_eps", 1e-6)),
        ctx=int(tc.get("max_position_embeddings", 131072)),
        theta_full=float(full_rp.get("rope_theta", 1e6)),
        theta_swa=float(swa_rp.get("rope_theta", 1e4)),
        rope_factor_full=float(full_rp.get("factor", 1.0)),
        partial_full=float(full_rp.get("partial_rotary_factor", 1.0)),
        rope_type_full=full_rp.get("rope_type", "default"),
        n_shared_kv=int(tc.get("num_kv_shared_layers") or 0),
        n_embd_per_layer=int(tc.get("hidden_size_per_layer_input") or 0),
        softcap_final=tc.get("final_logit_softcapping"),
        softcap_attn=tc.get("attn_logit_softcapping"),
        n_expert=int(tc.get("num_experts") or 0) if tc.get("enable_moe_block") else 0,
        n_expert_used=int(tc.get("top_k_experts") or 0) if tc.get("enable_moe_block") else 0,
        n_ff_exp=int(tc.get("moe_intermediate_size") or 0) if tc.get("enable_moe_block") else 0,
        query_pre_attn_scalar=tc.get("query_pre_attn_scalar"),
        tied=bool(cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings", True))),
    )
    if swa_rp.get("rope_type", "default") != "default":
        raise ConvertError("sliding layers with non-default RoPE are not supported")
    if arch == "gemma4-assistant":
        hp.n_embd_backbone = int(cfg.get("backbone_hidden_size") or tensors["post_projection.weight"].shape[0])
        hp.n_shared_kv = L
        hp.softcap_final = None
        if cfg.get("use_ordered_embeddings"):
            hp.n_centroids = int(cfg.get("num_centroids", 2048))
            hp.centroid_top_k = int(cfg.get("centroid_intermediate_top_k", 32))
            c = tensors.get("masked_embedding.centroids.weight")
            o = tensors.get("masked_embedding.token_ordering")
            if c is None or o is None:
                raise ConvertError("use_ordered_embeddings is set but masked_embedding.centroids.weight or "
                                   "masked_embedding.token_ordering is missing")
            if c.shape != (hp.n_centroids, D) or o.shape != (n_vocab,) or n_vocab % hp.n_centroids \
                    or not 0 < hp.centroid_top_k <= hp.n_centroids:
                raise ConvertError(f"centroid head: centroids {c.shape}, ordering {o.shape}, top_k "
                                   f"{hp.centroid_top_k} do not fit {hp.n_centroids} centroids, D={D}, V={n_vocab}")
    return hp


# --------------------------------------------------------------------------------------------
# tensor names
# --------------------------------------------------------------------------------------------

_TOP = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
}
_ASSISTANT_TOP = {
    "pre_projection.weight": "nextn.pre_projection.weight",
    "post_projection.weight": "nextn.post_projection.weight",
    "masked_embedding.centroids.weight": "masked_embd_centroids.weight",
    "masked_embedding.token_ordering": "masked_embd_ordering",  # no .weight: llama.cpp's name
}


def gguf_name(hf_name: str, prefix: str, arch: str) -> str | None:
    """HF tensor name -> GGUF name; None for tensors that are deliberately dropped."""
    if hf_name.startswith(SKIP_PREFIXES) and not hf_name.startswith(prefix):
        return None
    if arch == "gemma4-assistant":
        if hf_name in _ASSISTANT_TOP:
            return _ASSISTANT_TOP[hf_name]
    if hf_name == "lm_head.weight":
        return "output.weight"
    if not hf_name.startswith(prefix):
        raise ConvertError(f"unexpected tensor {hf_name!r} (expected prefix {prefix!r})")
    n = hf_name[len(prefix):]
    if n in _TOP:
        return _TOP[n]
    if n.startswith("layers."):
        _, idx, rest = n.split(".", 2)
        if rest in _LAYER:
            return f"blk.{int(idx)}.{_LAYER[rest]}"
    raise ConvertError(f"no GGUF name for tensor {hf_name!r}")


# --------------------------------------------------------------------------------------------
# metadata
# --------------------------------------------------------------------------------------------


def _scalar_or_array(vals: list):
    return vals[0] if all(v == vals[0] for v in vals) else [int(v) for v in vals]


def write_hparams(w: gguf.GGUFWriter, hp: Hparams, ftype: T, name: str) -> None:
    a = hp.arch
    w.add_name(name)
    w.add_file_type(int(FILE_TYPES[ftype]))
    w.add_context_length(hp.ctx)
    w.add_embedding_length(hp.n_embd)
    w.add_block_count(hp.n_layer)
    w.add_head_count(hp.n_head)
    w.add_layer_norm_rms_eps(hp.eps)
    w.add_sliding_window(hp.sliding_window)
    swa = [t == "sliding_attention" for t in hp.layer_types]
    hd_swa = [h for h, s in zip(hp.head_dim, swa) if s]
    hd_full = [h for h, s in zip(hp.head_dim, swa) if not s]
    if a == "gemma3":
        w.add_feed_forward_length(_scalar_or_array(hp.n_ff))
        w.add_head_count_kv(_scalar_or_array(hp.n_head_kv))
        w.add_key_length(hp.head_dim[0])
        w.add_value_length(hp.head_dim[0])
        w.add_rope_freq_base(hp.theta_full)
        # not in llama.cpp's gemma3 files (it hard-codes pattern 6 and swa base 1e4); harmless extras
        w.add_sliding_window_pattern(swa)
        w.add_rope_freq_base_swa(hp.theta_swa)
        if hp.rope_type_full == "linear" and hp.rope_factor_full != 1.0:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(hp.rope_factor_full)
        if hp.query_pre_attn_scalar is not None and float(hp.query_pre_attn_scalar) != hp.head_dim[0]:
            # llama.cpp derives the scale from key_length (27B aside); record the real one for our loader
            w.add_float32(f"{a}.attention.scale", float(hp.query_pre_attn_scalar) ** -0.5)
        if hp.softcap_final:
            w.add_final_logit_softcapping(float(hp.softcap_final))
        if hp.softcap_attn:
            w.add_float32(f"{a}.attn_logit_softcapping", float(hp.softcap_attn))
        return
    # gemma4 / gemma4-assistant (spec 3.2, 3.4a)
    w.add_feed_forward_length(_scalar_or_array(hp.n_ff))
    w.add_head_count_kv(_scalar_or_array(hp.n_head_kv))
    kf = hd_full[0] if hd_full else hd_swa[0]
    ks = hd_swa[0] if hd_swa else kf
    if len(set(hd_full)) > 1 or len(set(hd_swa)) > 1:
        raise ConvertError("head_dim must be the same across layers of one type")
    w.add_key_length(kf)
    w.add_value_length(kf)
    w.add_key_length_swa(ks)
    w.add_value_length_swa(ks)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(hp.n_shared_kv)
    w.add_rope_freq_base(hp.theta_full)
    w.add_rope_freq_base_swa(hp.theta_swa)
    w.add_rope_dimension_count(kf)
    w.add_rope_dimension_count_swa(ks)
    w.add_embedding_length_per_layer_input(hp.n_embd_per_layer)
    if a == "gemma4":
        # HF null means "no softcap"; llama.cpp defaults a missing key to 30, so write 0 explicitly
        w.add_final_logit_softcapping(float(hp.softcap_final or 0.0))
    if hp.n_expert:
        w.add_expert_count(hp.n_expert)
        w.add_expert_used_count(hp.n_expert_used)
        w.add_expert_feed_forward_length(hp.n_ff_exp)
    if a == "gemma4-assistant":
        w.add_uint32(f"{a}.embedding_length_out", hp.n_embd_backbone)
        w.add_uint32(f"{a}.nextn_predict_layers", hp.n_layer)
        if hp.n_centroids:
            w.add_bool(f"{a}.use_ordered_embeddings", True)
            w.add_uint32(f"{a}.n_centroids", hp.n_centroids)
            w.add_uint32(f"{a}.centroid_top_k", hp.centroid_top_k)


def rope_freqs(hp: Hparams) -> np.ndarray | None:
    """Full-layer freq factors (spec 2.5): factor for the rotated pairs, 1e30 for the rest."""
    if "full_attention" not in hp.layer_types or hp.arch == "gemma3":
        return None
    hd = max(h for h, t in zip(hp.head_dim, hp.layer_types) if t == "full_attention")
    if hp.rope_type_full == "proportional":
        rot = int(hp.partial_full * hd // 2)
    else:
        rot = hd // 2
    f = np.full(hd // 2, 1e30, dtype=np.float32)
    f[:rot] = hp.rope_factor_full
    return f


# --------------------------------------------------------------------------------------------
# vocabulary
# --------------------------------------------------------------------------------------------


def write_vocab(w: gguf.GGUFWriter, hf_dir: Path, hp: Hparams, log) -> None:
    """tokenizer.ggml.* from tokenizer.json if present, else a placeholder vocab of n_vocab tokens."""
    V = hp.n_vocab
    tj = hf_dir / "tokenizer.json"
    tok_model = "gemma4" if hp.arch.startswith("gemma4") else "llama"
    if not tj.exists():
        tokens = ["<pad>", "<eos>", "<bos>", "<unk>"][:V] + [f"<tok{i}>" for i in range(4, V)]
        types = [gguf.TokenType.CONTROL] * min(3, V) + [gguf.TokenType.UNKNOWN] * (V >= 4) \
            + [gguf.TokenType.NORMAL] * max(0, V - 4)
        w.add_tokenizer_model("none")
        w.add_token_list(tokens)
        w.add_token_types([int(t) for t in types])
        w.add_bool("gemma4cpu.vocab_placeholder", True)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_pad_token_id(0)
        w.add_unk_token_id(3)
        log(f"no tokenizer.json in {hf_dir}: wrote a placeholder vocab of {V} tokens "
            "(tokenizer.ggml.model=none, gemma4cpu.vocab_placeholder=true)")
        return
    spec = json.loads(tj.read_text())
    model = spec.get("model", {})
    vocab = model.get("vocab", {})
    id2tok: dict[int, str] = {}
    if isinstance(vocab, dict):
        id2tok = {int(i): t for t, i in vocab.items()}
    else:  # unigram: [[piece, score], ...]
        id2tok = {i: p[0] for i, p in enumerate(vocab)}
    scores = {}
    if isinstance(vocab, list):
        scores = {i: float(p[1]) for i, p in enumerate(vocab)}
    special, added = set(), set()
    for at in spec.get("added_tokens", []):
        id2tok[int(at["id"])] = at["content"]
        (special if at.get("special") else added).add(int(at["id"]))
    tokens, types, sc = [], [], []
    unk = model.get("unk_token")
    for i in range(V):
        t = id2tok.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(t)
            if i in special:
                types.append(gguf.TokenType.CONTROL)
            elif i in added:
                types.append(gguf.TokenType.USER_DEFINED)
            elif t == unk:
                types.append(gguf.TokenType.UNKNOWN)
            elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                types.append(gguf.TokenType.BYTE)
            else:
                types.append(gguf.TokenType.NORMAL)
        sc.append(scores.get(i, -float(i)))  # BPE has no scores: rank by id as SPM-BPE files do
    if len(id2tok) > V:
        log(f"warning: tokenizer has {len(id2tok)} tokens, model vocab {V}; extra ids dropped")
    w.add_tokenizer_model(tok_model)
    if tok_model == "gemma4":
        w.add_tokenizer_pre("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores(sc)
    w.add_token_types([int(t) for t in types])
    merges = model.get("merges") or []
    if merges and tok_model == "gemma4":
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    names = {"bos": 2, "eos": 1, "pad": 0, "unk": 3}
    tc = hf_dir / "tokenizer_config.json"
    if tc.exists():
        cfgt = json.loads(tc.read_text())
        tok2id = {t: i for i, t in id2tok.items()}
        for k in names:
            v = cfgt.get(f"{k}_token")
            if isinstance(v, dict):
                v = v.get("content")
            if v in tok2id:
                names[k] = tok2id[v]
    w.add_bos_token_id(names["bos"])
    w.add_eos_token_id(names["eos"])
    w.add_pad_token_id(names["pad"])
    w.add_unk_token_id(names["unk"])
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    log(f"vocab: {V} tokens from tokenizer.json ({model.get('type', '?')}, {len(merges)} merges)")


# --------------------------------------------------------------------------------------------
# conversion
# --------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    name: str
    src: _STensor | None  # None for generated tensors
    shape: tuple  # numpy order (rows..., ne0)
    qtype: T
    gen: np.ndarray | None = None
    add_one: bool = False  # gemma3 norms


def _pick_type(name: str, shape: tuple, outtype: T, log) -> T:
    if len(shape) <= 1 or name.endswith(("layer_output_scale.weight", ".scale")):
        return T.F32
    if name.endswith("ffn_gate_inp.weight"):
        return T.F32  # router: tiny and precision-sensitive (llama.cpp never quantises it)
    q = outtype
    while not can_quantize(shape[-1], q):
        nq = FALLBACK[q]
        log(f"note: {name} row length {shape[-1]} does not fit {q.name} blocks, using {nq.name}")
        q = nq
    return q


def _nbytes(shape: tuple, q: T) -> int:
    block, size = gguf.GGML_QUANT_SIZES[q]
    n = int(np.prod(shape))
    return n // block * size


def convert(hf_dir, out, outtype: str = "f16", quiet: bool = False) -> Path:
    """Convert HF_DIR to the GGUF file `out`; returns its path. Raises ConvertError on bad input."""
    hf_dir, out = Path(hf_dir), Path(out)

    def log(msg):
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown --outtype {outtype!r}; choose from {', '.join(OUTTYPES)}")
    qout = OUTTYPES[outtype]
    if not hf_dir.is_dir():
        raise ConvertError(f"{hf_dir} is not a directory")
    cfg_path = hf_dir / "config.json"
    if not cfg_path.exists():
        raise ConvertError(f"missing {cfg_path}")
    cfg = json.loads(cfg_path.read_text())
    archs = cfg.get("architectures") or []
    if not archs or archs[0] not in SUPPORTED:
        raise ConvertError(f"unsupported architecture {archs[0] if archs else None!r} in {cfg_path}; "
                           f"supported: {', '.join(SUPPORTED)}")
    arch, prefix = SUPPORTED[archs[0]]
    tensors = read_safetensors_index(hf_dir)
    if prefix + "embed_tokens.weight" not in tensors:
        raise ConvertError(f"no {prefix}embed_tokens.weight in the safetensors of {hf_dir}")
    hp = hparams_from_config(cfg, arch, tensors, prefix)
    log(f"{archs[0]} -> arch {arch}: {hp.n_layer} layers, D={hp.n_embd}, V={hp.n_vocab}, "
        f"types {''.join('F' if t == 'full_attention' else 's' for t in hp.layer_types)}, outtype {outtype}")

    plans: list[_Plan] = []
    rf = rope_freqs(hp)
    if rf is not None:
        plans.append(_Plan("rope_freqs.weight", None, rf.shape, T.F32, gen=rf))
    dropped = []
    for hf_name in sorted(tensors, key=_natural):
        gname = gguf_name(hf_name, prefix, arch)
        if gname is None:
            continue
        if gname == "output.weight" and hp.tied:
            continue
        if gname.startswith("masked_embd_") and not hp.n_centroids:
            continue  # a centroid head the config does not use
        if arch == "gemma4" and _unused_shared_kv(gname, hp):
            dropped.append(gname)
            continue
        t = tensors[hf_name]
        shape = t.shape if len(t.shape) else (1,)
        if gname == "masked_embd_ordering":  # small: checked before anything is written
            order = load_tensor(t)
            if not np.array_equal(np.sort(order), np.arange(order.size)):
                raise ConvertError(f"{hf_name} is not a permutation of 0..{order.size - 1} "
                                   "(HF leaves the buffer zeroed unless it is set)")
            plans.append(_Plan(gname, None, shape, T.I32, gen=order.astype(np.int32)))
            continue
        add_one = arch == "gemma3" and "norm" in gname and len(shape) == 1
        plans.append(_Plan(gname, t, shape, _pick_type(gname, shape, qout, log), add_one=add_one))

    if dropped:
        log(f"dropped {len(dropped)} K/V tensors of KV-shared layers (never used): {dropped[0]}, ...")

    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    write_hparams(w, hp, qout, cfg.get("_name_or_path") or hf_dir.name)
    write_vocab(w, hf_dir, hp, log)
    for p in plans:
        if p.qtype == T.I32:
            w.add_tensor_info(p.name, p.shape, np.dtype(np.int32), _nbytes(p.shape, p.qtype))
        elif p.qtype in (T.F32, T.F16):
            w.add_tensor_info(p.name, p.shape, np.dtype(np.float32 if p.qtype == T.F32 else np.float16),
                              _nbytes(p.shape, p.qtype))
        else:
            w.add_tensor_info(p.name, p.shape, np.dtype(np.float32), _nbytes(p.shape, p.qtype), raw_dtype=p.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.time()
    total = sum(_nbytes(p.shape, T.F32) for p in plans)
    done = 0
    for i, p in enumerate(plans):
        x = p.gen if p.gen is not None else load_tensor(p.src).reshape(p.shape)
        if p.add_one:
            x = x + np.float32(1.0)
        data = x if p.qtype == T.I32 else quantize(x, p.qtype)
        w.write_tensor_data(data)
        done += _nbytes(p.shape, T.F32)
        log(f"[{i + 1:4d}/{len(plans)}] {p.name:40s} {tuple(reversed(p.shape))!s:22s} {p.qtype.name:5s} "
            f"{100 * done / total:5.1f}% {time.time() - t0:6.1f}s")
    w.close()
    log(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return out


def _unused_shared_kv(gname: str, hp: Hparams) -> bool:
    """K/V projections and k_norm of KV-shared layers: HF checkpoints may carry them, no one reads them
    (spec 2.6: "GGUF may omit attn_k/attn_v/attn_k_norm for shared layers")."""
    if not gname.startswith("blk.") or not hp.n_shared_kv:
        return False
    il = int(gname.split(".")[1])
    return il >= hp.n_layer - hp.n_shared_kv and gname.split(".", 2)[2] in (
        "attn_k.weight", "attn_v.weight", "attn_k_norm.weight")


def _natural(name: str):
    return [int(s) if s.isdigit() else s for s in name.replace(".", " . ").split()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gemma4cpu.convert",
                                 description="Convert a Hugging Face Gemma 4 / Gemma 3 checkpoint to GGUF.")
    ap.add_argument("hf_dir", help="directory with config.json and *.safetensors")
    ap.add_argument("-o", "--outfile", required=True, help="output .gguf path")
    ap.add_argument("--outtype", default="f16", choices=list(OUTTYPES),
                    help="type of the matrices (1-D tensors are always f32); default f16")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    args = ap.parse_args(argv)
    try:
        convert(args.hf_dir, args.outfile, args.outtype, quiet=args.quiet)
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
