"""Fuzzing harness for everything that reads a stranger's model file: the GGUF parser, the model
configuration, the weight views and a forward pass over them, the tokenizer built from the
file's vocabulary, and the chat template the file carries (issue 8).

Two targets, each a function of one input (bytes) that returns an outcome label or raises:

* `run_gguf(data)`: the bytes are a GGUF image. Parse it, touch every tensor view, build the
  tokenizer and encode a few texts, render the chat template, build the config and weights and,
  when they are valid and small, run a 2-token forward pass through the C kernels.
* `run_tokenizer(data, toks)`: the first byte picks a vocabulary and flags, the rest is text.
  Checks ids are in range and that decode(encode(text)) gives the text back.

A refusal is fine when it is one of `EXPECTED` (GGUFFormatError, which TokenizerError is,
ChatTemplateError, InsufficientMemoryError); any other exception, a wrong id, a view of the wrong
size, is a bug and propagates. tools/fuzz_gguf.py runs these under atheris (coverage-guided) or
under the dependency-free `RandomFuzzer` below (used by the test suite and under the sanitizer
build), both with the structured mutator `mutate`: it parses the input into header, key/values,
tensor infos and data (`scan`), changes them the way a hostile file would (hostile counts,
lengths, offsets, types, dims, duplicate or missing entries, bad UTF-8, alignment, semantic
values of the keys the engine reads, hostile chat templates), writes the file back (`serialize`)
and sometimes lies in a count or length field of the result or flips raw bytes.
"""
from __future__ import annotations

import math
import os
import random
import re
import signal
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from gemma4cpu.chat import ChatTemplateError
from gemma4cpu.gguf_io import GGML_TYPES, GGUFFile, GGUFFormatError

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "B", U64: "Q", I64: "q",
        F64: "d"}
_FLOATS = (F32, F64)

INTS = [0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 127, 128, 255, 256, 257, 511, 512, 1023, 1024,
        4095, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**48, 2**53 + 1, 2**62, 2**63 - 1, 2**63,
        2**64 - 1, -1, -2, -(2**31), -(2**63)]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e-45, 1e30, 3.4e38, 1e308, float("inf"), float("-inf"),
          float("nan"), 2.0**-149, 65504.0]
BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\x80", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\xfe\xff"]

# keys the engine reads, with a plausible value type for each
_ARCH_KEYS = {
    "block_count": U32, "embedding_length": U32, "feed_forward_length": U32, "context_length": U32,
    "attention.head_count": U32, "attention.head_count_kv": U32, "attention.key_length": U32,
    "attention.key_length_swa": U32, "attention.value_length": U32, "attention.sliding_window": U32,
    "attention.sliding_window_pattern": ARR, "attention.layer_norm_rms_epsilon": F32, "rope.freq_base": F32,
    "rope.freq_base_swa": F32, "rope.dimension_count": U32, "rope.dimension_count_swa": U32,
    "final_logit_softcapping": F32, "attention.shared_kv_layers": U32, "expert_count": U32,
    "expert_used_count": U32, "expert_feed_forward_length": U32, "embedding_length_per_layer_input": U32,
    "attention.scale": F32,
}
KNOWN_KEYS = {f"{a}.{k}": t for a in ("gemma3", "gemma4") for k, t in _ARCH_KEYS.items()}
KNOWN_KEYS.update({
    "general.architecture": STR, "general.alignment": U32, "general.name": STR, "tokenizer.ggml.model": STR,
    "tokenizer.ggml.pre": STR, "tokenizer.ggml.tokens": ARR, "tokenizer.ggml.scores": ARR,
    "tokenizer.ggml.token_type": ARR, "tokenizer.ggml.merges": ARR, "tokenizer.ggml.bos_token_id": U32,
    "tokenizer.ggml.eos_token_id": U32, "tokenizer.ggml.eot_token_id": U32, "tokenizer.ggml.add_bos_token": BOOL,
    "tokenizer.ggml.add_eos_token": BOOL, "tokenizer.ggml.add_space_prefix": BOOL, "tokenizer.chat_template": STR,
})
ARCHS = [b"gemma4", b"gemma3", b"gemma4-assistant", b"gemma4_mtp", b"llama", b"", b"gemma4\x00"]
TOK_MODELS = [b"llama", b"gemma4", b"none", b"bpe", b""]

# chat templates a hostile file might carry (the sandbox must refuse or finish each within its limit)
HOSTILE_TEMPLATES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ self._TemplateReference__context.joiner.__init__.__globals__.os }}",
    "{{ messages.__class__.__base__ }}",
    "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{{ 'a' * 999999999 }}", "{{ 9 ** 999999 }}", "{{ range(999999999)|list }}",
    "{{ '%999999999s' % 'x' }}", "{{ 'x'|center(999999999) }}", "{{ '{:>999999999}'.format(1) }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ messages[0]['content'] }", "{% for %}", "{{ raise_exception('bad') }}", "{{ 1 / 0 }}",
    "{{ messages.append(1) }}", "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
]
TEXTS = ["Hello world", "", " ", "  leading and  double  spaces ", "\n\n\nnewlines\n", "<bos><eos><start_of_turn>",
         "<|turn>user\nhi<turn|>", "日本語のテキスト 🙂", "\u2581\u2581x", "a" * 300, "<0x41><0xZZ>", "\x00\x01\x7f"]


# ---- a lenient structural view of a GGUF image ---------------------------------------------------------

