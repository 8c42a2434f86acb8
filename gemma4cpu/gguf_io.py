"""GGUF reading: a validating header parser plus zero-copy, read-only tensor views.

gguf.GGUFReader takes ~14 s to open a file with a 262k-token vocabulary (it builds a numpy
array per string) and trusts every count in the file. This parser reads the header in one
pass, checks every length, count, type, shape, offset and alignment against the bytes that are
really there before anything is touched, and maps tensor data read-only (np.memmap), so a
model's weights are used in place. Every problem raises GGUFFormatError naming the field and
the byte offset.

Shape convention (the only place it is handled): GGUF dims are ggml order [ne0, ne1, ...]
with ne0 contiguous. A matrix for y = W x is [ne0 = n_cols (in), ne1 = n_rows (out)];
`Tensor.rows()` gives the (n_rows, row_bytes) uint8 view the kernels take.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_STRING = 1 << 26          # 64 MiB: no legitimate key or token is larger
MAX_ARRAY = 1 << 28           # elements in one metadata array
MAX_ALIGNMENT = 1 << 20       # general.alignment: ggml writes 32; anything above a MiB is hostile
INT64_MAX = (1 << 63) - 1

# ggml type id -> (name, block elements, block bytes); the types this engine can meet
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# metadata value types
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
            10: "<u8", 11: "<i8", 12: "<f8"}
_STRUCT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY, _BOOL = 8, 9, 7


class GGUFFormatError(ValueError):
    """A GGUF file that is malformed, truncated or not what the engine supports."""


@dataclass(frozen=True)
class Tensor:
    name: str
    type_id: int
    dims: tuple[int, ...]      # ggml order: dims[0] is contiguous
    offset: int                # absolute byte offset in the file
    n_bytes: int
    _file: "GGUFFile"

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.type_id][0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def n_cols(self) -> int:
        return self.dims[0]

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.dims[0]

    @property
    def row_bytes(self) -> int:
        _, bs, bb = GGML_TYPES[self.type_id]
        return self.dims[0] // bs * bb

    def raw(self) -> np.ndarray:
        """Read-only uint8 view of the tensor's bytes (no copy)."""
        return self._file._map[self.offset:self.offset + self.n_bytes]

    def rows(self) -> np.ndarray:
        """(n_rows, row_bytes) uint8 read-only view: the kernels' weight operand. GGUF aligns
        tensor data (general.alignment, 32 by default); data that is not even 4-byte aligned (a
        file declaring alignment 1 or 2, or a damaged one) is copied to aligned memory once,
        because the kernels read each block's fp16 / f32 scales as typed fields."""
        r = self.raw().reshape(self.n_rows, self.row_bytes)
        if r.ctypes.data % 4:
            r = r.copy()  # numpy allocations are at least 16-byte aligned
            r.flags.writeable = False
        return r

    def numpy(self) -> np.ndarray:
        """Float/int tensors as their numpy dtype, shaped numpy-order (reversed dims); no copy."""
        dt = {"F32": "<f4", "F16": "<f2", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "F64": "<f8"}.get(
            self.type_name)
        if dt is None:
            raise GGUFFormatError(f"tensor {self.name!r}: {self.type_name} has no plain numpy view; dequantize it")
        return self.raw().view(dt).reshape(tuple(reversed(self.dims)))


class _Cursor:
    def __init__(self, buf: memoryview, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str):
        if n < 0 or self.pos + n > self.size:
            raise GGUFFormatError(f"truncated file: {what} needs {n} bytes at offset {self.pos}, "
                                  f"only {self.size - self.pos} left")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self, what: str) -> str:
        at = self.pos
        n = self.unpack("<Q", what + " length")
        if n > MAX_STRING:
            raise GGUFFormatError(f"{what}: string length {n} at offset {at} is implausible")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFFormatError(f"{what}: invalid UTF-8 at offset {at + 8 + e.start}") from None


