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
    """Cut anywhere (every byte of the header, metadata, tensor infos and data) -> the typed error,
    naming where (a byte offset or the tensor's byte range), from a file and from memory alike."""
    data, _ = C.small_model_bytes()
    for cut in range(0, len(data)):
        p = _write(tmp_path, data[:cut], "t.gguf")
        for load in (lambda: GGUFFile(p), lambda: GGUFFile.from_bytes(data[:cut])):
            with pytest.raises(GGUFFormatError, match=r"offset \d+|\[\d+, \d+\)|too small") as ei:
                load()
            assert type(ei.value) is GGUFFormatError
    GGUFFile.from_bytes(data)  # the whole file is fine: the check above is not vacuous


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


# --- gaps closed for issue 8: every malformed class names the field and its byte offset ----------------

def test_from_bytes_equals_file(tmp_path):
    data, offs = C.small_model_bytes()
    a, b = GGUFFile(_write(tmp_path, data)), GGUFFile.from_bytes(data)
    assert a.kv.keys() == b.kv.keys() and a.kv["tokenizer.ggml.tokens"] == b.kv["tokenizer.ggml.tokens"]
    assert {n: (t.offset, t.n_bytes, t.dims) for n, t in a.tensors.items()} == \
        {n: (t.offset, t.n_bytes, t.dims) for n, t in b.tensors.items()}
    np.testing.assert_array_equal(a.tensor("norm.weight").numpy(), b.tensor("norm.weight").numpy())
    assert not b.tensor("w.weight").raw().flags.writeable


def test_bad_utf8_everywhere(tmp_path):
    bad = b"x\xc0\x80y"                     # overlong NUL: invalid UTF-8
    with pytest.raises(GGUFFormatError, match=r"metadata 'k': invalid UTF-8 at offset \d+"):
        GGUFFile.from_bytes(C.build([C.kv("k", C.STR, bad)], [])[0])
    with pytest.raises(GGUFFormatError, match=r"metadata 'k'\[1\]: invalid UTF-8 at offset \d+"):
        GGUFFile.from_bytes(C.build([C.kv("k", C.ARR, ["ok", bad], C.STR)], [])[0])
    with pytest.raises(GGUFFormatError, match=r"tensor #0 name: invalid UTF-8 at offset \d+"):
        GGUFFile.from_bytes(C.build([], [(bad, (32,), 0, b"\0" * 128)])[0])
    data, _ = C.build([C.kv("k", C.STR, bad)], [])
    at = data.index(bad)
    with pytest.raises(GGUFFormatError, match=f"offset {at + 1}"):   # the offending byte itself
        GGUFFile.from_bytes(data)


def test_element_count_overflow():
    """dims whose product overflows int64 (and so ggml's ne products) are refused before any
    multiplication in fixed width; each dim alone is a valid u64."""
    with pytest.raises(GGUFFormatError, match=r"overflow int64 \(tensor info at offset \d+\)"):
        GGUFFile.from_bytes(C.build([], [("t", (1 << 40, 1 << 40), 0, b"\0" * 32)])[0])
    with pytest.raises(GGUFFormatError, match=r"overflow int64"):
        GGUFFile.from_bytes(C.build([], [("t", (1 << 63, 1), 0, b"\0" * 32)])[0])
    with pytest.raises(GGUFFormatError, match=r"more than the whole file"):  # fits int64, not the file
        GGUFFile.from_bytes(C.build([], [("t", (1 << 20, 1 << 20), 0, b"\0" * 32)])[0])


@pytest.mark.parametrize("kv,match", [
    (C.kv("general.alignment", C.BOOL, 1), "general.alignment=True"),
    (C.kv("general.alignment", C.STR, "32"), "general.alignment='32'"),
    (C.kv("general.alignment", C.U64, 1 << 40), "is not a power of two in 1..1048576"),
    (C.kv("general.alignment", C.U32, 0), "general.alignment=0"),
])
def test_hostile_alignment_key(kv, match):
    with pytest.raises(GGUFFormatError, match=match):
        GGUFFile.from_bytes(C.build([kv], [])[0])