class KV:
    """One key/value: value is a number, bytes (a string) or (etype, items) for an array (items: a
    list of numbers or bytes, or a numpy array for a scalar array as read). The packed bytes are
    cached until a field is assigned."""
    __slots__ = ("key", "vtype", "value", "_raw")

    def __init__(self, key: bytes, vtype: int, value):
        object.__setattr__(self, "_raw", None)
        self.key, self.vtype, self.value = key, vtype, value

    def __setattr__(self, name, v):
        object.__setattr__(self, name, v)
        if name != "_raw":
            object.__setattr__(self, "_raw", None)

    def packed(self) -> bytes:
        if self._raw is None:
            object.__setattr__(self, "_raw", struct.pack("<Q", len(self.key)) + self.key
                               + struct.pack("<I", self.vtype % 2**32) + _pack_value(self.vtype, self.value))
        return self._raw

    def copy(self) -> "KV":
        c = KV(self.key, self.vtype, self.value)
        object.__setattr__(c, "_raw", self._raw)
        return c


@dataclass
class TI:
    name: bytes
    dims: list
    ttype: int
    off: int


@dataclass
class Doc:
    version: int = 3
    kvs: list = field(default_factory=list)
    tensors: list = field(default_factory=list)
    blob: bytes = b""
    alignment: int = 32     # padding used when writing (the file's general.alignment may say otherwise)
    magic: bytes = b"GGUF"
    n_kv: int | None = None        # a count that lies (None: the true count)
    n_tensors: int | None = None


def _pack_scalar(vtype: int, v) -> bytes:
    f = _FMT[vtype]
    if vtype in _FLOATS:
        x = float(v) if isinstance(v, (int, float)) and abs(v) < 1e300 or isinstance(v, float) else 0.0
        if vtype == F32:
            with np.errstate(over="ignore"):
                return struct.pack("<f", np.float32(x))
        return struct.pack("<d", x)
    n = struct.calcsize(f)
    u = int(v) % (1 << (8 * n)) if not isinstance(v, float) or math.isfinite(v) else 0
    return u.to_bytes(n, "little")


def _pack_value(vtype: int, v) -> bytes:
    if vtype in _FMT:
        return _pack_scalar(vtype, v if isinstance(v, (int, float)) else len(v) if isinstance(v, bytes) else 0)
    if vtype == STR:
        b = v if isinstance(v, bytes) else str(v).encode()
        return struct.pack("<Q", len(b)) + b
    if vtype == ARR:
        etype, items = v if isinstance(v, tuple) else (U32, [])
        out = struct.pack("<IQ", etype % 2**32, len(items))
        if isinstance(items, np.ndarray):
            if etype in _FMT and items.dtype == np.dtype("<" + _FMT[etype]):
                return out + items.tobytes()
            items = items.tolist()
        if etype == STR:
            return out + b"".join(struct.pack("<Q", len(x)) + x if isinstance(x, bytes) else _pack_value(STR, x)
                                  for x in items)
        if etype in _FMT:
            return out + b"".join(_pack_scalar(etype, x if isinstance(x, (int, float)) else 0) for x in items)
        return out                          # unknown element type: nothing the reader could decode
    return b""                              # unknown value type


def serialize(d: Doc) -> bytes:
    out = [d.magic, struct.pack("<I", d.version % 2**32),
           struct.pack("<QQ", (len(d.tensors) if d.n_tensors is None else d.n_tensors) % 2**64,
                       (len(d.kvs) if d.n_kv is None else d.n_kv) % 2**64)]
    for kv in d.kvs:
        out.append(kv.packed())
    for t in d.tensors:
        out += [struct.pack("<Q", len(t.name)), t.name, struct.pack("<I", len(t.dims) % 2**32)]
        out += [struct.pack("<Q", x % 2**64) for x in t.dims]
        out += [struct.pack("<IQ", t.ttype % 2**32, t.off % 2**64)]
    head = b"".join(out)
    a = d.alignment if d.alignment > 0 and d.alignment & (d.alignment - 1) == 0 and d.alignment <= 4096 else 32
    pad = -len(head) % a
    return head + b"\0" * pad + d.blob


class _Short(Exception):
    pass


def scan(data: bytes):
    """(Doc, fields) for an image whose structure can be walked (values are not checked), else
    (None, fields so far). fields: (offset, size, kind) of every count and length in the file."""
    fields = []
    pos = 0

    def take(n):
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise _Short
        b = data[pos:pos + n]
        pos += n
        return b

    def u(fmt, kind=None):
        n = struct.calcsize(fmt)
        if kind:
            fields.append((pos, n, kind))
        return struct.unpack("<" + fmt, take(n))[0]

    def string(kind):
        n = u("Q", kind)
        if n > len(data):
            raise _Short
        return take(n)

    def value(vtype):
        if vtype in _FMT:
            return u(_FMT[vtype])
        if vtype == STR:
            return string("strlen")
        if vtype == ARR:
            et = u("I", "etype")
            n = u("Q", "count")
            if n > len(data):
                raise _Short
            if et == STR:
                return (et, [string("strlen") for _ in range(n)])
            if et in _FMT:
                dt = np.dtype("<" + _FMT[et])
                return (et, np.frombuffer(take(n * dt.itemsize), dt))
            raise _Short
        raise _Short

    d = Doc()
    try:
        d.magic = take(4)
        d.version = u("I", "version")
        nt = u("Q", "n_tensors")
        nk = u("Q", "n_kv")
        if nt > len(data) or nk > len(data):
            raise _Short
        for _ in range(nk):
            key = string("strlen")
            vt = u("I", "vtype")
            d.kvs.append(KV(key, vt, value(vt)))
        for _ in range(nt):
            name = string("strlen")
            nd = u("I", "n_dims")
            if nd > 16:
                raise _Short
            dims = [u("Q", "dim") for _ in range(nd)]
            tt = u("I", "ttype")
            off = u("Q", "offset")
            d.tensors.append(TI(name, dims, tt, off))
    except (_Short, struct.error):
        return None, fields
    align = 32
    for kv in d.kvs:
        if kv.key == b"general.alignment" and isinstance(kv.value, int) and 0 < kv.value <= 4096 \
                and kv.value & (kv.value - 1) == 0:
            align = kv.value
    d.alignment = align
    start = pos + (-pos % align)
    d.blob = data[start:] if start <= len(data) else b""
    return d, fields


