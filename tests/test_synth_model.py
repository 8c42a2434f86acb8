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
