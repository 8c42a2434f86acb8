"""gemma4cpu.convert and its Q4_K quantiser, without torch: checkpoints are written with numpy."""
import json
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants as gq

from gemma4cpu.convert import ConvertError, convert, main
from gemma4cpu.convert_quant import quantize_q4_K, unpack_q4_K_scales

U32 = 2.0 ** -24


# --------------------------------------------------------------------------------------------
# Q4_K quantiser
# --------------------------------------------------------------------------------------------


def _decode_own(blocks):
    """Our own reading of block_q4_K (layout of csrc/g4_blocks.h) -> float64 (nb, 256)."""
    d_eff, m_eff = unpack_q4_K_scales(blocks)  # (nb, 8)
    qs = blocks.reshape(-1, 144)[:, 16:].reshape(-1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float64)
    return (d_eff[:, :, None] * q - m_eff[:, :, None]).reshape(-1, 256), d_eff, m_eff


@pytest.mark.parametrize("kind", ["normal", "heavy_tails", "positive", "negative", "tiny", "mixed_scale"])
def test_q4_K_round_trip(kind, rng):
    x = rng.standard_normal((32, 512)).astype(np.float32)
    if kind == "heavy_tails":
        x = rng.standard_t(2, size=(32, 512)).astype(np.float32)
    elif kind == "positive":
        x = np.abs(x) + 0.5
    elif kind == "negative":
        x = -np.abs(x) - 0.5
    elif kind == "tiny":
        x = x * 1e-3
    elif kind == "mixed_scale":  # sub-blocks of very different magnitude within one super-block
        x = x * np.repeat(10.0 ** rng.integers(-3, 1, size=(32, 16)), 32, axis=1).astype(np.float32)
    b = quantize_q4_K(x)
    assert b.shape == (32, 2 * 144) and b.dtype == np.uint8
    y = gq.dequantize(b, T.Q4_K)  # external oracle for the layout
    own, d_eff, m_eff = _decode_own(b)
    # 1. gguf reads our blocks exactly as we meant them (float32 rounding of d*sc*q - dmin*m only)
    np.testing.assert_allclose(y.reshape(-1, 256), own, rtol=0, atol=4 * U32 * np.abs(own).max())

    # 2. every value inside its sub-block's representable range [-m, 15d - m] is rounded to the
    #    nearest level: error <= d/2 (+ float32 evaluation of the level in gguf)
    xs = x.reshape(-1, 8, 32).astype(np.float64)
    err = np.abs(xs - y.reshape(-1, 8, 32))
    lo, hi = -m_eff[:, :, None], 15 * d_eff[:, :, None] - m_eff[:, :, None]
    inside = (xs >= lo) & (xs <= hi)
    slack = 4 * U32 * (np.abs(xs) + 15 * d_eff[:, :, None] + m_eff[:, :, None])
    assert np.all(err[inside] <= (d_eff[:, :, None] / 2 + slack)[inside])
    # outside the range the value is clamped to the nearest end level
    end = np.where(xs < lo, lo, hi)
    np.testing.assert_allclose(y.reshape(-1, 8, 32)[~inside], end[~inside], rtol=1e-6, atol=1e-6 * np.abs(xs).max())

    # 3. quality: no worse than the plain min-max 4-bit quantiser of each sub-block, whose RMS error
    #    is step/sqrt(12) with step = (max - min(min, 0)) / 15 (uniform rounding error); ours also
    #    pays the 6-bit rounding of scales/mins, and for non-Gaussian data allow 10% over it
    sub = x.reshape(-1, 32).astype(np.float64)
    step = (sub.max(1) - np.minimum(sub.min(1), 0)) / 15
    rms_minmax = np.sqrt(np.mean(step ** 2 / 12))
    rms = np.sqrt(np.mean((x - y) ** 2))
    assert rms <= 1.1 * rms_minmax, (rms, rms_minmax)


