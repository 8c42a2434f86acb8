"""The C layer loop against the Python loop on a synthetic 31B-shaped file (2 layers: one sliding,
one full K=V layer of head dim 512, V norm, proportional partial RoPE; random valid Q4_K / Q6_K
blocks), without torch: this test also runs on the sanitizer build (tools/sanitize_tests.sh), so
csrc/g4_layers.c is exercised under AddressSanitizer + UBSan. tests/test_layer_loop.py holds the
HF-model cases."""
import numpy as np
import pytest

from gemma4cpu.model import Model
from gemma4cpu.synth_model import write


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = write(str(tmp_path_factory.mktemp("lls") / "31B-2.gguf"), "31B", n_layers=2, vocab=512, progress=False)
    return Model(p, n_ctx=32, threads=2, max_batch=4, max_draft=3, progress=False)


def _run(m: Model, c_loop: bool):
    m.layer_loop = c_loop
    m.cache.truncate(0)
    ids = [2, 7, 300, 11, 511, 5, 9, 40, 41, 3]
    out, i = [], 0
    for n in (3, 1, 4, 1):
        out.append(m.forward(ids[i:i + n], "all")[0])
        i += n
    m.cache.truncate(i - 2)
    out.append(m.forward(ids[i - 2:i], "all")[0])
    return out


def test_c_loop_equals_python_loop_on_31b_shapes(model):
    assert model._layer_loop() is not None
    assert model.cfg.n_layer == 2 and not model.cfg.is_swa[1] and model.w.layers[1].attn_v is None  # a K=V full layer
    py, c = _run(model, False), _run(model, True)
    for i, (a, b) in enumerate(zip(py, c)):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"call {i}")
    redo = np.concatenate([c[-3][-1:], c[-2]])  # the last two positions, first computed in two calls
    np.testing.assert_array_equal(c[-1].view(np.uint32), redo.view(np.uint32))  # rollback + redo
