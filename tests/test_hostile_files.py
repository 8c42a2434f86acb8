"""Hostile but well-formed GGUF files: every value the engine reads from a file is checked before it
is used, and every refusal is a GGUFFormatError (TokenizerError is one) naming the key or tensor.

The files are gemma4cpu.fuzz's tiny complete models (a Gemma 3 with an SPM vocabulary, a Gemma 4
with BPE, a Gemma 4 with MoE, per-layer embeddings and a KV-shared layer), each first shown to load
and run, then rewritten with one defect through the fuzzer's own structure (fuzz.Doc)."""
import numpy as np
import pytest

from gemma4cpu import fuzz
from gemma4cpu.fuzz import ARR, BOOL, F32, I32, KV, STR, U32, U64
from gemma4cpu.gguf_io import GGUFFile, GGUFFormatError
from gemma4cpu.tokenizer import Tokenizer, TokenizerError


@pytest.fixture(scope="module")
def docs():
    return fuzz.seed_docs()


def _copy(d):
    return fuzz.Doc(d.version, [kv.copy() for kv in d.kvs], [fuzz.TI(t.name, list(t.dims), t.ttype, t.off)
                                                             for t in d.tensors], d.blob, d.alignment)


def _set(d, key, vtype, value):
    d = _copy(d)
    for kv in d.kvs:
        if kv.key == key.encode():
            kv.vtype, kv.value = vtype, value
            return d
    d.kvs.append(KV(key.encode(), vtype, value))
    return d


def _drop(d, key):
    d = _copy(d)
    d.kvs = [kv for kv in d.kvs if kv.key != key.encode()]
    return d


@pytest.mark.parametrize("name", ["gemma3_spm", "gemma4_bpe", "gemma4_moe_ple_shared"])
def test_seed_models_load_and_run(docs, name):
    """The unmodified seeds reach every stage, so each defect below is what stops a file."""
    assert fuzz.run_gguf(fuzz.serialize(docs[name])) == "parsed | tokenizer | template | weights | forward"


G4 = "gemma4_bpe"
CONFIG_CASES = [
    (G4, "gemma4.block_count", U64, 2**40, r"gemma4\.block_count = 1099511627776 is not a positive integer"),
    (G4, "gemma4.block_count", U32, 0, r"gemma4\.block_count = 0 is not a positive integer"),
    (G4, "gemma4.block_count", STR, b"2", r"gemma4\.block_count = '2' is not an integer"),
    (G4, "gemma4.embedding_length", F32, 64.0, r"gemma4\.embedding_length = 64\.0 is not an integer"),
    (G4, "gemma4.attention.head_count_kv", U32, 3, r"head_count 2 is not a multiple of head_count_kv \[3, 3\]"),
    (G4, "gemma4.attention.head_count_kv", ARR, (U32, [1, 1, 1]), r"head_count_kv has 3 entries for 2 layers"),
    (G4, "gemma4.attention.head_count_kv", ARR, (F32, [1.0, 1.0]), r"head_count_kv is a float32 array"),
    (G4, "gemma4.attention.key_length", U32, 48, r"head dim 48 is not a multiple of 32"),
    (G4, "gemma4.attention.key_length", U32, 2**20, r"key_length = 1048576 is not a positive integer"),
    (G4, "gemma4.rope.dimension_count", U32, 15, r"rotates 15 dims"),
    (G4, "gemma4.rope.dimension_count", U32, 4096, r"rope\.dimension_count = 4096 is not an integer in \[2, 32\]"),
    (G4, "gemma4.attention.layer_norm_rms_epsilon", F32, float("nan"), r"layer_norm_rms_epsilon = nan is outside"),
    (G4, "gemma4.rope.freq_base", F32, -1.0, r"rope\.freq_base = -1\.0 is outside"),
    (G4, "gemma4.final_logit_softcapping", F32, float("inf"), r"final_logit_softcapping = inf is outside"),
    (G4, "gemma4.attention.sliding_window", U64, 2**40, r"sliding_window = 1099511627776 is not a positive"),
    (G4, "gemma4.attention.sliding_window_pattern", ARR, (BOOL, [1]), r"sliding_window_pattern must be a bool array"),
    (G4, "gemma4.attention.shared_kv_layers", U32, 2, r"shared_kv_layers = 2 is not an integer in \[0, 1\]"),
    (G4, "gemma4.expert_used_count", U32, 9, r"expert_used_count = 9 is not an integer in \[0, 0\]"),
    (G4, "gemma4.context_length", I32, -5, r"context_length = -5 is not a positive integer"),
    (G4, "tokenizer.ggml.eos_token_id", STR, b"x", r"eos_token_id = 'x' is not an integer"),
    ("gemma3_spm", "gemma3.attention.scale", F32, 0.0, r"attention\.scale = 0\.0 is outside"),
    (G4, "general.architecture", STR, b"gemma4-assistant", r"MTP assistant"),
    (G4, "general.architecture", STR, b"llama", r"architecture 'llama' is not supported"),
    (G4, "general.architecture", U32, 7, r"general\.architecture is missing"),
]


