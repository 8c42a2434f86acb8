"""Bad model files are refused by Model() with an error that names what is wrong.

A valid tiny Gemma 4 file (gemma4cpu.convert of a tiny random HF model) is rewritten with one
defect each: a tensor missing, a tensor of the wrong shape, a foreign architecture, a required key
missing, the file cut short. Every one must raise GGUFFormatError naming the tensor or key (never
an IndexError, a crash or a model that runs on garbage)."""
import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from gemma4cpu.convert import convert  # noqa: E402
from gemma4cpu.gguf_io import GGUFFormatError  # noqa: E402
from gemma4cpu.model import Model  # noqa: E402
from gemma4cpu.ref import hf_tiny  # noqa: E402


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    hf_tiny.build("dense", d / "hf", seed=0)
    return convert(d / "hf", d / "good.gguf", "q8_0", quiet=True)


def rewrite(src, dst, drop_tensor=None, reshape=None, arch=None, drop_key=None):
    """Copy a GGUF file key by key and tensor by tensor with one defect."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), arch or r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_key:
            continue
        sub = f.types[1] if len(f.types) > 1 else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name == drop_tensor:
            continue
        data = np.asarray(t.data)  # quantised: (rows, row bytes) uint8; float: (rows, cols)
        if t.name == reshape:
            data = data[:-1]  # one row fewer
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_the_good_file_loads(good, tmp_path):
    copy = rewrite(good, tmp_path / "copy.gguf")  # the rewriter itself changes nothing
    a = Model(good, n_ctx=8, threads=1).forward([1, 2, 3])[0]
    b = Model(copy, n_ctx=8, threads=1).forward([1, 2, 3])[0]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("change,match", [
    ({"drop_tensor": "blk.3.ffn_up.weight"}, r"blk\.3\.ffn_up\.weight"),        # missing tensor
    ({"reshape": "blk.1.attn_q.weight"}, r"blk\.1\.attn_q\.weight.*shape"),     # wrong shape
    ({"arch": "llama"}, "llama"),                                                # wrong architecture
    ({"drop_key": "gemma4.embedding_length"}, r"gemma4\.embedding_length"),       # missing key
], ids=["missing_tensor", "wrong_shape", "wrong_architecture", "missing_key"])
def test_bad_file_names_the_problem(good, tmp_path, change, match):
    p = rewrite(good, tmp_path / "bad.gguf", **change)
    with pytest.raises(GGUFFormatError, match=match):
        Model(p, n_ctx=8, threads=1)


def test_truncated_file(good, tmp_path):
    data = open(good, "rb").read()
    p = tmp_path / "t.gguf"
    p.write_bytes(data[: len(data) - 1000])
    with pytest.raises(GGUFFormatError):
        Model(p, n_ctx=8, threads=1)


def test_bad_arguments(good):
    with pytest.raises(ValueError, match="cache type"):
        Model(good, n_ctx=8, threads=1, cache_type_k="q5_9")
    with pytest.raises(ValueError, match="n_ctx"):
        Model(good, n_ctx=0, threads=1)
    m = Model(good, n_ctx=8, threads=1)
    with pytest.raises(ValueError, match="logits_for"):
        m.forward([1], logits_for="first")
    with pytest.raises(ValueError, match="integers"):
        m.forward([1.5])
    assert m.cache.n == 0  # nothing was appended by the refused calls


def test_load_progress(good, capsys, monkeypatch):
    """A quick load prints nothing; one slower than the threshold reports its stage and a summary."""
    from gemma4cpu import model as model_mod

    Model(good, n_ctx=8, threads=1)
    assert capsys.readouterr().err == ""
    real = model_mod.load_weights

    def slow(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(model_mod, "load_weights", slow)
    monkeypatch.setattr(model_mod._LoadProgress.__init__, "__defaults__", (0.05,))
    Model(good, n_ctx=8, threads=1)
    err = capsys.readouterr().err
    assert "mapping the weights of 7 layers" in err and "loaded" in err and "KV cache" in err


def test_default_pool_is_pinned_to_allowed_cpus(good):
    """Without a CPU list, workers are pinned one per allowed CPU (an unpinned spinning worker
    beside the caller costs ~10x per small product); a later model still sees every allowed CPU
    although the first pool pinned the calling thread."""
    import os

    from gemma4cpu import model as model_mod

    allowed = model_mod._ALLOWED_CPUS
    assert allowed == sorted(allowed) and set(allowed) <= set(range(os.cpu_count() or 1))
    n = min(2, len(allowed))
    for _ in range(2):
        m = Model(good, n_ctx=8, threads=n)
        m.forward([1])
        assert [cpu for _, cpu, _ in m.pool.pin_plan()] == allowed[:n]
    with pytest.raises(ValueError, match="one CPU per thread"):
        Model(good, n_ctx=8, threads=2, cpus=[0])
    with pytest.raises(ValueError, match="threads must be"):
        Model(good, n_ctx=8, threads=0)