# ---- the structured mutator ----------------------------------------------------------------------------

def _hostile_int(rng: random.Random, cur=None) -> int:
    r = rng.random()
    if cur is not None and isinstance(cur, int) and r < 0.35:
        return rng.choice([cur + 1, cur - 1, cur * 2, cur // 2, cur + 32, cur * cur, -cur, cur + 2**32])
    if r < 0.85:
        return rng.choice(INTS)
    return rng.getrandbits(rng.choice([8, 16, 32, 64]))


def _hostile_float(rng):
    return rng.choice(FLOATS) if rng.random() < 0.8 else rng.uniform(-1e6, 1e6)


def _hostile_bytes(rng, cur: bytes = b"", others=()) -> bytes:
    r = rng.random()
    if r < 0.3 and cur:
        i = rng.randrange(len(cur) + 1)
        return cur[:i] + rng.choice(BAD_UTF8) + cur[i:]
    if r < 0.45 and others:
        return rng.choice(others)
    if r < 0.55:
        return b""
    if r < 0.65:
        return cur * rng.choice([2, 16, 257]) if cur else b"x" * 4096
    if r < 0.8 and cur:
        return cur[:rng.randrange(len(cur) + 1)]
    return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 12)))


def _value_for(vtype, rng, cur=None, key=b""):
    if vtype in _FLOATS:
        return _hostile_float(rng)
    if vtype == BOOL:
        return rng.choice([0, 1, 2, 255])
    if vtype in _FMT:
        return _hostile_int(rng, cur if isinstance(cur, int) else None)
    if vtype == STR:
        if key == b"general.architecture" and rng.random() < 0.7:
            return rng.choice(ARCHS)
        if key == b"tokenizer.ggml.model" and rng.random() < 0.7:
            return rng.choice(TOK_MODELS)
        if key == b"tokenizer.chat_template" and rng.random() < 0.8:
            return rng.choice(HOSTILE_TEMPLATES).encode()
        return _hostile_bytes(rng, cur if isinstance(cur, bytes) else b"")
    if vtype == ARR:
        if isinstance(cur, tuple):
            et, items = cur[0], list(cur[1].tolist() if isinstance(cur[1], np.ndarray) else cur[1])
        else:
            et, items = rng.choice([U32, I32, F32, BOOL, STR, U8]), []
        r = rng.random()
        if r < 0.25 and items:
            del items[rng.randrange(len(items)):]
        elif r < 0.4:
            items = items + items[:rng.randrange(1, 4)] if items else [0]
        elif r < 0.7 and items:
            i = rng.randrange(len(items))
            items[i] = _value_for(et if et != ARR else U32, rng, items[i])
        elif r < 0.8:
            items = []
        else:
            et = rng.choice([U8, I8, U32, I32, F32, BOOL, STR, U64, ARR, 13, 2**31])
            items = [_value_for(et, rng) if et in _FMT or et == STR else 0 for _ in range(rng.randrange(0, 8))]
        return (et, items)
    return 0


def _m_kv_value(d: Doc, rng):
    if d.kvs:
        kv = rng.choice(d.kvs)
        kv.value = _value_for(kv.vtype, rng, kv.value, kv.key)


def _m_kv_retype(d, rng):
    if d.kvs:
        kv = rng.choice(d.kvs)
        kv.vtype = rng.choice([U8, I8, U16, I32, U32, F32, BOOL, STR, ARR, U64, I64, F64, 13, 255])
        kv.value = _value_for(kv.vtype, rng, kv.value, kv.key)


def _m_kv_add(d, rng):
    key = rng.choice(list(KNOWN_KEYS))
    vt = KNOWN_KEYS[key] if rng.random() < 0.8 else rng.choice([U32, I64, F32, STR, BOOL, ARR])
    existing = [kv for kv in d.kvs if kv.key == key.encode()]
    cur = existing[0].value if existing else None
    if existing and rng.random() < 0.7:        # replace: semantic change of a key the engine reads
        existing[0].vtype, existing[0].value = vt, _value_for(vt, rng, cur, key.encode())
    else:
        d.kvs.insert(rng.randrange(len(d.kvs) + 1), KV(key.encode(), vt, _value_for(vt, rng, cur, key.encode())))


def _m_kv_dup_del(d, rng):
    if not d.kvs:
        return
    i = rng.randrange(len(d.kvs))
    if rng.random() < 0.5:
        kv = d.kvs[i]
        d.kvs.insert(rng.randrange(len(d.kvs) + 1), KV(kv.key, kv.vtype, kv.value))
    else:
        del d.kvs[i]


def _m_key_name(d, rng):
    if d.kvs:
        kv = rng.choice(d.kvs)
        kv.key = _hostile_bytes(rng, kv.key, [k.key for k in d.kvs] + [t.name for t in d.tensors])