def test_q4_K_special_blocks():
    z = np.zeros((1, 256), np.float32)
    assert np.array_equal(gq.dequantize(quantize_q4_K(z), T.Q4_K), z)
    c = np.full((1, 256), 0.75, np.float32)  # constant: min 0, one level hits 0.75 up to f16 of d
    assert np.abs(gq.dequantize(quantize_q4_K(c), T.Q4_K) - c).max() <= 0.75 * 2 ** -10
    levels = (np.arange(256) % 16).astype(np.float32).reshape(1, 256) * 0.125  # exactly representable
    assert np.abs(gq.dequantize(quantize_q4_K(levels), T.Q4_K) - levels).max() <= 2 * 2 ** -11 * 1.875
    with pytest.raises(ValueError):
        quantize_q4_K(np.zeros((2, 100), np.float32))


def test_q4_K_can_fail():
    """The layout check above is not vacuous: one flipped nibble changes gguf's reading."""
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    b = quantize_q4_K(x)
    b2 = b.copy()
    b2[0, 16] ^= 0x0F
    assert not np.array_equal(gq.dequantize(b, T.Q4_K), gq.dequantize(b2, T.Q4_K))


# --------------------------------------------------------------------------------------------
# a synthetic Gemma 4 checkpoint written with numpy
# --------------------------------------------------------------------------------------------


def write_safetensors(path, tensors: dict, bf16: bool = False):
    """Minimal safetensors writer: {name: float32 array} -> file (F32, or BF16 by truncation);
    integer arrays as I64."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if np.asarray(a).dtype.kind in "iu":
            raw, dt = np.ascontiguousarray(a, dtype="<i8").tobytes(), "I64"
        else:
            a = np.ascontiguousarray(a, dtype=np.float32)
            raw = (a.view(np.uint32) >> 16).astype(np.uint16).tobytes() if bf16 else a.tobytes()
            dt = "BF16" if bf16 else "F32"
        header[name] = {"dtype": dt, "shape": list(np.shape(a)), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


D, V, HQ, HKV, HD, HD_FULL, FF = 256, 320, 2, 1, 128, 256, 512
LAYER_TYPES = ["sliding_attention", "full_attention"]


def synthetic_gemma4(d, rng, bf16=False, extra=None):
    """A 2-layer Gemma 4 (sliding, full with K=V) with D = 256 so Q4_K fits its rows."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "vocab_size": V, "hidden_size": D, "intermediate_size": FF, "num_hidden_layers": 2,
        "num_attention_heads": HQ, "num_key_value_heads": HKV, "head_dim": HD, "sliding_window": 16,
        "layer_types": LAYER_TYPES, "attention_k_eq_v": True, "final_logit_softcapping": 30.0,
        "per_layer_config": {"1": {"head_dim": HD_FULL, "num_key_value_heads": 1}},
        "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        "hidden_size_per_layer_input": 0, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }
    t = {"model.embed_tokens.weight": rng.standard_normal((V, D)), "model.norm.weight": rng.uniform(0.5, 1.5, D)}
    for i, hd in enumerate([HD, HD_FULL]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rng.standard_normal((HQ * hd, D))
        t[p + "self_attn.k_proj.weight"] = rng.standard_normal((HKV * hd, D))
        if i == 0:
            t[p + "self_attn.v_proj.weight"] = rng.standard_normal((HKV * hd, D))
        t[p + "self_attn.o_proj.weight"] = rng.standard_normal((D, HQ * hd))
        t[p + "self_attn.q_norm.weight"] = rng.uniform(0.5, 1.5, hd)
        t[p + "self_attn.k_norm.weight"] = rng.uniform(0.5, 1.5, hd)
        for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"]:
            t[p + n + ".weight"] = rng.uniform(0.5, 1.5, D)
        t[p + "mlp.gate_proj.weight"] = rng.standard_normal((FF, D))
        t[p + "mlp.up_proj.weight"] = rng.standard_normal((FF, D))
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((D, FF))
        t[p + "layer_scalar"] = rng.uniform(0.3, 1.5, 1)
    if extra:
        t.update(extra)
    (d / "config.json").write_text(json.dumps(cfg))
    write_safetensors(d / "model.safetensors", {k: 0.05 * v if v.ndim > 1 else v for k, v in t.items()}, bf16)
    return {k: (0.05 * v if v.ndim > 1 else v).astype(np.float32) for k, v in t.items()}


NAME = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight", "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "layer_scalar": "layer_output_scale.weight",
}


