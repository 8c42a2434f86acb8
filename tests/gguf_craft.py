"""Build GGUF bytes by hand, so tests can write exactly the malformed file they need."""
import struct

import numpy as np

STR, ARR, U32, I32, F32, BOOL, U64 = 8, 9, 4, 5, 6, 7, 10


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value, etype=None):
    out = s(key) + struct.pack("<I", vtype)
    if vtype == STR:
        return out + s(value)
    if vtype == ARR:
        out += struct.pack("<IQ", etype, len(value))
        if etype == STR:
            return out + b"".join(s(v) for v in value)
        fmt = {U32: "I", I32: "i", F32: "f", BOOL: "B", U64: "Q"}[etype]
        return out + struct.pack("<" + fmt * len(value), *value)
    fmt = {U32: "I", I32: "i", F32: "f", BOOL: "B", U64: "Q"}[vtype]
    return out + struct.pack("<" + fmt, value)


def build(kvs, tensors, alignment=32, version=3, magic=b"GGUF", n_tensors=None, n_kv=None):
    """tensors: list of (name, dims, type_id, data bytes); offsets assigned aligned.
    Returns (file bytes, {name: absolute data offset})."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = b"".join(kvs)
    infos, off, blobs = b"", 0, []
    for name, dims, ttype, data in tensors:
        infos += s(name) + struct.pack("<I", len(dims)) + struct.pack("<" + "Q" * len(dims), *dims)
        infos += struct.pack("<IQ", ttype, off)
        blobs.append((off, data))
        off += -(-len(data) // alignment) * alignment
    pre = head + body + infos
    data_start = -(-len(pre) // alignment) * alignment
    out = bytearray(pre + b"\0" * (data_start - len(pre)))
    offsets = {}
    for (o, data), (name, *_rest) in zip(blobs, tensors):
        offsets[name] = data_start + o
        out += b"\0" * (data_start + o - len(out)) + data
    return bytes(out), offsets


def small_model_bytes():
    """A tiny valid file: a few keys and an F32 and a Q8_0 tensor."""
    f32 = np.arange(64, dtype=np.float32)
    q8 = np.zeros(2 * 34, np.uint8)
    return build(
        [kv("general.architecture", STR, "gemma3"), kv("gemma3.block_count", U32, 1),
         kv("tokenizer.ggml.tokens", ARR, ["<pad>", "a", "b"], STR),
         kv("gemma3.attention.sliding_window_pattern", ARR, [1, 0], BOOL)],
        [("norm.weight", (64,), 0, f32.tobytes()), ("w.weight", (32, 2), 8, q8.tobytes())])