def _m_alignment(d, rng):
    v = rng.choice([1, 2, 3, 8, 16, 24, 64, 4096, 2**20, 2**21, 2**31, 2**32, 0, 2**63])
    vt = rng.choice([U32, U32, U64, BOOL, STR, I32])
    for kv in d.kvs:
        if kv.key == b"general.alignment":
            kv.vtype, kv.value = vt, v if vt != STR else str(v).encode()
            break
    else:
        d.kvs.append(KV(b"general.alignment", vt, v if vt != STR else str(v).encode()))
    if rng.random() < 0.5 and isinstance(v, int) and 0 < v <= 4096 and v & (v - 1) == 0:
        d.alignment = v                         # the padding follows the claim (offsets may still not)


def _m_dims(d, rng):
    if not d.tensors:
        return
    t = rng.choice(d.tensors)
    r = rng.random()
    if r < 0.5 and t.dims:
        i = rng.randrange(len(t.dims))
        t.dims[i] = _hostile_int(rng, t.dims[i])
    elif r < 0.65:
        t.dims.append(rng.choice([1, 1, 2, 2**32, 0]))
    elif r < 0.8 and t.dims:
        t.dims.pop(rng.randrange(len(t.dims)))
    elif len(t.dims) >= 2:
        t.dims[0], t.dims[1] = t.dims[1], t.dims[0]


def _m_ttype(d, rng):
    if d.tensors:
        t = rng.choice(d.tensors)
        t.ttype = rng.choice(list(GGML_TYPES) + [4, 5, 31, 36, 40, 99, 2**31, 2**32 - 1]) if rng.random() < 0.9 \
            else rng.getrandbits(32)


def _m_offset(d, rng):
    if not d.tensors:
        return
    t = rng.choice(d.tensors)
    o = rng.choice(d.tensors)
    t.off = rng.choice([o.off, o.off + 32, t.off + 1, t.off + 16, t.off - 32, len(d.blob), len(d.blob) - 32,
                        _hostile_int(rng), 0])


def _m_tensor_name(d, rng):
    if d.tensors:
        t = rng.choice(d.tensors)
        t.name = _hostile_bytes(rng, t.name, [x.name for x in d.tensors] + [b"output.weight", b"rope_freqs.weight",
                                                                           b"blk.0.attn_v.weight"])


def _m_tensor_dup_del(d, rng):
    if not d.tensors:
        return
    i = rng.randrange(len(d.tensors))
    if rng.random() < 0.5:
        t = d.tensors[i]
        d.tensors.insert(rng.randrange(len(d.tensors) + 1), TI(t.name, list(t.dims), t.ttype, t.off))
    else:
        del d.tensors[i]


def _m_blob(d, rng):
    b = bytearray(d.blob)
    r = rng.random()
    if r < 0.4 and b:
        del b[rng.randrange(len(b) + 1):]
    elif r < 0.5:
        b += bytes(rng.randrange(1, 256))
    elif b:
        for _ in range(rng.randrange(1, 16)):
            b[rng.randrange(len(b))] = rng.choice([0xff, 0x7c, 0x7e, 0x00, rng.getrandbits(8)])  # NaN/inf scales
    d.blob = bytes(b)


def _m_counts(d, rng):
    if rng.random() < 0.5:
        d.n_kv = _hostile_int(rng, len(d.kvs))
    else:
        d.n_tensors = _hostile_int(rng, len(d.tensors))


def _m_header(d, rng):
    if rng.random() < 0.7:
        d.version = rng.choice([0, 1, 2, 3, 4, 2**31])
    else:
        d.magic = rng.choice([b"GGUF", b"GGML", b"FUGG", b"\0\0\0\0"])


_STRUCT_MUTATORS = ([_m_kv_value] * 6 + [_m_kv_add] * 6 + [_m_kv_retype] * 2 + [_m_kv_dup_del] * 2
                    + [_m_key_name] * 2 + [_m_alignment, _m_dims, _m_dims, _m_ttype, _m_offset, _m_offset,
                                           _m_tensor_name, _m_tensor_dup_del, _m_blob, _m_counts, _m_header])


def byte_mutate(data: bytes, rng: random.Random, max_size: int = 1 << 20) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4, 8])):
        r = rng.random()
        if not b or r < 0.1:
            b += bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16)))
        elif r < 0.45:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif r < 0.65:
            i = rng.randrange(len(b))
            v = rng.choice(INTS) % 2**64
            n = rng.choice([1, 4, 8])
            b[i:i + n] = (v % (1 << (8 * n))).to_bytes(n, "little")
        elif r < 0.8:
            del b[rng.randrange(len(b)):]                      # truncate anywhere
        elif r < 0.9:
            i, j = sorted(rng.randrange(len(b) + 1) for _ in range(2))
            b[i:i] = b[i:j][:4096]                             # duplicate a region
        else:
            i = rng.randrange(len(b))
            del b[i:i + rng.randrange(1, 64)]
    return bytes(b[:max_size])


def lie_mutate(data: bytes, rng: random.Random) -> bytes:
    """Overwrite one count or length field (found by scan) with a hostile value."""
    _, fields = scan(data)
    if not fields:
        return data
    off, n, kind = rng.choice(fields)
    cur = int.from_bytes(data[off:off + n], "little")
    v = _hostile_int(rng, cur) % (1 << (8 * n))
    return data[:off] + v.to_bytes(n, "little") + data[off + n:]


_SCAN_CACHE: dict = {}


