"""Synthetic full-size Gemma 4 GGUF files: real shapes, random but valid quantised blocks.

Timing does not depend on what the weights mean, so these give honest speed benchmarks of the
31B / 26B-A4B / E4B / E2B shapes without downloading 20 GB. Optionally fewer layers (per-layer
cost scales). Tensors are streamed to disk one at a time (memory stays small).

    python -m gemma4cpu.synth_model --shape 31B --layers 6 --mix q4_k_m -o /tmp/g4-31b-6l.gguf
    python -m gemma4cpu.synth_model --shape 31B --assistant -o /tmp/g4-31b-assistant.gguf

`write` makes a target (arch `gemma4`), `write_assistant` the MTP drafter of the same shape (arch
`gemma4-assistant`, spec 1.2 / 3.4a), which fits every synthetic target of that shape and vocabulary
whatever its layer count (as long as it has a sliding and a full layer holding K/V).
"""
from __future__ import annotations

import argparse
import sys
import time

import gguf
import numpy as np

from gemma4cpu.kernels import row_bytes
from gemma4cpu.synth import random_rows

# spec section 1.1
SHAPES = {
    "31B": dict(L=60, D=5376, Hq=32, kv_swa=16, kv_full=4, hd_swa=256, hd_full=512, k_eq_v=True, W=1024,
                ff=21504, period=6, ple=0, shared=0, n_expert=0),
    "26B-A4B": dict(L=30, D=2816, Hq=16, kv_swa=8, kv_full=2, hd_swa=256, hd_full=512, k_eq_v=True, W=1024,
                    ff=2112, period=6, ple=0, shared=0, n_expert=128, n_expert_used=8, ff_exp=704),
    "E4B": dict(L=42, D=2560, Hq=8, kv_swa=2, kv_full=2, hd_swa=256, hd_full=512, k_eq_v=False, W=512,
                ff=10240, period=6, ple=256, shared=18, n_expert=0),
    "E2B": dict(L=35, D=1536, Hq=8, kv_swa=1, kv_full=1, hd_swa=256, hd_full=512, k_eq_v=False, W=512,
                ff=6144, ff_wide=12288, period=5, ple=256, shared=20, n_expert=0),
}
VOCAB = 262144

# spec section 1.2: the MTP assistants. All have 4 layers [sliding x3, full]; kv heads, head dims and
# the sliding window are the target's (SHAPES); num_kv_shared_layers = 4 (no K/V of their own).
ASSISTANT_SHAPES = {
    "31B": dict(D=1024, Hq=32, ff=8192),
    "26B-A4B": dict(D=1024, Hq=16, ff=8192),
    "E4B": dict(D=256, Hq=4, ff=2048),
    "E2B": dict(D=256, Hq=4, ff=2048),
}
ASSISTANT_LAYERS = 4


def _use_more_bits(il: int, n: int) -> bool:
    """llama.cpp's Q4_K_M rule for attn_v / ffn_down: first and last eighth, and every third."""
    return il < n // 8 or il >= 7 * n // 8 or (il - n // 8) % 3 == 2