def gguf_of(hf_name):
    if hf_name in NAME:
        return NAME[hf_name]
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{NAME[rest]}"


def read(path):
    r = GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.token")}
    return r, kv, {t.name: t for t in r.tensors}


def deq(t):
    shape = tuple(int(s) for s in reversed(t.shape))
    if t.tensor_type in (T.F32, T.F16):
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    return gq.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)


@pytest.mark.parametrize("outtype,matrix_type", [("f32", T.F32), ("f16", T.F16), ("bf16", T.BF16),
                                                 ("q8_0", T.Q8_0), ("q4_k", T.Q4_K)])
def test_convert_gemma4_keys_and_tensors(tmp_path, rng, outtype, matrix_type):
    src = synthetic_gemma4(tmp_path / "hf", rng)
    out = convert(tmp_path / "hf", tmp_path / "m.gguf", outtype, quiet=True)
    r, kv, tensors = read(out)
    a = "gemma4"
    expect = {
        "general.architecture": "gemma4", f"{a}.block_count": 2, f"{a}.embedding_length": D,
        f"{a}.attention.head_count": HQ, f"{a}.attention.head_count_kv": 1, f"{a}.feed_forward_length": FF,
        f"{a}.attention.key_length": HD_FULL, f"{a}.attention.value_length": HD_FULL,
        f"{a}.attention.key_length_swa": HD, f"{a}.attention.value_length_swa": HD,
        f"{a}.attention.sliding_window": 16, f"{a}.attention.sliding_window_pattern": [True, False],
        f"{a}.attention.shared_kv_layers": 0, f"{a}.rope.freq_base": 1e6, f"{a}.rope.freq_base_swa": 1e4,
        f"{a}.rope.dimension_count": HD_FULL, f"{a}.rope.dimension_count_swa": HD,
        f"{a}.embedding_length_per_layer_input": 0, f"{a}.final_logit_softcapping": 30.0,
        f"{a}.context_length": 4096, "tokenizer.ggml.model": "none", "gemma4cpu.vocab_placeholder": True,
    }
    for k, v in expect.items():
        assert kv.get(k) == pytest.approx(v), k
    assert len(r.fields["tokenizer.ggml.tokens"].data) == V
    # every source tensor is there, under its spec-3.3 name, with its ggml shape
    assert set(tensors) == {gguf_of(k) for k in src} | {"rope_freqs.weight"}
    for hf_name, x in src.items():
        t = tensors[gguf_of(hf_name)]
        assert tuple(int(s) for s in t.shape) == tuple(reversed(x.shape)), hf_name
        got = deq(t)
        if x.ndim == 1:  # norms, layer scalar: F32, raw (no +1 for gemma4)
            assert t.tensor_type == T.F32
            np.testing.assert_array_equal(got, x)
            continue
        assert t.tensor_type == matrix_type, hf_name
        amax = np.abs(x).max()
        tol = {T.F32: 0, T.F16: 2 ** -11 * amax, T.BF16: 2 ** -8 * amax, T.Q8_0: amax / 254 + 2 ** -11 * amax,
               T.Q4_K: None}[matrix_type]
        if tol is None:  # Q4_K: rows re-quantised with our quantiser give the same bytes
            assert np.array_equal(np.asarray(t.data).reshape(-1), quantize_q4_K(x).reshape(-1))
        else:
            assert np.abs(got - x).max() <= tol, hf_name
    rf = deq(tensors["rope_freqs.weight"])  # proportional RoPE, 25% of 256: 32 rotated pairs of 128
    assert rf.shape == (HD_FULL // 2,)
    assert np.all(rf[:32] == 1.0) and np.all(rf[32:] == np.float32(1e30))
    assert "blk.1.attn_v.weight" not in tensors  # K=V full layer


def test_convert_bf16_input_and_cli(tmp_path, rng, capsys):
    src = synthetic_gemma4(tmp_path / "hf", rng, bf16=True)
    assert main([str(tmp_path / "hf"), "-o", str(tmp_path / "m.gguf"), "--outtype", "f32"]) == 0
    err = capsys.readouterr().err
    assert "placeholder vocab" in err and "[" in err  # the log line and the progress lines
    _, _, tensors = read(tmp_path / "m.gguf")
    x = src["model.layers.0.mlp.up_proj.weight"]
    x_bf16 = ((x.view(np.uint32) >> 16) << 16).view(np.float32)  # what the file holds
    np.testing.assert_array_equal(deq(tensors["blk.0.ffn_up.weight"]), x_bf16)


def test_convert_q4_k_fallback_for_short_rows(tmp_path, rng):
    """A matrix whose rows are not a multiple of 256 cannot be Q4_K: it falls back to Q8_0."""
    synthetic_gemma4(tmp_path / "hf", rng)
    convert(tmp_path / "hf", tmp_path / "m.gguf", "q4_k", quiet=True)
    # ffn_down rows are FF = 512 long (Q4_K ok); all rows here fit, so check a 1-D stays F32
    _, _, tensors = read(tmp_path / "m.gguf")
    assert tensors["blk.0.ffn_down.weight"].tensor_type == T.Q4_K
    assert tensors["blk.0.attn_q_norm.weight"].tensor_type == T.F32
    from gemma4cpu.convert import _pick_type
    assert _pick_type("blk.0.attn_q.weight", (64, 96), T.Q4_K, lambda m: None) == T.Q8_0
    assert _pick_type("blk.0.attn_q.weight", (64, 48), T.Q4_K, lambda m: None) == T.F16


def test_convert_bad_inputs(tmp_path, rng, capsys):
    with pytest.raises(ConvertError, match="not a directory"):
        convert(tmp_path / "nope", tmp_path / "m.gguf", "f32", quiet=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConvertError, match="missing .*config.json"):
        convert(tmp_path / "empty", tmp_path / "m.gguf", "f32", quiet=True)
    synthetic_gemma4(tmp_path / "hf", rng)
    with pytest.raises(ConvertError, match="unknown --outtype"):
        convert(tmp_path / "hf", tmp_path / "m.gguf", "q3_k", quiet=True)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="unsupported architecture 'LlamaForCausalLM'"):
        convert(tmp_path / "hf", tmp_path / "m.gguf", "f32", quiet=True)
    assert main([str(tmp_path / "hf"), "-o", str(tmp_path / "m.gguf")]) == 2
    assert "error: unsupported architecture" in capsys.readouterr().err
    cfg["architectures"] = ["Gemma4ForCausalLM"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf" / "model.safetensors").unlink()
    with pytest.raises(ConvertError, match="no \\*.safetensors"):
        convert(tmp_path / "hf", tmp_path / "m.gguf", "f32", quiet=True)
    synthetic_gemma4(tmp_path / "hf2", rng, extra={"model.layers.0.mystery.weight": np.ones((4, 4))})
    with pytest.raises(ConvertError, match="no GGUF name for tensor 'model.layers.0.mystery.weight'"):
        convert(tmp_path / "hf2", tmp_path / "m.gguf", "f32", quiet=True)
    with pytest.raises(SystemExit):
        main(["--help"])


def test_convert_writes_vocab_from_tokenizer_json(tmp_path, rng):
    """tokenizer.json (BPE) -> tokenizer.ggml.*: ids kept, special tokens CONTROL, byte tokens BYTE,
    merges written, ids past the tokenizer padded to the model's vocabulary size."""
    synthetic_gemma4(tmp_path / "hf", rng)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<0x41>": 4, "▁the": 5, "a": 6, "b": 7, "ab": 8}
    spec = {"model": {"type": "BPE", "vocab": vocab, "merges": [["a", "b"]], "unk_token": "<unk>"},
            "added_tokens": [{"id": i, "content": t, "special": True} for t, i in list(vocab.items())[:4]]
            + [{"id": 9, "content": "<|turn>", "special": False}]}
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(spec))
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    convert(tmp_path / "hf", tmp_path / "m.gguf", "f32", quiet=True)
    r = GGUFReader(str(tmp_path / "m.gguf"))
    f = r.fields
    toks = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    assert len(toks) == V and toks[:10] == list(vocab) + ["<|turn>"] and toks[10] == "[PAD10]"
    assert types[:10] == [3, 3, 3, 3, 6, 1, 1, 1, 1, 4] and types[10] == 5
    assert f["tokenizer.ggml.model"].contents() == "gemma4"
    assert f["tokenizer.ggml.merges"].contents() == ["a b"]
    assert f["tokenizer.ggml.bos_token_id"].contents() == 2 and f["tokenizer.ggml.eos_token_id"].contents() == 1
    assert "gemma4cpu.vocab_placeholder" not in f