def _scan_copy(data: bytes):
    """scan(data) through a small cache (the fuzzers mutate the same corpus entries again and again),
    returned as a copy the mutators may change."""
    d = _SCAN_CACHE.get(data)
    if d is None:
        d = scan(data)[0]
        if len(_SCAN_CACHE) > 64:
            _SCAN_CACHE.clear()
        _SCAN_CACHE[data] = d if d is not None else False
    if not d:
        return None
    return Doc(d.version, [kv.copy() for kv in d.kvs], [TI(t.name, list(t.dims), t.ttype, t.off) for t in d.tensors],
               d.blob, d.alignment, d.magic, d.n_kv, d.n_tensors)


def mutate(data: bytes, rng: random.Random, max_size: int = 1 << 20) -> bytes:
    """One structured mutation of a GGUF image (falls back to raw byte mutation when the input
    cannot be walked, and sometimes on purpose)."""
    d = _scan_copy(data)
    if d is None or rng.random() < 0.1:
        return byte_mutate(data, rng, max_size)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        rng.choice(_STRUCT_MUTATORS)(d, rng)
    out = serialize(d)
    r = rng.random()
    if r < 0.1:
        out = lie_mutate(out, rng)
    elif r < 0.15:
        out = byte_mutate(out, rng, max_size)
    return out[:max_size]


# ---- seeds: tiny but complete Gemma files ------------------------------------------------------------

def _rows(ttype: str, n_rows: int, k: int, rng) -> bytes:
    from gemma4cpu.synth import random_rows
    return random_rows(ttype, n_rows, k, rng, scale=0.5).tobytes()


def _model_doc(arch: str, vocab: list[bytes], scores, types, merges=None, moe=False, ple=False, shared=0,
               extra_kvs=(), seed=0) -> Doc:
    """A complete tiny model: D=64, 2 heads of 32, 1 kv head, ff 64, 2 layers (gemma4: sliding +
    full with K=V), Q8_0 / Q5_0 / F32 tensors of random valid blocks."""
    rng = np.random.default_rng(seed)
    D, Hq, hd, ff, L, V = 64, 2, 32, 64, 3 if shared else 2, len(vocab)
    g = arch + "."
    swa = [True, False, True][:L]
    kvs = [KV(b"general.architecture", STR, arch.encode()), KV(b"general.name", STR, b"fuzz seed " + arch.encode()),
           KV((g + "block_count").encode(), U32, L), KV((g + "embedding_length").encode(), U32, D),
           KV((g + "feed_forward_length").encode(), U32, ff), KV((g + "context_length").encode(), U32, 64),
           KV((g + "attention.head_count").encode(), U32, Hq), KV((g + "attention.head_count_kv").encode(), U32, 1),
           KV((g + "attention.key_length").encode(), U32, hd), KV((g + "attention.value_length").encode(), U32, hd),
           KV((g + "attention.sliding_window").encode(), U32, 4),
           KV((g + "attention.layer_norm_rms_epsilon").encode(), F32, 1e-6),
           KV((g + "rope.freq_base").encode(), F32, 1e6)]
    if arch == "gemma4":
        kvs += [KV(b"gemma4.attention.sliding_window_pattern", ARR, (BOOL, [int(s) for s in swa])),
                KV(b"gemma4.attention.key_length_swa", U32, hd), KV(b"gemma4.rope.freq_base_swa", F32, 1e4),
                KV(b"gemma4.rope.dimension_count", U32, hd // 2), KV(b"gemma4.final_logit_softcapping", F32, 30.0)]
        if shared:
            kvs.append(KV(b"gemma4.attention.shared_kv_layers", U32, shared))
        if moe:
            kvs += [KV(b"gemma4.expert_count", U32, 4), KV(b"gemma4.expert_used_count", U32, 2),
                    KV(b"gemma4.expert_feed_forward_length", U32, 32)]
        if ple:
            kvs.append(KV(b"gemma4.embedding_length_per_layer_input", U32, 32))
    kvs += [KV(b"tokenizer.ggml.model", STR, b"gemma4" if merges is not None else b"llama"),
            KV(b"tokenizer.ggml.tokens", ARR, (STR, vocab)), KV(b"tokenizer.ggml.scores", ARR, (F32, list(scores))),
            KV(b"tokenizer.ggml.token_type", ARR, (I32, list(types))),
            KV(b"tokenizer.ggml.bos_token_id", U32, 2), KV(b"tokenizer.ggml.eos_token_id", U32, 1),
            KV(b"tokenizer.ggml.add_bos_token", BOOL, 1), KV(b"tokenizer.ggml.add_space_prefix", BOOL, 0)]
    if merges is not None:
        kvs += [KV(b"tokenizer.ggml.pre", STR, b"gemma4"), KV(b"tokenizer.ggml.merges", ARR, (STR, merges))]
    kvs += [KV(b"tokenizer.chat_template", STR,
               b"{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] | trim }}"
               b"<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")]
    kvs += list(extra_kvs)
    tensors = []                            # (name, ggml type, n_in, n_out or None, extra dim)

    def mat(name, t, n_in, n_out, n_exp=None):
        tensors.append((name, t, n_in, n_out, n_exp))

    mat("token_embd.weight", "Q8_0", D, V)
    mat("output_norm.weight", "F32", D, None)
    n_kv_layers = L - shared
    for il in range(L):
        p = f"blk.{il}."
        mat(p + "attn_norm.weight", "F32", D, None)
        mat(p + "attn_q.weight", "Q5_0" if il % 2 else "Q8_0", D, Hq * hd)
        mat(p + "attn_q_norm.weight", "F32", hd, None)
        if il < n_kv_layers:
            mat(p + "attn_k.weight", "Q8_0", D, hd)
            if arch != "gemma4" or swa[il]:
                mat(p + "attn_v.weight", "Q8_0", D, hd)
            mat(p + "attn_k_norm.weight", "F32", hd, None)
        mat(p + "attn_output.weight", "Q8_0", Hq * hd, D)
        mat(p + "post_attention_norm.weight", "F32", D, None)
        mat(p + "ffn_norm.weight", "F32", D, None)
        mat(p + "ffn_gate.weight", "Q8_0", D, ff)
        mat(p + "ffn_up.weight", "Q4_0", D, ff)
        mat(p + "ffn_down.weight", "Q8_0", ff, D)
        mat(p + "post_ffw_norm.weight", "F32", D, None)
        if arch == "gemma4":
            mat(p + "layer_output_scale.weight", "F32", 1, None)
        if moe:
            mat(p + "ffn_gate_inp.weight", "F32", D, 4)
            mat(p + "ffn_gate_inp.scale", "F32", D, None)
            for nm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                mat(p + nm + ".weight", "F32", D, None)
            mat(p + "ffn_gate_up_exps.weight", "Q8_0", D, 64, 4)
            mat(p + "ffn_down_exps.weight", "Q8_0", 32, D, 4)
            mat(p + "ffn_down_exps.scale", "F32", 4, None)
        if ple:
            mat(p + "inp_gate.weight", "F32", D, 32)
            mat(p + "proj.weight", "F32", 32, D)
            mat(p + "post_norm.weight", "F32", D, None)
    if ple:
        mat("per_layer_token_embd.weight", "Q8_0", L * 32, V)
        mat("per_layer_model_proj.weight", "F32", D, L * 32)
        mat("per_layer_proj_norm.weight", "F32", 32, None)
    tis, blob = [], bytearray()
    for name, t, n_in, n_out, n_exp in tensors:
        if n_out is None:
            data = rng.uniform(0.5, 1.5, n_in).astype(np.float32).tobytes()
            dims = [n_in]
        else:
            data = _rows(t, n_out * (n_exp or 1), n_in, rng)
            dims = [n_in, n_out] + ([n_exp] if n_exp else [])
        blob += b"\0" * (-len(blob) % 32)
        tis.append(TI(name.encode(), dims, {v[0]: k for k, v in GGML_TYPES.items()}[t], len(blob)))
        blob += data
    return Doc(3, kvs, tis, bytes(blob), 32)


def _spm_vocab(real_kv=None, n=320):
    if real_kv is not None and isinstance(real_kv.get("tokenizer.ggml.tokens"), list):
        toks = real_kv["tokenizer.ggml.tokens"]
        sc = np.asarray(real_kv["tokenizer.ggml.scores"], np.float32)
        ty = np.asarray(real_kv["tokenizer.ggml.token_type"], np.int32)
        keep = list(range(min(n, len(toks))))                       # <pad> <eos> <bos> <unk> ... specials
        keep += [i for i, t in enumerate(toks) if t.startswith("<0x")][:256]   # byte tokens
        keep += list(range(100000, 100000 + 64))                    # ordinary pieces
        keep = sorted(set(i for i in keep if i < len(toks)))
        return [toks[i].encode() for i in keep], sc[keep].tolist(), ty[keep].tolist()
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n\n", "  "]
    toks += [f"<0x{i:02X}>" for i in range(256)]
    words = ["\u2581the", "\u2581a", "he", "ll", "llo", "\u2581w", "or", "ld", "\u2581", "e", "l", "o", "h", "w", "r", "d"]
    toks += words
    types = [3, 3, 3, 2, 3, 3, 4, 4] + [6] * 256 + [1] * len(words)
    scores = [0.0] * 264 + [-float(i) for i in range(len(words))]
    return [t.encode() for t in toks], scores, types


def _bpe_vocab():
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "\n", "\n\n"]
    toks += [f"<0x{i:02X}>" for i in range(256)]
    pieces = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello", "\u2581w", "or", "\u2581wor",
              "\u2581world"]
    toks += pieces
    merges = ["h e", "l l", "he ll", "hell o", "\u2581 w", "o r", "\u2581w or", "\u2581wor ld", "l d"]
    types = [3, 3, 3, 2, 3, 3, 1, 1] + [6] * 256 + [1] * len(pieces)
    return [t.encode() for t in toks], [0.0] * len(toks), types, [m.encode() for m in merges]


