"""The validating GGUF parser: real files read like gguf.GGUFReader; every class of malformed
file is refused with GGUFFormatError naming the problem, never a crash or a hang."""
import struct

import numpy as np
import pytest

import gguf_craft as C
from gemma4cpu.gguf_io import GGUFFile, GGUFFormatError


def _write(tmp_path, data, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_small_file_roundtrip(tmp_path):
    data, offs = C.small_model_bytes()
    f = GGUFFile(_write(tmp_path, data))
    assert f.arch == "gemma3" and f.kv["gemma3.block_count"] == 1
    assert f.kv["tokenizer.ggml.tokens"] == ["<pad>", "a", "b"]
    assert f.kv["gemma3.attention.sliding_window_pattern"].tolist() == [True, False]
    t = f.tensor("norm.weight")
    np.testing.assert_array_equal(t.numpy(), np.arange(64, dtype=np.float32))
    assert t.offset == offs["norm.weight"] and not t.raw().flags.writeable
    w = f.tensor("w.weight")
    assert (w.n_rows, w.n_cols, w.row_bytes) == (2, 32, 34) and w.rows().shape == (2, 34)


def test_matches_gguf_writer_output(tmp_path):
    import gguf
    p = tmp_path / "w.gguf"
    wr = gguf.GGUFWriter(str(p), "gemma4")
    wr.add_uint32("gemma4.block_count", 3)
    wr.add_array("gemma4.attention.head_count_kv", [1, 2, 3])
    a = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    wr.add_tensor("blk.0.attn_q.weight", a)
    wr.add_tensor("x", np.ones(16, np.float16))
    wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()
    f = GGUFFile(p)
    assert f.kv["gemma4.attention.head_count_kv"].tolist() == [1, 2, 3]
    t = f.tensor("blk.0.attn_q.weight")
    assert t.dims == (64, 5) and (t.n_rows, t.n_cols) == (5, 64)
    np.testing.assert_array_equal(t.numpy(), a)
    assert f.tensor("x").type_name == "F16"


def test_every_truncation_is_a_clean_error(tmp_path):
    data, _ = C.small_model_bytes()
    for cut in range(0, len(data) - 1, 7):
        p = _write(tmp_path, data[:cut], f"t{cut}.gguf")
        with pytest.raises(GGUFFormatError):
            GGUFFile(p)


@pytest.mark.parametrize("mutate,match", [
    (lambda d: b"GGUX" + d[4:], "not a GGUF file"),
    (lambda d: d[:4] + struct.pack("<I", 9) + d[8:], "unsupported GGUF version"),
    (lambda d: d[:8] + struct.pack("<Q", 1 << 60) + d[16:], "more than"),
    (lambda d: d[:16] + struct.pack("<Q", 1 << 60) + d[24:], "more than"),
])
def test_hostile_header_counts(tmp_path, mutate, match):
    data, _ = C.small_model_bytes()
    with pytest.raises(GGUFFormatError, match=match):
        GGUFFile(_write(tmp_path, mutate(data)))


def _one(tmp_path, kvs=None, tensors=None, **kw):
    kvs = kvs if kvs is not None else [C.kv("general.architecture", C.STR, "gemma3")]
    data, _ = C.build(kvs, tensors or [], **kw)
    return GGUFFile(_write(tmp_path, data))


def test_huge_string_length(tmp_path):
    bad = C.s("general.architecture")[:0] + struct.pack("<Q", 1 << 62) + b"x"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + bad
    with pytest.raises(GGUFFormatError, match="implausible|truncated"):
        GGUFFile(_write(tmp_path, data))


def test_huge_array_count(tmp_path):
    raw = C.s("k") + struct.pack("<IIQ", C.ARR, C.U32, 1 << 40)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + raw + b"\0" * 64
    with pytest.raises(GGUFFormatError, match="implausible|truncated"):
        GGUFFile(_write(tmp_path, data))


def test_bad_utf8_key(tmp_path):
    raw = C.s(b"bad\xff\xfekey") + struct.pack("<I", C.U32) + struct.pack("<I", 1)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + raw + b"\0" * 32
    with pytest.raises(GGUFFormatError, match="UTF-8"):
        GGUFFile(_write(tmp_path, data))


def test_unknown_value_type(tmp_path):
    raw = C.s("k") + struct.pack("<I", 77) + b"\0" * 16
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + raw + b"\0" * 32
    with pytest.raises(GGUFFormatError, match="unknown value type"):
        GGUFFile(_write(tmp_path, data))


def test_duplicate_key(tmp_path):
    with pytest.raises(GGUFFormatError, match="duplicate metadata key"):
        _one(tmp_path, [C.kv("a", C.U32, 1), C.kv("a", C.U32, 2)])


def test_duplicate_tensor(tmp_path):
    d = np.zeros(32, np.float32).tobytes()
    with pytest.raises(GGUFFormatError, match="duplicate tensor"):
        _one(tmp_path, tensors=[("t", (32,), 0, d), ("t", (32,), 0, d)])


def test_unknown_tensor_type(tmp_path):
    with pytest.raises(GGUFFormatError, match="unknown ggml type"):
        _one(tmp_path, tensors=[("t", (32,), 99, b"\0" * 128)])


def test_bad_dims(tmp_path):
    with pytest.raises(GGUFFormatError, match="zero dimension"):
        _one(tmp_path, tensors=[("t", (32, 0), 0, b"")])
    with pytest.raises(GGUFFormatError, match="block size"):
        _one(tmp_path, tensors=[("t", (33,), 8, b"\0" * 64)])
    with pytest.raises(GGUFFormatError, match="more than the whole file"):
        _one(tmp_path, tensors=[("t", (1 << 20, 1 << 20), 0, b"\0" * 32)])


def test_too_many_dims(tmp_path):
    raw = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + C.s("t") + struct.pack("<I", 9) + b"\0" * 200
    with pytest.raises(GGUFFormatError, match="dimensions"):
        GGUFFile(_write(tmp_path, raw))


def test_data_past_end_and_overlap(tmp_path):
    data, offs = C.build([C.kv("general.architecture", C.STR, "gemma3")],
                         [("a", (32,), 0, b"\1" * 128), ("b", (32,), 0, b"\2" * 128)])
    with pytest.raises(GGUFFormatError, match="runs past the end"):
        GGUFFile(_write(tmp_path, data[:-10], "short.gguf"))
    # point b's offset at a's data: overlap
    i = data.index(C.s("b")) + len(C.s("b")) + 4 + 8 + 4
    bad = data[:i] + struct.pack("<Q", 0) + data[i + 8:]
    with pytest.raises(GGUFFormatError, match="overlap"):
        GGUFFile(_write(tmp_path, bad, "ovl.gguf"))
    misaligned = data[:i] + struct.pack("<Q", 8) + data[i + 8:]
    with pytest.raises(GGUFFormatError, match="aligned"):
        GGUFFile(_write(tmp_path, misaligned, "mis.gguf"))


def test_bad_alignment_key(tmp_path):
    with pytest.raises(GGUFFormatError, match="power of two"):
        _one(tmp_path, [C.kv("general.alignment", C.U32, 24)])


def test_bad_bool(tmp_path):
    with pytest.raises(GGUFFormatError, match="bool"):
        _one(tmp_path, [C.kv("b", C.BOOL, 7)])


def test_missing_things_are_named(tmp_path):
    f = _one(tmp_path, [C.kv("general.name", C.STR, "x")])
    with pytest.raises(GGUFFormatError, match="general.architecture"):
        f.arch
    with pytest.raises(GGUFFormatError, match="'blk.0.attn_q.weight' is missing"):
        f.tensor("blk.0.attn_q.weight")
    with pytest.raises(GGUFFormatError, match="'gemma4.block_count' is missing"):
        f.require("gemma4.block_count")


def test_missing_file_and_tiny_file(tmp_path):
    with pytest.raises(GGUFFormatError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFFormatError, match="too small"):
        GGUFFile(_write(tmp_path, b"GGUF"))