def test_convert_multimodal_checkpoint_text_part(tmp_path, rng):
    """Gemma4ForConditionalGeneration: text weights under model.language_model., config under
    text_config; vision/audio towers are skipped."""
    src = synthetic_gemma4(tmp_path / "hf", rng)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    mm = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
          "text_config": {k: v for k, v in cfg.items() if k != "architectures"}, "tie_word_embeddings": True}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(mm))
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in src.items()}
    renamed["model.vision_tower.patch_embedder.weight"] = np.ones((8, 8), np.float32)
    renamed["model.embed_audio.embedding_projection.weight"] = np.ones((8, 8), np.float32)
    write_safetensors(tmp_path / "hf" / "model.safetensors", renamed)
    convert(tmp_path / "hf", tmp_path / "m.gguf", "f32", quiet=True)
    _, kv, tensors = read(tmp_path / "m.gguf")
    assert kv["gemma4.block_count"] == 2 and kv["gemma4.attention.key_length"] == HD_FULL
    assert set(tensors) == {gguf_of(k) for k in src} | {"rope_freqs.weight"}
    np.testing.assert_array_equal(deq(tensors["blk.1.attn_q.weight"]), src["model.layers.1.self_attn.q_proj.weight"])


def test_kv_shared_layers_drop_unused_kv_tensors():
    """HF E-model checkpoints may still carry k/v projections for KV-shared layers; they are not written."""
    from gemma4cpu.convert import Hparams, _unused_shared_kv

    hp = Hparams(arch="gemma4", n_layer=10, n_embd=64, n_head=4, n_vocab=8, layer_types=["sliding_attention"] * 10,
                 head_dim=[16] * 10, n_head_kv=[1] * 10, n_ff=[32] * 10, sliding_window=8, eps=1e-6, ctx=64,
                 theta_full=1e6, theta_swa=1e4, n_shared_kv=4)
    assert _unused_shared_kv("blk.6.attn_k.weight", hp) and _unused_shared_kv("blk.9.attn_k_norm.weight", hp)
    assert _unused_shared_kv("blk.7.attn_v.weight", hp)
    assert not _unused_shared_kv("blk.5.attn_k.weight", hp)  # last producer layers keep theirs
    assert not _unused_shared_kv("blk.6.attn_q.weight", hp) and not _unused_shared_kv("token_embd.weight", hp)