def seed_docs(real_kv=None) -> dict[str, Doc]:
    """Tiny complete models: a Gemma 3 with (a slice of) the real Gemma 3 vocabulary when given its
    metadata, a Gemma 4 with a BPE vocabulary, a Gemma 4 with MoE, per-layer embeddings and a
    KV-shared layer, and a vocabulary-only file."""
    spm = _spm_vocab(real_kv)
    tok, sc, ty, merges = _bpe_vocab()
    docs = {
        "gemma3_spm": _model_doc("gemma3", *spm, seed=1),
        "gemma4_bpe": _model_doc("gemma4", tok, sc, ty, merges, seed=2),
        "gemma4_moe_ple_shared": _model_doc("gemma4", tok, sc, ty, merges, moe=True, ple=True, shared=1, seed=3),
    }
    vocab_only = _model_doc("gemma4", tok, sc, ty, merges, seed=4)
    vocab_only.tensors, vocab_only.blob = [], b""
    docs["vocab_only"] = vocab_only
    return docs


def seeds(real_kv=None) -> dict[str, bytes]:
    return {k: serialize(v) for k, v in seed_docs(real_kv).items()}


# ---- targets -------------------------------------------------------------------------------------------

def _expected():
    from gemma4cpu.memory import InsufficientMemoryError
    return (GGUFFormatError, ChatTemplateError, InsufficientMemoryError)


_NUM = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|b'[^']*'")


