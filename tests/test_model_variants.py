"""Every Gemma 4 variant's forward runs on synthetic files with the real shapes (few layers,
small vocabulary): MoE (26B-A4B), per-layer embeddings + KV sharing + double-wide MLP (E2B),
dense K=V (31B). Correctness against HF lives in tests/test_ref_model_hf.py; here: the code
paths run, stay finite, and are batch-invariant bit for bit (the property speculative decoding
needs)."""
import numpy as np
import pytest

from gemma4cpu.model import Model
from gemma4cpu.synth_model import write


@pytest.fixture(scope="module", params=[("26B-A4B", 2), ("E2B", 6), ("31B", 2)])
def model(request, tmp_path_factory):
    shape, layers = request.param
    p = write(str(tmp_path_factory.mktemp("s") / f"{shape}.gguf"), shape, n_layers=layers, vocab=512,
              progress=False)
    return Model(p, n_ctx=16, threads=2)


def test_variant_runs_and_is_batch_invariant(model):
    cfg = model.cfg
    if cfg.n_embd_per_layer:
        assert cfg.kv_source[-1] < cfg.n_layer_kv and cfg.n_layer_kv < cfg.n_layer  # shared layers exist
    ids = [2, 7, 300, 11, 511]
    model.cache.truncate(0)
    lg, h = model.forward(ids, "all")
    assert lg.shape == (5, 512) and np.isfinite(lg).all()
    assert np.abs(lg).max() <= cfg.final_softcap  # softcap 30 applied
    model.cache.truncate(0)
    parts = [model.forward(ids[:2], "all")[1]] + [model.forward([t], "all")[1] for t in ids[2:]]
    np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), h.view(np.uint32))