def plan(shape: str, n_layers: int | None, mix: str, vocab: int = VOCAB):
    """[(name, ggml type name, n_in, n_out or None for 1-D, extra dims)], metadata dict."""
    s = SHAPES[shape]
    L = s["L"] if n_layers is None else n_layers
    D, Hq = s["D"], s["Hq"]
    # keep the real layer pattern: full every `period` layers, last layer full
    is_swa = [(i + 1) % s["period"] != 0 for i in range(L)]
    is_swa[-1] = False
    # KV sharing: scale the shared tail with the layer count, and keep a producer of each type
    shared = round(s["shared"] * L / s["L"]) if s["shared"] else 0
    while shared and not all(any(is_swa[j] == is_swa[i] for j in range(L - shared)) for i in range(L - shared, L)):
        shared -= 1
    n_kv_layers = L - shared
    q = "Q8_0" if mix == "q8_0" else "Q4_K"
    hi = "Q8_0" if mix == "q8_0" else "Q6_K"
    tensors = [("token_embd.weight", hi, D, vocab), ("output_norm.weight", "F32", D, None),
               ("rope_freqs.weight", "F32", s["hd_full"] // 2, None)]
    if s["ple"]:
        tensors += [("per_layer_token_embd.weight", q, s["ple"] * L, vocab),
                    ("per_layer_model_proj.weight", "BF16", D, s["ple"] * L),
                    ("per_layer_proj_norm.weight", "F32", s["ple"], None)]
    ffs = []
    for il in range(L):
        hd = s["hd_swa"] if is_swa[il] else s["hd_full"]
        hkv = s["kv_swa"] if is_swa[il] else s["kv_full"]
        ff = s.get("ff_wide", s["ff"]) if (s.get("ff_wide") and il >= n_kv_layers) else s["ff"]
        ffs.append(ff)
        more = hi if _use_more_bits(il, L) else q
        p = f"blk.{il}."
        tensors += [(p + "attn_norm.weight", "F32", D, None), (p + "attn_q.weight", q, D, Hq * hd),
                    (p + "attn_q_norm.weight", "F32", hd, None)]
        if il < n_kv_layers:
            tensors += [(p + "attn_k.weight", q, D, hkv * hd), (p + "attn_k_norm.weight", "F32", hd, None)]
            if is_swa[il] or not s["k_eq_v"]:
                tensors.append((p + "attn_v.weight", more, D, hkv * hd))
        tensors += [(p + "attn_output.weight", q, Hq * hd, D), (p + "post_attention_norm.weight", "F32", D, None),
                    (p + "ffn_norm.weight", "F32", D, None), (p + "ffn_gate.weight", q, D, ff),
                    (p + "ffn_up.weight", q, D, ff), (p + "ffn_down.weight", more, ff, D),
                    (p + "post_ffw_norm.weight", "F32", D, None), (p + "layer_output_scale.weight", "F32", 1, None)]
        if s["n_expert"]:
            E, fe = s["n_expert"], s["ff_exp"]
            tensors += [(p + "ffn_gate_inp.weight", "F32", D, E), (p + "ffn_gate_inp.scale", "F32", D, None),
                        (p + "pre_ffw_norm_2.weight", "F32", D, None), (p + "post_ffw_norm_1.weight", "F32", D, None),
                        (p + "post_ffw_norm_2.weight", "F32", D, None),
                        (p + "ffn_gate_up_exps.weight", q, D, (2 * fe, E)), (p + "ffn_down_exps.weight", more, fe, (D, E)),
                        (p + "ffn_down_exps.scale", "F32", E, None)]
        if s["ple"]:
            tensors += [(p + "inp_gate.weight", q, D, s["ple"]), (p + "proj.weight", q, s["ple"], D),
                        (p + "post_norm.weight", "F32", D, None)]
    # K-quants need rows of whole 256-blocks: like llama.cpp, fall back for narrower rows
    # (26B-A4B: dense FFN 2112 and expert width 704 wide inputs)
    tensors = _k_fallback(tensors)
    meta = {**s, "L": L, "is_swa": is_swa, "shared": shared, "ffs": ffs}
    return tensors, meta


def _k_fallback(tensors):
    """K-quants need rows of whole 256-blocks: like llama.cpp, fall back for narrower rows."""
    fallback = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
    return [(n, fallback[t] if t in fallback and n_in % 256 else t, n_in, n_out) for n, t, n_in, n_out in tensors]


def _add_vocab(w: gguf.GGUFWriter, vocab: int):
    """A placeholder SentencePiece-style vocabulary so tools that insist on one can load the file
    (the same for a target and its assistant)."""
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)]
    toks += [f"t{i}" for i in range(vocab - len(toks))]
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", toks)
    w.add_array("tokenizer.ggml.scores", [0.0] * vocab)
    w.add_array("tokenizer.ggml.token_type", [3, 3, 3, 2] + [6] * 256 + [1] * (vocab - 260))
    w.add_uint32("tokenizer.ggml.bos_token_id", 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 3)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)