def label(e: BaseException) -> str:
    """A class of error: the type and the message with numbers and quoted names blanked."""
    msg = str(e).split(": ", 1)[-1] if str(e).startswith("<") else str(e)
    return f"{type(e).__name__}: {_NUM.sub('N', _QUOTED.sub('_', msg))[:120]}"


FORWARD_MAX_BYTES = 32 << 20     # run a forward pass only when the model is this small


def run_gguf(data: bytes, forward: bool = True, template_timeout: float = 0.25) -> str:
    """The loader target (see the module docstring). Returns an outcome label."""
    from gemma4cpu import chat
    from gemma4cpu.assistant import AssistantConfig
    from gemma4cpu.config import ASSISTANT_ARCHS, ModelConfig
    from gemma4cpu.model import Model
    from gemma4cpu.tokenizer import Tokenizer
    from gemma4cpu.weights import load_weights
    expected = _expected()
    try:
        f = GGUFFile.from_bytes(data, "<fuzz>")
    except GGUFFormatError as e:
        return label(e)
    for t in f.tensors.values():                 # every view lies inside the image, of the size it claims
        assert 0 <= t.offset and t.offset + t.n_bytes <= len(data), t
        r = t.raw()
        assert r.size == t.n_bytes and not r.flags.writeable
        if t.type_id in (0, 1, 24, 25, 26, 27, 28):
            t.numpy()
        else:
            assert t.rows().shape == (t.n_rows, t.row_bytes)
    outcome = ["parsed"]
    tok = None
    if "tokenizer.ggml.model" in f.kv:
        try:
            tok = Tokenizer(f.kv)
            if tok.kind != "none":
                for text in TEXTS[:6]:
                    for special in (False, True):
                        ids = tok.encode(text, add_bos=True, parse_special=special)
                        assert all(0 <= i < tok.n_vocab for i in ids), (text, ids)
                        tok.decode(ids)
            outcome.append("tokenizer")
        except GGUFFormatError as e:
            outcome.append(label(e))
    tpl = f.kv.get("tokenizer.chat_template")
    if isinstance(tpl, str):
        try:
            chat.render([{"role": "user", "content": "hi"}], tpl, timeout=template_timeout)
            outcome.append("template")
        except ChatTemplateError as e:
            outcome.append(label(e))
    try:
        arch = f.kv.get("general.architecture")
        if isinstance(arch, str) and arch in ASSISTANT_ARCHS:        # an MTP drafter (-md): its config
            AssistantConfig.from_gguf(f)
            outcome.append("assistant")
            return " | ".join(outcome)
        cfg = ModelConfig.from_gguf(f)
        w = load_weights(f, cfg)
        outcome.append("weights")
        if forward and w.n_bytes <= FORWARD_MAX_BYTES:
            m = Model(f, n_ctx=8, threads=1, max_batch=4, progress=False)
            if tok is not None and tok.n_vocab != cfg.n_vocab:
                outcome.append("vocab-mismatch")
            logits, hidden = m.forward([0, cfg.n_vocab - 1], "all")
            assert logits.shape == (2, cfg.n_vocab) and hidden.shape == (2, cfg.n_embd)
            m.forward([min(1, cfg.n_vocab - 1)])
            m.pool.close()
            outcome.append("forward")
    except expected as e:
        outcome.append(label(e))
    return " | ".join(outcome)


def tokenizers(real_kv=None, extra_files=()) -> list:
    """Tokenizers for run_tokenizer: the seeds' vocabularies, the real Gemma 3 one when given, and
    the vocabularies of extra GGUF files."""
    from gemma4cpu.tokenizer import Tokenizer
    out = []
    for d in seed_docs().values():
        f = GGUFFile.from_bytes(serialize(d))
        out.append(Tokenizer(f.kv))
    if real_kv is not None:
        out.append(Tokenizer(real_kv))
    for p in extra_files:
        out.append(Tokenizer(GGUFFile(p).kv))
    return out


def run_tokenizer(data: bytes, toks: list) -> str:
    """The tokenizer target: data[0] picks the vocabulary and flags, data[1:] is the text."""
    if not data:
        return "empty"
    sel = data[0]
    tok = toks[(sel & 0x0F) % len(toks)]
    parse_special = bool(sel & 0x10)
    raw = data[1:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "surrogateescape" if sel & 0x40 else "replace")
    try:
        ids = tok.encode(text, add_bos=bool(sel & 0x20), parse_special=parse_special)
    except UnicodeEncodeError:
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in text)    # only lone surrogates are refused
        return "surrogates"
    assert all(0 <= i < tok.n_vocab for i in ids), ids[:20]
    back = tok.decode(ids, skip_special=False)
    if not parse_special and "\u2581" not in text and tok.kind != "none" and _byte_complete(tok):
        body = back[len(tok.tokens[tok.bos_id]):] if sel & 0x20 and tok.add_bos else back
        assert body == text, (text[:80], body[:80])
    return f"{tok.kind} ok"


_BYTE_COMPLETE: dict = {}


def _byte_complete(tok) -> bool:
    """Whether every byte has a <0xXX> byte token (then any text round-trips through the vocabulary)
    and no space prefix is added."""
    k = id(tok)
    if k not in _BYTE_COMPLETE:
        have = {t for t, ty in zip(tok.tokens, tok.types.tolist()) if ty == 6}
        _BYTE_COMPLETE[k] = (all(f"<0x{b:02X}>" in have for b in range(256)) and not tok.add_space_prefix)
    return _BYTE_COMPLETE[k]


# ---- a dependency-free driver --------------------------------------------------------------------------

class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


