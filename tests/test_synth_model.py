"""Synthetic full-size-shape GGUF files load through the real loader with the real shapes."""
import gguf
import numpy as np
import pytest

from gemma4cpu import kernels as K
from gemma4cpu.config import ModelConfig
from gemma4cpu.gguf_io import GGUFFile
from gemma4cpu.synth_model import SHAPES, write
from gemma4cpu.weights import load_weights


@pytest.mark.parametrize("mix", ["q4_k_m", "q8_0"])
def test_synthetic_31B_shapes(tmp_path, mix):
    p = write(str(tmp_path / "s.gguf"), "31B", n_layers=2, mix=mix, vocab=1024, progress=False)
    f = GGUFFile(p)
    cfg = ModelConfig.from_gguf(f)
    s = SHAPES["31B"]
    assert cfg.n_layer == 2 and cfg.n_embd == s["D"] and cfg.n_vocab == 1024
    assert cfg.is_swa == [True, False]  # the last layer is always full
    assert cfg.head_dim == [256, 512] and cfg.n_head_kv == [16, 4]
    w = load_weights(f, cfg)
    assert w.layers[1].attn_v is None and w.layers[0].attn_v is not None  # K=V on the full layer
    assert w.layers[0].attn_q.n_out == 32 * 256 and w.layers[1].attn_q.n_out == 32 * 512
    assert w.layers[0].ffn_down.n_in == 21504
    types = {m.type_name for lw in w.layers for m in (lw.attn_q, lw.ffn_down)}
    assert types == ({"Q4_K", "Q6_K"} if mix == "q4_k_m" else {"Q8_0"})
    # valid blocks: finite dequantised values
    m = w.layers[1].attn_q
    assert np.isfinite(K.dequantize(m.type_id, np.ascontiguousarray(m.rows[:4]), m.n_in)).all()
    # partial rope factors: 25% of the pairs rotate
    ff = w.layers[1].rope_freq_factors
    assert ff.size == 256 and (ff == 1.0).sum() == 64
    # gguf's own reader agrees on every tensor shape
    r = gguf.GGUFReader(p)
    assert {t.name: [int(d) for d in t.shape] for t in r.tensors} == {n: list(t.dims) for n, t in f.tensors.items()}


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown shape"):
        write("/tmp/x.gguf", "70B")
    with pytest.raises(ValueError, match="unknown mix"):
        write("/tmp/x.gguf", "31B", mix="q2_k")


# ---- the synthetic MTP assistant (write_assistant) ------------------------------------------

from gemma4cpu.assistant import Assistant, AssistantConfig, DrafterMismatchError  # noqa: E402
from gemma4cpu.synth_model import ASSISTANT_SHAPES, main as synth_main, write_assistant  # noqa: E402

# spec 3.4 "Concrete assistant shapes" (ggml order {n_in, n_out})
ASSISTANT_DIMS = {
    "31B": dict(pre=[10752, 1024], post=[1024, 5376], q=([1024, 8192], [1024, 16384]), ffn=[1024, 8192]),
    "26B-A4B": dict(pre=[5632, 1024], post=[1024, 2816], q=([1024, 4096], [1024, 8192]), ffn=[1024, 8192]),
    "E4B": dict(pre=[5120, 256], post=[256, 2560], q=([256, 1024], [256, 2048]), ffn=[256, 2048]),
    "E2B": dict(pre=[3072, 256], post=[256, 1536], q=([256, 1024], [256, 2048]), ffn=[256, 2048]),
}