@pytest.mark.parametrize("seed,key,vtype,value,match", CONFIG_CASES,
                         ids=[f"{c[1]}={c[3]!r}"[:60] for c in CONFIG_CASES])
def test_hostile_metadata_values(docs, seed, key, vtype, value, match):
    from gemma4cpu.config import ModelConfig
    f = GGUFFile.from_bytes(fuzz.serialize(_set(docs[seed], key, vtype, value)))
    with pytest.raises(GGUFFormatError, match=match):
        ModelConfig.from_gguf(f)


def test_missing_required_key(docs):
    from gemma4cpu.config import ModelConfig
    f = GGUFFile.from_bytes(fuzz.serialize(_drop(docs[G4], "gemma4.attention.head_count")))
    with pytest.raises(GGUFFormatError, match=r"'gemma4\.attention\.head_count' is missing"):
        ModelConfig.from_gguf(f)


TOKENIZER_CASES = [
    ("tokenizer.ggml.model", U32, 1, "tokenizer.ggml.model must be a string"),
    ("tokenizer.ggml.token_type", ARR, (STR, [b"1"] * 280), "token_type must be a numeric array"),
    ("tokenizer.ggml.scores", ARR, (STR, [b"x"]), "scores must be a numeric array"),
    ("tokenizer.ggml.bos_token_id", U32, 10**6, "bos_token_id = 1000000 is outside"),
    ("tokenizer.ggml.bos_token_id", F32, 2.0, "bos_token_id must be an integer token id"),
    ("tokenizer.ggml.add_bos_token", U32, 7, "add_bos_token must be a bool"),
    ("tokenizer.ggml.pre", ARR, (U32, [1]), "tokenizer.ggml.pre must be a string"),
    ("tokenizer.ggml.merges", ARR, (U32, [1, 2]), "needs tokenizer.ggml.merges"),
    ("tokenizer.ggml.tokens", ARR, (U32, [1, 2]), "tokens is missing or empty"),
]


@pytest.mark.parametrize("key,vtype,value,match", TOKENIZER_CASES, ids=[c[0] + "-" + c[3][:20] for c in TOKENIZER_CASES])
def test_hostile_vocabularies(docs, key, vtype, value, match):
    f = GGUFFile.from_bytes(fuzz.serialize(_set(docs[G4], key, vtype, value)))
    with pytest.raises(TokenizerError, match=match):
        Tokenizer(f.kv)
    assert issubclass(TokenizerError, GGUFFormatError)


def test_byte_token_with_bad_text_prints_as_text(docs):
    """Found by the fuzzer: a token typed BYTE whose text is not <0xHH> used to raise ValueError from
    int(..., 16) in decode. It now prints as its text."""
    d = _copy(docs[G4])
    kv = next(k for k in d.kvs if k.key == b"tokenizer.ggml.tokens")
    items = list(kv.value[1])
    i = items.index(b"<0x41>")
    items[i] = b"<0xA\x07>"
    kv.value = (STR, items)
    tok = Tokenizer(GGUFFile.from_bytes(fuzz.serialize(d)).kv)
    assert tok.decode([i]) == "<0xA\x07>"
    assert tok.decode([items.index(b"<0x42>")]) == "B"


def test_tensor_shapes_against_config(docs):
    """A tensor whose shape disagrees with the configuration is refused naming it, before any kernel
    sees it; so is a type the kernels do not compute with."""
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.weights import load_weights
    d = _copy(docs[G4])
    t = next(t for t in d.tensors if t.name == b"blk.1.attn_q.weight")
    t.dims = [64, 32]                       # half the rows: still inside the file, wrong shape
    f = GGUFFile.from_bytes(fuzz.serialize(d))
    with pytest.raises(GGUFFormatError, match=r"blk\.1\.attn_q\.weight.*shape \[64, 32\], expected \[64, 64\]"):
        load_weights(f, ModelConfig.from_gguf(f))
    d = _copy(docs[G4])
    t = next(t for t in d.tensors if t.name == b"blk.0.ffn_up.weight")
    t.ttype = 20                            # IQ4_NL: same block size and bytes as Q4_0, no kernel
    f = GGUFFile.from_bytes(fuzz.serialize(d))
    with pytest.raises(GGUFFormatError, match=r"blk\.0\.ffn_up\.weight.*IQ4_NL, which gemma4cpu cannot compute"):
        load_weights(f, ModelConfig.from_gguf(f))