def test_other_alignment_is_honoured():
    data, offs = C.build([C.kv("general.alignment", C.U32, 64)], [("a", (8,), 0, b"\1" * 32),
                                                                   ("b", (8,), 0, b"\2" * 32)], alignment=64)
    f = GGUFFile.from_bytes(data)
    assert f.alignment == 64 and f.tensor("b").offset == offs["b"] and offs["b"] % 64 == 0
    assert bytes(f.tensor("b").raw()) == b"\2" * 32
    # the same file read with the default 32: b's relative offset 64 is fine, but a 32-aligned offset
    # in a 64-aligned file is not
    i = data.index(C.s("b")) + len(C.s("b")) + 4 + 8 + 4
    bad = data[:i] + struct.pack("<Q", 32) + data[i + 8:]
    with pytest.raises(GGUFFormatError, match=r"data offset 32 \(field at offset \d+\) is not 64-byte aligned"):
        GGUFFile.from_bytes(bad)


def test_offsets_past_the_end_and_overlaps_name_byte_ranges():
    data, _ = C.build([], [("a", (32,), 0, b"\1" * 128), ("b", (32,), 0, b"\2" * 128)])
    i = data.index(C.s("b")) + len(C.s("b")) + 4 + 8 + 4
    for off, match in [(1 << 63, r"'b': data \[\d+, \d+\) runs past the end"),
                       (2 ** 64 - 32, r"runs past the end"),
                       (96, r"tensors 'a' and 'b' overlap \(\[\d+, \d+\) and \[\d+, \d+\)\)")]:
        with pytest.raises(GGUFFormatError, match=match):
            GGUFFile.from_bytes(data[:i] + struct.pack("<Q", off) + data[i + 8:])


def test_views_never_leave_the_buffer():
    """Whatever the file, a tensor view is exactly its claimed bytes inside the image: checked on
    every structured mutation of a small file (the property the C kernels rely on)."""
    import random
    from gemma4cpu import fuzz
    data, _ = C.small_model_bytes()
    rng, ok = random.Random(0), 0
    for _ in range(400):
        m = fuzz.mutate(data, rng)
        try:
            f = GGUFFile.from_bytes(m)
        except GGUFFormatError:
            continue
        ok += 1
        for t in f.tensors.values():
            assert 0 <= t.offset and t.offset + t.n_bytes <= len(m) and t.raw().size == t.n_bytes
    assert ok > 20     # enough mutants parse for the property to mean something


# --- every class names its field and the exact byte offset (header = 24 bytes, first entry at 24) ---

def _hdr(n_tensors, n_kv):
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _info(name, dims, ttype, off):
    return C.s(name) + struct.pack("<I", len(dims)) + struct.pack("<" + "Q" * len(dims), *dims) + \
        struct.pack("<IQ", ttype, off)


_PAD = b"\0" * 256
_T1 = _info("t", (32,), 0, 0)                    # 't' info at 24: n_dims 33, dims 37, type 45, offset 49