def _write_tensors(w: gguf.GGUFWriter, tensors, rng: np.random.Generator, progress: bool):
    """Tensor infos, header, metadata, then the data one tensor at a time (memory stays small)."""
    for name, t, n_in, n_out in tensors:
        qt = gguf.GGMLQuantizationType[t]
        if n_out is None:
            w.add_tensor_info(name, (n_in,), np.dtype(np.float32), n_in * 4, raw_dtype=qt)
        else:
            lead = n_out if isinstance(n_out, tuple) else (n_out,)   # (rows,) or (rows per expert, experts)
            n_rows = int(np.prod(lead))
            shape = tuple(reversed(lead)) + ((row_bytes(t, n_in),) if t != "F32" else (n_in,))
            w.add_tensor_info(name, shape, np.dtype(np.uint8) if t != "F32" else np.dtype(np.float32),
                              n_rows * row_bytes(t, n_in), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0, done, total = time.time(), 0, len(tensors)
    for name, t, n_in, n_out in tensors:
        if n_out is None:
            if name == "rope_freqs.weight":
                v = np.full(n_in, 1e30, np.float32)
                v[: n_in // 4] = 1.0  # proportional rope: 25% of the pairs rotate
            elif name.endswith("layer_output_scale.weight"):
                v = np.array([rng.uniform(0.3, 1.0)], np.float32)
            else:
                v = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
            w.write_tensor_data(v)
        else:
            # generate in row chunks so big tensors never sit in memory twice
            n_rows = int(np.prod(n_out))
            chunk = max(1, (64 << 20) // row_bytes(t, n_in))
            data = np.concatenate([random_rows(t, min(chunk, n_rows - r), n_in, rng) for r in range(0, n_rows, chunk)])
            w.write_tensor_data(data.reshape(n_rows, -1))
        done += 1
        if progress and (done % 20 == 0 or done == total):
            print(f"\r  wrote {done}/{total} tensors ({time.time() - t0:.0f}s)", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    w.close()


def _add_attention_keys(w, a: str, m: dict, shared_kv_layers: int) -> None:
    """The attention and RoPE keys a target and an assistant write alike (prefix `a`, plan `m`)."""
    w.add_uint32(a + "attention.head_count", m["Hq"])
    if m["kv_swa"] == m["kv_full"]:
        w.add_uint32(a + "attention.head_count_kv", m["kv_swa"])
    else:
        w.add_array(a + "attention.head_count_kv", [m["kv_swa"] if s else m["kv_full"] for s in m["is_swa"]])
    for key, v in (("key_length", m["hd_full"]), ("value_length", m["hd_full"]), ("key_length_swa", m["hd_swa"]),
                   ("value_length_swa", m["hd_swa"]), ("sliding_window", m["W"])):
        w.add_uint32(a + "attention." + key, v)
    w.add_array(a + "attention.sliding_window_pattern", [bool(s) for s in m["is_swa"]])
    w.add_uint32(a + "attention.shared_kv_layers", shared_kv_layers)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", 1e6)
    w.add_float32(a + "rope.freq_base_swa", 1e4)
    w.add_uint32(a + "rope.dimension_count", m["hd_full"])
    w.add_uint32(a + "rope.dimension_count_swa", m["hd_swa"])


def write(path: str, shape: str, n_layers: int | None = None, mix: str = "q4_k_m", seed: int = 0,
          progress=True, vocab: int = VOCAB) -> str:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    if mix not in ("q4_k_m", "q8_0"):
        raise ValueError(f"unknown mix {mix!r}; choose q4_k_m or q8_0")
    if vocab < 512:
        raise ValueError(f"vocab must be >= 512, got {vocab}")
    tensors, m = plan(shape, n_layers, mix, vocab)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "gemma4")
    a = "gemma4."
    w.add_string("general.name", f"synthetic Gemma 4 {shape} ({m['L']} layers, {mix}, random weights)")
    w.add_uint32("general.file_type", 15 if mix == "q4_k_m" else 7)
    w.add_uint32(a + "context_length", 262144 if shape in ("31B", "26B-A4B") else 131072)
    w.add_uint32(a + "embedding_length", m["D"])
    w.add_uint32(a + "block_count", m["L"])
    if len(set(m["ffs"])) == 1:
        w.add_uint32(a + "feed_forward_length", m["ffs"][0])
    else:
        w.add_array(a + "feed_forward_length", m["ffs"])
    _add_attention_keys(w, a, m, m["shared"])
    w.add_uint32(a + "embedding_length_per_layer_input", m["ple"])
    w.add_float32(a + "final_logit_softcapping", 30.0)
    if m["n_expert"]:
        w.add_uint32(a + "expert_count", m["n_expert"])
        w.add_uint32(a + "expert_used_count", m["n_expert_used"])
        w.add_uint32(a + "expert_feed_forward_length", m["ff_exp"])
    _add_vocab(w, vocab)
    _write_tensors(w, tensors, rng, progress)
    return path


def assistant_plan(shape: str, mix: str = "q4_k_m", vocab: int = VOCAB):
    """[(name, type, n_in, n_out or None)], metadata dict of the synthetic assistant for `shape`."""
    if shape not in ASSISTANT_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(ASSISTANT_SHAPES)}")
    if mix not in ("q4_k_m", "q8_0"):
        raise ValueError(f"unknown mix {mix!r}; choose q4_k_m or q8_0")
    t, a = SHAPES[shape], ASSISTANT_SHAPES[shape]
    L, D, Hq, F, Dt = ASSISTANT_LAYERS, a["D"], a["Hq"], a["ff"], t["D"]
    is_swa = [True] * (L - 1) + [False]
    q = "Q8_0" if mix == "q8_0" else "Q4_K"
    head = "Q8_0" if mix == "q8_0" else "Q6_K"
    tensors = [("token_embd.weight", head, D, vocab), ("output_norm.weight", "F32", D, None),
               ("rope_freqs.weight", "F32", t["hd_full"] // 2, None),
               ("nextn.pre_projection.weight", q, 2 * Dt, D), ("nextn.post_projection.weight", q, D, Dt)]
    for il in range(L):
        hd = t["hd_swa"] if is_swa[il] else t["hd_full"]
        p = f"blk.{il}."
        tensors += [(p + "attn_norm.weight", "F32", D, None), (p + "attn_q.weight", q, D, Hq * hd),
                    (p + "attn_q_norm.weight", "F32", hd, None), (p + "attn_output.weight", q, Hq * hd, D),
                    (p + "post_attention_norm.weight", "F32", D, None), (p + "ffn_norm.weight", "F32", D, None),
                    (p + "ffn_gate.weight", q, D, F), (p + "ffn_up.weight", q, D, F), (p + "ffn_down.weight", q, F, D),
                    (p + "post_ffw_norm.weight", "F32", D, None), (p + "layer_output_scale.weight", "F32", 1, None)]
    meta = dict(L=L, D=D, Hq=Hq, ff=F, Dt=Dt, is_swa=is_swa, kv_swa=t["kv_swa"], kv_full=t["kv_full"],
                hd_swa=t["hd_swa"], hd_full=t["hd_full"], W=t["W"],
                n_ctx=262144 if shape in ("31B", "26B-A4B") else 131072)
    return _k_fallback(tensors), meta


def write_assistant(path: str, shape: str = "31B", mix: str = "q4_k_m", seed: int = 0, vocab: int = VOCAB,
                    progress=True) -> str:
    """Write a synthetic Gemma 4 MTP assistant (`gemma4-assistant`, the upstream llama.cpp schema,
    spec 3.4a) of `shape`'s drafter (spec 1.2): 4 Q-only layers [s s s F] of width D_a with the
    target's kv-head counts and head dims, `embedding_length_out` = the target width,
    `nextn_predict_layers` = `shared_kv_layers` = 4, `rope_freqs.weight`, per-layer
    `layer_output_scale`, `nextn.pre_projection` {2 D_t, D_a} and `nextn.post_projection` {D_a, D_t};
    no K/V tensors, no final softcap key, and the same placeholder vocabulary as `write` (pass the
    target's `vocab`). The head is dense (`token_embd`, tied): E2B/E4B's centroid head is not
    written, as llama.cpp's converter drops it too.

    Types: mix "q4_k_m" = every matrix Q4_K and the token embedding (the assistant's LM head,
    its largest matrix) Q6_K, like the target's token embedding; "q8_0" = every matrix Q8_0.
    Norms, scales and rope_freqs are F32. Loads with
    `gemma4cpu.assistant.Assistant(path, gemma4cpu.model.Model(target))` for a synthetic target
    of the same shape and vocab."""
    if vocab < 512:
        raise ValueError(f"vocab must be >= 512, got {vocab}")
    tensors, m = assistant_plan(shape, mix, vocab)
    rng = np.random.default_rng(seed)
    arch = "gemma4-assistant"
    a = arch + "."
    w = gguf.GGUFWriter(path, arch)
    w.add_string("general.name", f"synthetic Gemma 4 {shape} MTP assistant ({mix}, random weights)")
    w.add_uint32("general.file_type", 15 if mix == "q4_k_m" else 7)
    w.add_uint32(a + "context_length", m["n_ctx"])
    w.add_uint32(a + "embedding_length", m["D"])
    w.add_uint32(a + "block_count", m["L"])
    w.add_uint32(a + "feed_forward_length", m["ff"])
    _add_attention_keys(w, a, m, m["L"])
    w.add_uint32(a + "embedding_length_per_layer_input", 0)
    w.add_uint32(a + "embedding_length_out", m["Dt"])
    w.add_uint32(a + "nextn_predict_layers", m["L"])
    _add_vocab(w, vocab)
    _write_tensors(w, tensors, rng, progress)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gemma4cpu.synth_model", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="31B")
    ap.add_argument("--layers", type=int, default=None, help="number of layers (default: the real count)")
    ap.add_argument("--assistant", action="store_true",
                    help="write the shape's MTP assistant (gemma4-assistant, 4 layers) instead of a target")
    ap.add_argument("--mix", choices=["q4_k_m", "q8_0"], default="q4_k_m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary size (default: Gemma's 262144)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.assistant:
        if a.layers is not None:
            ap.error("--layers is for targets (an assistant always has 4 layers)")
        write_assistant(a.output, a.shape, a.mix, a.seed, vocab=a.vocab)
    else:
        write(a.output, a.shape, a.layers, a.mix, a.seed, vocab=a.vocab)
    print(a.output)


if __name__ == "__main__":
    main()