@dataclass
class FuzzStats:
    inputs: int = 0
    crashes: int = 0
    hangs: int = 0
    seconds: float = 0.0
    max_input_s: float = 0.0        # CPU time of the slowest input
    max_input_wall_s: float = 0.0
    labels: dict = field(default_factory=dict)
    crash_examples: list = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.inputs} inputs in {self.seconds:.0f} s ({self.inputs / max(self.seconds, 1e-9):.0f}/s), "
                f"{self.crashes} crashes, {self.hangs} hangs (> hang limit), slowest input {self.max_input_s * 1e3:.0f} ms "
                f"CPU ({self.max_input_wall_s * 1e3:.0f} ms wall), "
                f"{len(self.labels)} distinct outcomes")


class RandomFuzzer:
    """Mutation fuzzing without coverage feedback: inputs come from a corpus (the seeds plus every
    input that gave a new outcome label) through `mutate`. A crash is any exception the target
    raises; a hang is an input that takes more than `hang_s` of CPU time (Python-level loops are
    stopped by a CPU-time alarm, SIGPROF, at that limit). CPU time, not wall time, so a loaded host
    cannot make an input look hung. Crashing and hanging inputs are saved to `out_dir` when given."""

    def __init__(self, target, seeds: list[bytes], rng_seed: int = 0, hang_s: float = 1.0, out_dir=None,
                 max_size: int = 1 << 18, mutator=None, max_corpus: int = 4096):
        self.target, self.rng = target, random.Random(rng_seed)
        self.corpus = list(seeds)
        self.n_seeds = len(self.corpus)
        self.hang_s, self.out_dir, self.max_size, self.max_corpus = hang_s, out_dir, max_size, max_corpus
        self.mutator = mutator or mutate
        self.stats = FuzzStats()

    def _save(self, kind: str, data: bytes, info: str):
        import hashlib
        if self.out_dir is None:
            return
        os.makedirs(self.out_dir, exist_ok=True)
        h = hashlib.sha1(data).hexdigest()[:16]
        with open(os.path.join(self.out_dir, f"{kind}-{h}.bin"), "wb") as fh:
            fh.write(data)
        with open(os.path.join(self.out_dir, f"{kind}-{h}.txt"), "w") as fh:
            fh.write(info)

    def run(self, n: int | None = None, seconds: float | None = None, progress=None) -> FuzzStats:
        import traceback
        st = self.stats
        use_alarm = hasattr(signal, "setitimer") and _in_main_thread()
        old = signal.signal(signal.SIGPROF, _alarm) if use_alarm else None
        t_start = time.perf_counter()
        try:
            while (n is None or st.inputs < n) and (seconds is None or time.perf_counter() - t_start < seconds):
                if st.inputs < self.n_seeds:        # the seeds themselves first
                    data = self.corpus[st.inputs]
                else:
                    data = self.mutator(self.rng.choice(self.corpus), self.rng, self.max_size)
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    if use_alarm:
                        signal.setitimer(signal.ITIMER_PROF, self.hang_s)
                    lab = self.target(data)
                except _Hang:
                    lab = None
                    st.hangs += 1
                    self._save("hang", data, f"stopped by the {self.hang_s} s alarm")
                except Exception as e:  # noqa: BLE001 - every unexpected exception is the finding
                    lab = None
                    st.crashes += 1
                    tb = traceback.format_exc()
                    if len(st.crash_examples) < 5:
                        st.crash_examples.append(tb)
                    self._save("crash", data, tb)
                finally:
                    if use_alarm:
                        signal.setitimer(signal.ITIMER_PROF, 0)
                dt = time.thread_time() - c0
                st.max_input_wall_s = max(st.max_input_wall_s, time.perf_counter() - t0)
                st.inputs += 1
                st.max_input_s = max(st.max_input_s, dt)
                if lab is not None and dt > self.hang_s:
                    st.hangs += 1
                    self._save("hang", data, f"took {dt:.2f} s of CPU")
                if lab is not None:
                    if lab not in st.labels:
                        st.labels[lab] = 0
                        if len(self.corpus) < self.max_corpus:
                            self.corpus.append(data)
                        else:
                            self.corpus[self.rng.randrange(len(self.corpus))] = data
                    st.labels[lab] += 1
                if progress is not None and st.inputs % 1000 == 0:
                    st.seconds = time.perf_counter() - t_start
                    progress(st)
        finally:
            if use_alarm:
                signal.signal(signal.SIGPROF, old)
            st.seconds = time.perf_counter() - t_start
        return st


def _in_main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def text_mutate(data: bytes, rng: random.Random, max_size: int = 1 << 16) -> bytes:
    """Tokenizer inputs: the flag byte, then text with special texts, byte-token look-alikes,
    whitespace runs and multi-byte characters spliced in, or raw byte mutation."""
    if not data or rng.random() < 0.3:
        return byte_mutate(data or b"\x00", rng, max_size)
    flags, text = data[:1], bytearray(data[1:])
    if rng.random() < 0.2:
        flags = bytes([rng.getrandbits(8)])
    piece = rng.choice([b"<bos>", b"<start_of_turn>", b"<|turn>", b"<turn|>", b"<0x41>", b"<0x", b"\n" * 5,
                        b" " * rng.randrange(1, 40), "\u2581".encode(), "日本".encode(), "🙂".encode(), b"\xff",
                        b"\x00", b"hello world", b"\t\r\n", b"a" * rng.randrange(1, 500)])
    i = rng.randrange(len(text) + 1)
    text[i:i] = piece * rng.choice([1, 1, 2, 10])
    return (flags + bytes(text))[:max_size]