@pytest.mark.parametrize("data,message", [
    (b"GGUX" + _PAD, r"not a GGUF file \(magic b'GGUX' at offset 0"),
    (b"GGUF" + struct.pack("<I", 7) + _PAD, r"unsupported GGUF version 7 at offset 4"),
    (_hdr(0, 1 << 50) + _PAD, r"counts at offset 8"),
    (_hdr(0, 1) + struct.pack("<Q", 1 << 62) + _PAD, r"metadata key #0: string length \d+ at offset 24"),
    (_hdr(0, 1) + struct.pack("<Q", 40) + b"k" * 10, r"truncated file: metadata key #0 needs 40 bytes at offset 32"),
    (_hdr(0, 1) + C.s(b"ba\xffd") + _PAD, r"metadata key #0: invalid UTF-8 at offset 34"),
    (_hdr(0, 1) + C.s("k") + struct.pack("<I", 77) + _PAD, r"metadata 'k': unknown value type 77 at offset 33"),
    (_hdr(0, 1) + C.s("k") + struct.pack("<IB", C.BOOL, 2) + _PAD, r"metadata 'k': bool value 2 at offset 37"),
    (_hdr(0, 1) + C.s("k") + struct.pack("<IIQ", C.ARR, C.U32, 1 << 40) + _PAD,
     r"metadata 'k': array of \d+ elements at offset 37"),
    (_hdr(0, 1) + C.s("k") + struct.pack("<IIQ", C.ARR, 99, 1) + _PAD,
     r"metadata 'k': unsupported array element type 99 at offset 37"),
    (_hdr(0, 1) + C.s("k") + struct.pack("<IIQ", C.ARR, C.BOOL, 2) + b"\0\5" + _PAD,
     r"metadata 'k': bool array holds values other than 0/1 \(offset 37\)"),
    (_hdr(0, 2) + C.kv("a", C.U32, 1) + C.kv("a", C.U32, 2) + _PAD,
     r"duplicate metadata key 'a' at offset 41 \(first at offset 24\)"),
    (_hdr(0, 1) + C.kv("general.alignment", C.U32, 24) + _PAD, r"general.alignment=24 \(at offset 24\)"),
    (_hdr(2, 0) + _T1 + _T1 + _PAD, r"duplicate tensor 't' at offset 57"),
    (_hdr(1, 0) + C.s(b"t\xfe") + _PAD, r"tensor #0 name: invalid UTF-8 at offset 33"),
    (_hdr(1, 0) + C.s("t") + struct.pack("<I", 9) + _PAD, r"tensor 't': 9 dimensions \(1..4 allowed\) at offset 24"),
    (_hdr(1, 0) + _info("t", (32,), 99, 0) + _PAD, r"tensor 't': unknown ggml type 99 at offset 45"),
    (_hdr(1, 0) + _info("t", (32, 0), 0, 0) + _PAD, r"tensor 't': zero dimension in \[32, 0\] \(tensor info at offset 24\)"),
    (_hdr(1, 0) + _info("t", (33,), 8, 0) + _PAD, r"tensor 't': first dim 33 .* block size 32 \(tensor info at offset 24\)"),
    (_hdr(1, 0) + _info("t", (1 << 20, 1 << 20), 0, 0) + _PAD,
     r"tensor 't': .* more than the whole file \(\d+\) \(tensor info at offset 24\)"),
    (_hdr(1, 0) + _info("t", (1 << 62, 1 << 62), 0, 0) + _PAD, r"tensor 't': .* overflow int64 \(tensor info at offset 24\)"),
    (_hdr(1, 0) + _info("t", (32,), 0, 8) + _PAD, r"tensor 't': data offset 8 \(field at offset 49\) is not 32-byte aligned"),
    (_hdr(1, 0) + _info("t", (32,), 0, 64) + b"\0" * 100, r"tensor 't': data \[128, 256\) runs past the end of the file "
                                                          r"\(157 bytes\)"),
    (_hdr(1, 0) + _info("t", (32,), 0, 0)[:-3], r"truncated file: tensor 't' offset needs 8 bytes at offset 49, only 5 left"),
])
def test_every_class_names_the_field_and_its_offset(data, message, tmp_path):
    """The byte offset in each refusal is the offending field's own (computed by hand from the layout),
    so a message with a wrong or missing offset fails here, from memory and from a file alike."""
    for load in (lambda: GGUFFile.from_bytes(data), lambda: GGUFFile(_write(tmp_path, data))):
        with pytest.raises(GGUFFormatError, match=message) as ei:
            load()
        assert type(ei.value) is GGUFFormatError


def test_misaligned_tensor_data_is_copied_to_aligned_rows(tmp_path):
    """A file declaring general.alignment = 1 can put a Q8_0 tensor at an odd offset. The kernels
    read block scales as typed fields (UBSan flags a misaligned one, and so would a strict-
    alignment CPU), so rows() hands them an aligned copy with the same bytes; aligned data stays a
    view of the file."""
    rng = np.random.default_rng(0)
    q8 = rng.integers(0, 256, 2 * 34, dtype=np.uint8)
    for pad in range(4):   # some key length puts the data start off a multiple of 4
        data, offs = C.build([C.kv("general.architecture", C.STR, "gemma3" + "x" * pad),
                              C.kv("general.alignment", C.U32, 1)],
                             [("w.weight", (32, 2), 8, q8.tobytes())], alignment=1)
        if offs["w.weight"] % 4:
            break
    assert offs["w.weight"] % 4
    f = GGUFFile(_write(tmp_path, data))
    t = f.tensor("w.weight")
    assert t.offset == offs["w.weight"] and t.raw().ctypes.data % 4 != 0
    r = t.rows()
    assert r.ctypes.data % 4 == 0 and not r.flags.writeable
    np.testing.assert_array_equal(r.reshape(-1), q8)
    # an aligned tensor is still used in place
    data, _ = C.small_model_bytes()
    w = GGUFFile(_write(tmp_path, data, "a.gguf")).tensor("w.weight")
    assert np.shares_memory(w.rows(), w.raw())
