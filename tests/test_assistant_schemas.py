"""tests/assistant_schemas.py: a converted E-style assistant rewritten as ik's `gemma4_mtp` and as
`gemma4_assistant` opens with gemma4cpu.gguf_io and has the keys / tensors of spec 3.4."""
import numpy as np
import pytest

from assistant_schemas import rewrite_assistant, token_to_centroid
from gemma4cpu.convert import convert
from gemma4cpu.gguf_io import GGUFFile

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from gemma4cpu.ref import hf_tiny

SRC = "gemma4-assistant"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    torch.set_num_threads(2)
    d = tmp_path_factory.mktemp("schemas")
    hf = hf_tiny.build("assistant_e", d / "hf", seed=0)
    src = convert(d / "hf", d / "a.gguf", "q8_0", quiet=True)  # Q8_0 matrices, F32 1-D, I32 ordering
    return hf.masked_embedding.token_ordering.numpy(), src, d


@pytest.mark.parametrize("schema", ["gemma4_mtp", "gemma4_assistant"])
def test_rewritten_assistant(converted, schema):
    ordering, src_path, d = converted
    rewrite_assistant(src_path, d / f"{schema}.gguf", schema)
    src, dst = GGUFFile(src_path), GGUFFile(d / f"{schema}.gguf")
    assert dst.arch == schema
    p = schema + "."
    for k, v in src.kv.items():  # tokenizer / general.* unchanged (except the arch)
        if not k.startswith(SRC + ".") and k != "general.architecture":
            assert np.array_equal(dst.kv[k], v) if isinstance(v, np.ndarray) else dst.kv[k] == v, k
    src_arch = {k[len(SRC) + 1:]: v for k, v in src.kv.items() if k.startswith(SRC + ".")}
    dst_arch = {k[len(p):]: v for k, v in dst.kv.items() if k.startswith(p)}
    assert len(dst.kv) == len(dst_arch) + sum(not k.startswith(SRC + ".") for k in src.kv)
    want = dict(src_arch)
    renamed = {}
    if schema == "gemma4_mtp":
        renamed = {"backbone_embedding_length": want.pop("embedding_length_out"),
                   "centroid_count": want.pop("n_centroids")}
        del want["nextn_predict_layers"]
        hkv = dst_arch.pop("attention.head_count_kv")
        assert isinstance(hkv, np.ndarray) and hkv.dtype == np.int32 and hkv.tolist() == [1] * 4
        del want["attention.head_count_kv"]
    assert set(dst_arch) == set(want) | set(renamed)
    for k, v in {**want, **renamed}.items():
        assert np.array_equal(dst_arch[k], v) if isinstance(v, np.ndarray) else dst_arch[k] == v, k
    assert dst_arch["use_ordered_embeddings"] is True and dst_arch["centroid_top_k"] == 4

    names = {"nextn.pre_projection.weight": "mtp_pre_proj.weight",
             "nextn.post_projection.weight": "mtp_post_proj.weight",
             "masked_embd_centroids.weight": "mtp_centroids.weight",
             "masked_embd_ordering": "mtp_token_ordering.weight",
             "rope_freqs.weight": None} if schema == "gemma4_mtp" else {}
    assert set(dst.tensors) == {names.get(n, n) for n in src.tensors} - {None}
    for n, t in src.tensors.items():
        m = names.get(n, n)
        if m is None:
            continue
        u = dst.tensors[m]
        assert (u.type_id, u.dims) == (t.type_id, t.dims), n
        if m != "mtp_token_ordering.weight":
            assert np.array_equal(u.raw(), t.raw()), n
    assert src.tensors["masked_embd_centroids.weight"].type_name == "Q8_0"

    clusters = {frozenset(c) for c in ordering.reshape(32, 16).tolist()}
    if schema == "gemma4_mtp":  # the token -> centroid map rebuilds HF's clusters
        t2c = dst.tensors["mtp_token_ordering.weight"].numpy()
        assert dst.tensors["mtp_token_ordering.weight"].type_name == "I32"
        assert np.array_equal(t2c, token_to_centroid(ordering, 32))
        assert {frozenset(np.nonzero(t2c == c)[0].tolist()) for c in range(32)} == clusters
    else:
        assert np.array_equal(dst.tensors["masked_embd_ordering"].numpy(), ordering)


def test_rewrite_rejects_other_inputs(converted, tmp_path):
    with pytest.raises(ValueError, match="schema"):
        rewrite_assistant(converted[1], tmp_path / "x.gguf", "gemma4")
    rewrite_assistant(converted[1], tmp_path / "m.gguf", "gemma4_mtp")
    with pytest.raises(ValueError, match="is not gemma4-assistant"):
        rewrite_assistant(tmp_path / "m.gguf", tmp_path / "x.gguf", "gemma4_assistant")