@pytest.mark.parametrize("shape", list(ASSISTANT_SHAPES))
def test_synthetic_assistant_shapes(tmp_path, shape):
    p = write_assistant(str(tmp_path / "a.gguf"), shape, vocab=1024, progress=False)
    f = GGUFFile(p)
    assert f.arch == "gemma4-assistant"
    cfg = AssistantConfig.from_gguf(f)
    t, a = SHAPES[shape], ASSISTANT_SHAPES[shape]
    assert cfg.n_layer == 4 and cfg.is_swa == [True, True, True, False]
    assert cfg.n_embd == a["D"] and cfg.n_head == a["Hq"] and cfg.n_ff == [a["ff"]] * 4
    assert cfg.n_embd_backbone == t["D"] and cfg.n_vocab == 1024 and not cfg.use_ordered
    assert cfg.n_head_kv == [t["kv_swa"]] * 3 + [t["kv_full"]] and cfg.head_dim == [256, 256, 256, 512]
    assert cfg.sliding_window == t["W"]
    pre = "gemma4-assistant."
    assert f.get(pre + "nextn_predict_layers") == 4 and f.get(pre + "attention.shared_kv_layers") == 4
    assert f.get(pre + "final_logit_softcapping") is None
    d = ASSISTANT_DIMS[shape]
    dims = {n: list(x.dims) for n, x in f.tensors.items()}
    assert dims["nextn.pre_projection.weight"] == d["pre"] and dims["nextn.post_projection.weight"] == d["post"]
    assert dims["blk.0.attn_q.weight"] == d["q"][0] and dims["blk.3.attn_q.weight"] == d["q"][1]
    assert dims["blk.0.attn_output.weight"] == d["q"][0][::-1] and dims["blk.3.attn_output.weight"] == d["q"][1][::-1]
    assert dims["blk.2.ffn_gate.weight"] == d["ffn"] and dims["blk.2.ffn_down.weight"] == d["ffn"][::-1]
    assert dims["token_embd.weight"] == [a["D"], 1024] and dims["rope_freqs.weight"] == [256]
    assert not any(n.endswith(("attn_k.weight", "attn_v.weight")) for n in dims)
    assert "blk.3.layer_output_scale.weight" in dims and "output.weight" not in dims
    types = {n: x.type_name for n, x in f.tensors.items() if len(x.dims) == 2}
    assert types.pop("token_embd.weight") == "Q6_K" and set(types.values()) == {"Q4_K"}
    r = gguf.GGUFReader(p)   # gguf's own reader agrees
    assert {x.name: [int(v) for v in x.shape] for x in r.tensors} == dims


def test_synthetic_assistant_q8_0(tmp_path):
    f = GGUFFile(write_assistant(str(tmp_path / "a.gguf"), "E2B", mix="q8_0", vocab=1024, progress=False))
    assert {x.type_name for x in f.tensors.values() if len(x.dims) == 2} == {"Q8_0"}


@pytest.mark.parametrize("shape", ["E2B", "E4B", "31B"])
def test_synthetic_assistant_fits_its_target(tmp_path, shape):
    from gemma4cpu.model import Model

    tp = write(str(tmp_path / "t.gguf"), shape, n_layers=2, vocab=1024, progress=False)
    ap = write_assistant(str(tmp_path / "a.gguf"), shape, vocab=1024, progress=False)
    m = Model(tp, n_ctx=32, threads=1, progress=False)
    try:
        a = Assistant(ap, m)
        assert [lw.target_layer for lw in a.layers] == [0, 0, 0, 1]
        _, h = m.forward(np.arange(2, 10))
        d = a.draft(7, h[-1], m.cache.n, 2)
        assert len(d) == 2 and all(0 <= x < 1024 for x in d)
        logits, h_next = a.step(7, h[-1], m.cache.n)
        assert logits.shape == (1024,) and h_next.shape == (SHAPES[shape]["D"],) and np.isfinite(logits).all()
    finally:
        m.pool.close()


def test_synthetic_assistant_refused_by_other_targets(tmp_path):
    from gemma4cpu.model import Model

    tp = write(str(tmp_path / "t.gguf"), "E4B", n_layers=2, vocab=1024, progress=False)
    m = Model(tp, n_ctx=16, threads=1, progress=False)
    try:
        with pytest.raises(DrafterMismatchError, match="backbone width"):
            Assistant(write_assistant(str(tmp_path / "e2b.gguf"), "E2B", vocab=1024, progress=False), m)
        with pytest.raises(DrafterMismatchError, match="vocabulary"):
            Assistant(write_assistant(str(tmp_path / "v.gguf"), "E4B", vocab=2048, progress=False), m)
    finally:
        m.pool.close()


def test_synthetic_assistant_cli_and_errors(tmp_path, capsys):
    out = str(tmp_path / "a.gguf")
    synth_main(["--shape", "E2B", "--assistant", "--vocab", "600", "-o", out])
    assert capsys.readouterr().out.strip() == out
    assert AssistantConfig.from_gguf(GGUFFile(out)).n_vocab == 600
    with pytest.raises(SystemExit):
        synth_main(["--shape", "E2B", "--assistant", "--layers", "2", "-o", out])
    with pytest.raises(ValueError, match="unknown shape"):
        write_assistant(out, "70B")
    with pytest.raises(ValueError, match="unknown mix"):
        write_assistant(out, "E2B", mix="q2_k")
    with pytest.raises(ValueError, match="vocab"):
        write_assistant(out, "E2B", vocab=100)