# --------------------------------------------------------------------------------------------
# a synthetic MTP assistant with the centroid head (spec 3.4a, 4.5)
# --------------------------------------------------------------------------------------------

DT, NC, TOPK = 128, 32, 4  # backbone width, centroids (V / NC = 10 tokens each), clusters scored


def synthetic_assistant(d, rng, ordering=None, ordered=True):
    """A 2-layer Gemma4AssistantForCausalLM (sliding, full) of width D = 256 for a D_t = 128 target."""
    d.mkdir(parents=True, exist_ok=True)
    text = {"model_type": "gemma4_text", "vocab_size": V, "hidden_size": D, "intermediate_size": FF,
            "num_hidden_layers": 2, "num_attention_heads": HQ, "num_key_value_heads": HKV, "head_dim": HD,
            "global_head_dim": HD_FULL, "sliding_window": 16, "layer_types": LAYER_TYPES,
            "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 2, "final_logit_softcapping": None}
    cfg = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant", "text_config": text,
           "backbone_hidden_size": DT, "use_ordered_embeddings": ordered, "num_centroids": NC,
           "centroid_intermediate_top_k": TOPK, "tie_word_embeddings": True}
    t = {"model.embed_tokens.weight": rng.standard_normal((V, D)), "model.norm.weight": rng.uniform(0.5, 1.5, D),
         "pre_projection.weight": rng.standard_normal((D, 2 * DT)),
         "post_projection.weight": rng.standard_normal((DT, D))}
    for i, hd in enumerate([HD, HD_FULL]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rng.standard_normal((HQ * hd, D))
        t[p + "self_attn.o_proj.weight"] = rng.standard_normal((D, HQ * hd))
        t[p + "self_attn.q_norm.weight"] = rng.uniform(0.5, 1.5, hd)
        for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"]:
            t[p + n + ".weight"] = rng.uniform(0.5, 1.5, D)
        for n, shape in (("gate", (FF, D)), ("up", (FF, D)), ("down", (D, FF))):
            t[p + f"mlp.{n}_proj.weight"] = rng.standard_normal(shape)
        t[p + "layer_scalar"] = rng.uniform(0.3, 1.5, 1)
    t = {k: (0.05 * v if v.ndim > 1 else v).astype(np.float32) for k, v in t.items()}
    if ordered:
        t["masked_embedding.centroids.weight"] = rng.standard_normal((NC, D)).astype(np.float32)
        t["masked_embedding.token_ordering"] = rng.permutation(V) if ordering is None else ordering
    (d / "config.json").write_text(json.dumps(cfg))
    write_safetensors(d / "model.safetensors", t)
    return t


@pytest.mark.parametrize("outtype,matrix_type", [("f32", T.F32), ("q4_k", T.Q4_K)])
def test_convert_assistant_centroid_head(tmp_path, rng, outtype, matrix_type):
    """use_ordered_embeddings: three keys, the centroid matrix {D_a, n_c} like any other matrix, the
    HF permutation as I32 {V} under llama.cpp's name (no .weight)."""
    src = synthetic_assistant(tmp_path / "hf", rng)
    r, kv, tensors = read(convert(tmp_path / "hf", tmp_path / "a.gguf", outtype, quiet=True))
    a = "gemma4-assistant"
    assert kv["general.architecture"] == a and kv[f"{a}.embedding_length_out"] == DT
    assert kv[f"{a}.use_ordered_embeddings"] is True
    assert kv[f"{a}.n_centroids"] == NC and kv[f"{a}.centroid_top_k"] == TOPK
    ftype = {k: r.fields[k].types for k in (f"{a}.use_ordered_embeddings", f"{a}.n_centroids", f"{a}.centroid_top_k")}
    from gguf import GGUFValueType as VT
    assert list(ftype.values()) == [[VT.BOOL], [VT.UINT32], [VT.UINT32]]
    c, o = tensors["masked_embd_centroids.weight"], tensors["masked_embd_ordering"]
    assert [int(x) for x in c.shape] == [D, NC] and c.tensor_type == matrix_type
    assert [int(x) for x in o.shape] == [V] and o.tensor_type == T.I32
    x = src["masked_embedding.centroids.weight"]
    if matrix_type == T.F32:
        np.testing.assert_array_equal(deq(c), x)
    else:
        assert np.array_equal(np.asarray(c.data).reshape(-1), quantize_q4_K(x).reshape(-1))
    assert np.asarray(o.data).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(o.data), src["masked_embedding.token_ordering"])
    assert {"nextn.pre_projection.weight", "nextn.post_projection.weight", "rope_freqs.weight"} <= set(tensors)


def test_convert_assistant_without_centroid_head(tmp_path, rng):
    synthetic_assistant(tmp_path / "hf", rng, ordered=False)
    _, kv, tensors = read(convert(tmp_path / "hf", tmp_path / "a.gguf", "f32", quiet=True))
    assert not any("centroid" in k or "ordered" in k for k in kv)
    assert not any(n.startswith("masked_embd") for n in tensors)


def test_convert_assistant_bad_centroid_head(tmp_path, rng):
    """A zeroed token_ordering (HF's init when the buffer is never set) is refused before writing."""
    synthetic_assistant(tmp_path / "hf", rng, ordering=np.zeros(V, np.int64))
    with pytest.raises(ConvertError, match="not a permutation"):
        convert(tmp_path / "hf", tmp_path / "a.gguf", "f32", quiet=True)
    assert not (tmp_path / "a.gguf").exists()
    synthetic_assistant(tmp_path / "hf2", rng, ordering=rng.permutation(V - 10))
    with pytest.raises(ConvertError, match="centroid head"):
        convert(tmp_path / "hf2", tmp_path / "a.gguf", "f32", quiet=True)