def test_vocabulary_size_must_match_embedding(docs, tmp_path):
    from gemma4cpu.engine import Engine
    d = _copy(docs[G4])
    for kv in d.kvs:
        if kv.key in (b"tokenizer.ggml.tokens", b"tokenizer.ggml.scores", b"tokenizer.ggml.token_type"):
            et, items = kv.value
            kv.value = (et, list(items)[:-1] if not isinstance(items, np.ndarray) else items[:-1])
    p = tmp_path / "m.gguf"
    p.write_bytes(fuzz.serialize(d))
    # n_vocab is the vocabulary's length, so the embedding is the tensor found wrong
    with pytest.raises(GGUFFormatError, match=r"'token_embd\.weight' has shape \[64, 280\], expected \[64, 279\]"):
        Engine(p, threads=1, n_ctx=16, progress=False)


def test_seed_model_generates_through_engine(docs, tmp_path):
    """The same tiny file runs end to end (the fuzzer's forward stage is the real path)."""
    from gemma4cpu.engine import Engine
    p = tmp_path / "m.gguf"
    p.write_bytes(fuzz.serialize(docs[G4]))
    eng = Engine(p, threads=1, n_ctx=32, progress=False)
    r = eng.generate("hello world", max_tokens=4)
    assert 1 <= r.stats.n_generated <= 4 and all(0 <= i < eng.n_vocab for i in r.tokens)


@pytest.mark.parametrize("key,vtype,value,match", [
    ("gemma4-assistant.block_count", STR, b"4", r"block_count = '4' is not an integer"),
    ("gemma4-assistant.attention.key_length_swa", U32, 0, r"key_length_swa = 0 is not a positive integer"),
    ("gemma4-assistant.n_centroids", STR, b"x", r"n_centroids = 'x' is not an integer"),
    ("gemma4-assistant.use_ordered_embeddings", U32, 5, r"use_ordered_embeddings = 5 is not a bool"),
    ("gemma4-assistant.attention.layer_norm_rms_epsilon", F32, -1.0, r"layer_norm_rms_epsilon = -1\.0 is outside"),
    ("gemma4-assistant.embedding_length_out", F32, 1.5, r"backbone width 1\.5 is not a positive integer"),
])
def test_hostile_assistant_metadata(key, vtype, value, match, tmp_path):
    """The drafter (-md) is a stranger's file too: its configuration goes through the same typed getters."""
    pytest.importorskip("gguf")
    from gemma4cpu import synth_model
    from gemma4cpu.assistant import AssistantConfig
    p = tmp_path / "a.gguf"
    synth_model.write_assistant(str(p), "E2B", mix="q8_0", vocab=512, progress=False)
    d, _ = fuzz.scan(p.read_bytes())
    AssistantConfig.from_gguf(GGUFFile.from_bytes(fuzz.serialize(d)))          # the file itself is fine
    f = GGUFFile.from_bytes(fuzz.serialize(_set(d, key, vtype, value)))
    with pytest.raises(GGUFFormatError, match=match):
        AssistantConfig.from_gguf(f)


def test_architecture_of_the_wrong_type(docs):
    """Fuzzer find (in the harness, by a file): general.architecture as an array must be refused by
    name, not compared element-wise."""
    for vtype, value in [(ARR, (STR, [b"gemma4", b"gemma4"])), (ARR, (U32, [])), (U32, 4)]:
        data = fuzz.serialize(_set(docs[G4], "general.architecture", vtype, value))
        assert "general.architecture is missing (not a string" in fuzz.run_gguf(data)


def test_malformed_assistant_file_is_refused_before_the_target_loads(tmp_path):
    """-md a truncated, a wrongly typed or a target-architecture file: GGUFFormatError naming the
    field (and the byte offset for a structural defect), raised while the assistant's header is read,
    before the target is opened (the target here is an empty file, which would be refused by name)."""
    pytest.importorskip("gguf")
    from gemma4cpu import synth_model
    from gemma4cpu.engine import Engine
    good = tmp_path / "a.gguf"
    synth_model.write_assistant(str(good), "E2B", mix="q8_0", vocab=512, progress=False)
    data = good.read_bytes()
    end = max(t.offset + t.n_bytes for t in GGUFFile(good).tensors.values())    # past it: alignment padding
    tgt = tmp_path / "target.gguf"
    tgt.write_bytes(b"")
    d, _ = fuzz.scan(data)
    cases = [(data[:10], "too small to be a GGUF file")]
    cases += [(data[:n], r"offset \d+|\[\d+, \d+\)") for n in (30, end // 50, end // 2, end - 1)]
    cases += [(fuzz.serialize(_set(d, "gemma4-assistant.block_count", STR, b"4")), r"block_count = '4' is not an int"),
              (fuzz.serialize(_set(d, "general.architecture", STR, b"gemma4")), r"is not a Gemma 4 MTP assistant")]
    for i, (bad, match) in enumerate(cases):
        p = tmp_path / f"bad{i}.gguf"
        p.write_bytes(bad)
        with pytest.raises(GGUFFormatError, match=match) as ei:
            Engine(tgt, draft=p, n_ctx=32, threads=1, progress=False)
        assert f"bad{i}.gguf" in str(ei.value) or "offset" in str(ei.value), ei.value
        assert "target.gguf" not in str(ei.value)