class GGUFFile:
    """A parsed GGUF file: `.kv` metadata (scalars as Python values, numeric arrays as numpy,
    string arrays as lists), `.tensors` by name, `.version`, `.alignment`."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24:
                    raise GGUFFormatError(f"{self.path}: {size} bytes is too small to be a GGUF file")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFFormatError(f"cannot open {self.path}: {e.strerror or e}") from None
        # the mapping's own length, not the stat: a file that changed in between cannot make a
        # check pass against bytes that are not mapped (every view below is bounded by this)
        self._load(self._mm)

    @classmethod
    def from_bytes(cls, data, name: str = "<bytes>") -> "GGUFFile":
        """Parse a GGUF image held in memory (bytes-like; views into it are read-only)."""
        self = cls.__new__(cls)
        self.path = name
        self._mm = bytes(data)
        if len(self._mm) < 24:
            raise GGUFFormatError(f"{name}: {len(self._mm)} bytes is too small to be a GGUF file")
        self._load(self._mm)
        return self

    def _load(self, buf):
        self.size = len(buf)
        self._raw = buf            # bytes or mmap: slicing gives bytes
        self._map = np.frombuffer(buf, dtype=np.uint8)
        try:
            self._parse(memoryview(buf))
        except GGUFFormatError as e:
            raise GGUFFormatError(f"{self.path}: {e}") from None

    # -- parsing ------------------------------------------------------------------------
    def _value(self, c: _Cursor, vtype: int, what: str):
        if vtype in _SCALARS:
            v = c.unpack(_STRUCT[vtype], what)
            if vtype == _BOOL:
                if v not in (0, 1):
                    raise GGUFFormatError(f"{what}: bool value {v} at offset {c.pos - 1}")
                return bool(v)
            return v
        if vtype == _STRING:
            return c.string(what)
        if vtype == _ARRAY:
            at = c.pos
            etype, n = c.unpack("<IQ", what + " array header")
            if n > MAX_ARRAY:
                raise GGUFFormatError(f"{what}: array of {n} elements at offset {at} is implausible")
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype])
                c.need(n * dt.itemsize, what + " array data")
                arr = np.frombuffer(c.buf, dtype=dt, count=n, offset=c.pos).copy()
                c.pos += n * dt.itemsize
                if etype == _BOOL:
                    if arr.size and arr.max() > 1:
                        raise GGUFFormatError(f"{what}: bool array holds values other than 0/1 (offset {at})")
                    arr = arr.astype(bool)
                return arr
            if etype == _STRING:
                c.need(n * 8, what + " string array")  # each element has at least its length
                return self._strings(c, n, what)
            raise GGUFFormatError(f"{what}: unsupported array element type {etype} at offset {at}")
        raise GGUFFormatError(f"{what}: unknown value type {vtype} at offset {c.pos - 4}")

    def _strings(self, c: _Cursor, n: int, what: str) -> list[str]:
        """n strings from c (a vocabulary: 262k of them in Gemma). The same checks as
        _Cursor.string, in one tight loop; any anomaly is re-read by _Cursor.string, which raises
        the precise error."""
        out = []
        raw, size, pos = self._raw, c.size, c.pos
        unpack = struct.unpack_from
        for i in range(n):
            ln = unpack("<Q", raw, pos)[0] if pos + 8 <= size else -1
            end = pos + 8 + ln
            if ln < 0 or ln > MAX_STRING or end > size:
                c.pos = pos
                c.string(f"{what}[{i}]")           # raises
            try:
                out.append(raw[pos + 8:end].decode("utf-8"))
            except UnicodeDecodeError:
                c.pos = pos
                c.string(f"{what}[{i}]")           # raises
            pos = end
        c.pos = pos
        return out

    def _parse(self, buf: memoryview):
        c = _Cursor(buf, self.size)
        magic = bytes(buf[:4])
        if magic != GGUF_MAGIC:
            raise GGUFFormatError(f"not a GGUF file (magic {magic!r} at offset 0, expected b'GGUF')")
        c.pos = 4
        self.version = c.unpack("<I", "version")
        if self.version not in (2, 3):
            raise GGUFFormatError(f"unsupported GGUF version {self.version} at offset 4 (2 and 3 are supported)")
        n_tensors, n_kv = c.unpack("<QQ", "counts")
        # every kv needs >= 8+1+4+1 bytes and every tensor info >= 8+1+4+8+4+8: bound the counts
        if n_kv * 13 > self.size or n_tensors * 33 > self.size:
            raise GGUFFormatError(f"header claims {n_kv} metadata entries and {n_tensors} tensors (counts at "
                                  f"offset 8), more than a {self.size}-byte file can hold")
        self.kv: dict = {}
        kv_at: dict[str, int] = {}
        for i in range(n_kv):
            at = c.pos
            key = c.string(f"metadata key #{i}")
            if key in self.kv:
                raise GGUFFormatError(f"duplicate metadata key {key!r} at offset {at} "
                                      f"(first at offset {kv_at[key]})")
            kv_at[key] = at
            vtype = c.unpack("<I", f"type of {key!r}")
            self.kv[key] = self._value(c, vtype, f"metadata {key!r}")
        self.alignment = self.kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if (not isinstance(self.alignment, int) or isinstance(self.alignment, bool) or self.alignment <= 0
                or self.alignment & (self.alignment - 1) or self.alignment > MAX_ALIGNMENT):
            raise GGUFFormatError(f"general.alignment={self.alignment!r} (at offset {kv_at.get('general.alignment')}) "
                                  f"is not a power of two in 1..{MAX_ALIGNMENT}")
        infos = []
        names = set()
        for i in range(n_tensors):
            at = c.pos
            name = c.string(f"tensor #{i} name")
            if name in names:
                raise GGUFFormatError(f"duplicate tensor {name!r} at offset {at}")
            names.add(name)
            nd = c.unpack("<I", f"tensor {name!r} n_dims")
            if not 1 <= nd <= MAX_DIMS:
                raise GGUFFormatError(f"tensor {name!r}: {nd} dimensions (1..{MAX_DIMS} allowed) at offset {at}")
            dims = tuple(c.unpack("<" + "Q" * nd, f"tensor {name!r} dims")) if nd > 1 else (
                c.unpack("<Q", f"tensor {name!r} dims"),)
            type_at = c.pos
            ttype = c.unpack("<I", f"tensor {name!r} type")
            off = c.unpack("<Q", f"tensor {name!r} offset")
            if ttype not in GGML_TYPES:
                raise GGUFFormatError(f"tensor {name!r}: unknown ggml type {ttype} at offset {type_at}")
            tname, bs, bb = GGML_TYPES[ttype]
            if any(d == 0 for d in dims):
                raise GGUFFormatError(f"tensor {name!r}: zero dimension in {list(dims)} (tensor info at offset {at})")
            if dims[0] % bs:
                raise GGUFFormatError(f"tensor {name!r}: first dim {dims[0]} is not a multiple of the "
                                      f"{tname} block size {bs} (tensor info at offset {at})")
            # exact (Python) integers: the element count is compared with int64 and the byte count
            # with the file size before anything multiplies them in fixed width (ggml keeps int64 ne)
            n_el = 1
            for d in dims:
                n_el *= d
            if max(dims) > INT64_MAX or n_el > INT64_MAX:
                raise GGUFFormatError(f"tensor {name!r}: dims {list(dims)} ({n_el} elements) overflow int64 "
                                      f"(tensor info at offset {at})")
            n_bytes = n_el // bs * bb
            if n_bytes > self.size:
                raise GGUFFormatError(f"tensor {name!r}: {list(dims)} {tname} needs {n_bytes} bytes, "
                                      f"more than the whole file ({self.size}) (tensor info at offset {at})")
            if off % self.alignment:
                raise GGUFFormatError(f"tensor {name!r}: data offset {off} (field at offset {type_at + 4}) is not "
                                      f"{self.alignment}-byte aligned")
            infos.append((name, ttype, dims, off, n_bytes))
        self.data_offset = -(-c.pos // self.alignment) * self.alignment
        self.tensors: dict[str, Tensor] = {}
        spans = []
        for name, ttype, dims, off, n_bytes in infos:
            start = self.data_offset + off
            if start + n_bytes > self.size:
                raise GGUFFormatError(f"tensor {name!r}: data [{start}, {start + n_bytes}) runs past the end of "
                                      f"the file ({self.size} bytes); the file is truncated or corrupt")
            spans.append((start, start + n_bytes, name))
            self.tensors[name] = Tensor(name, ttype, dims, start, n_bytes, self)
        spans.sort()
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise GGUFFormatError(f"tensors {an!r} and {bn!r} overlap ([{a0}, {a1}) and [{b0}, {b1}))")

    # -- access ---------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        a = self.kv.get("general.architecture")
        if not isinstance(a, str):
            raise GGUFFormatError(f"{self.path}: general.architecture is missing" +
                                  ("" if a is None else f" (not a string: {type(a).__name__})"))
        return a

    def get(self, key: str, default=None):
        return self.kv.get(key, default)

    def require(self, key: str):
        if key not in self.kv:
            raise GGUFFormatError(f"{self.path}: required metadata key {key!r} is missing")
        return self.kv[key]

    def tensor(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise GGUFFormatError(f"{self.path}: required tensor {name!r} is missing")
        return t

    def close(self):
        self._map = None
        if isinstance(self._mm, mmap.mmap):
            try:
                self._mm.close()
            except BufferError:
                pass  # views still alive: the mapping goes when they do
