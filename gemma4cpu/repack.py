"""Q4_K weight matrices repacked 8 rows at a time (Q4_K_R8, csrc/g4_blocks.h block_q4_K_r8) at load.

With the 8 rows of a group interleaved, a 32-byte load holds codes of all 8 rows (lane = row), so
the AVX2 one-token product needs no horizontal sums and no scalar step per block. Results are the
Q4_K products' bits exactly (tests/test_q4k_r8.py); only speed changes. Measured on the Zen 3 VM
(2 vCPUs, AVX2), the R8 kernel takes 0.41-0.50x the row kernel's time on L2-resident rows and
0.81-0.84x from memory with both cores streaming; 2-16 tokens run it in 4-token chunks (0.6-1.0x
the row kernel up to 13 tokens, 1.26x at 16), more tokens unpack L2 chunks back into row layout
and run the row kernels (csrc/g4_dispatch.c).

What is repacked: the dense layer matrices (attention q/k/v/output, FFN gate/up/down) of type
Q4_K with a multiple of 8 rows. Not the embedding / LM head (rows are gathered one by one), not
the per-layer-embedding or MoE matrices. Where the weights are copied into anonymous memory (NUMA
copies, --no-mmap, --thp) each copy is repacked in place, after placement. Mapped weights are
repacked before placement into one new anonymous buffer (counted by the memory check; transparent
huge pages advised; each matrix page-aligned), which the NUMA plan then places like any anonymous
memory (gemma4cpu.placement.place), and the file pages they came from are dropped from this
process (MADV_DONTNEED; they stay in the page cache).

GEMMA4CPU_REPACK: 'auto' (default: repack when the active kernel table is avx2, where it was
measured, and the model is not loaded for speculative decoding), '1' (whenever the active table has
the R8 product: also avx512 / amx / ref, for tests and measurements), '0' (never). Speculative
decoding is left out of 'auto' because its verify batches were measured slower on R8 here: on the
31B-shaped 12-layer file with replayed drafts (84 % hits, 3 per round, 2 threads) 4.60 / 3.93
against 5.33 / 5.16 tokens/s in two alternating pairs, while plain decoding gained (tg32 medians
3.26 / 3.46 / 3.64 against 3.11 / 3.08 / 3.34 tokens/s in three pairs)."""
from __future__ import annotations

import mmap as _mmap
import time
from dataclasses import dataclass, field

import numpy as np

from gemma4cpu import isa as isa_mod
from gemma4cpu import kernels as K

ENV = "GEMMA4CPU_REPACK"
CHOICES = {"auto": "default: repack Q4_K matrices on the avx2 table unless decoding speculatively",
           "1": "repack whenever the active table has the Q4_K_R8 product",
           "0": "never repack"}
Q4_K = K.TYPE_IDS["Q4_K"]


@dataclass
class Report:
    mode: str = "auto"
    done: bool = False
    why: str = ""                  # when not done: the reason; when done: how (in place / new memory)
    mats: int = 0
    bytes: int = 0                 # bytes repacked (each copy counted)
    new_bytes: int = 0             # anonymous memory allocated for it
    seconds: float = 0.0
    notes: list = field(default_factory=list)
    buffer: object = None          # the AnonBuffer holding repacked mapped weights (kept alive here)

    def line(self) -> str:
        if not self.done:
            return f"Q4_K repack ({self.mode}): off, {self.why}"
        return (f"Q4_K repack ({self.mode}): {self.mats} matrices, {self.bytes / 2**30:.2f} GiB {self.why} "
                f"in {self.seconds:.1f} s")


def mode_from_env() -> str:
    from gemma4cpu.model import _env_choice
    return _env_choice(ENV, CHOICES)


def candidates(weights) -> list:
    """The matrices this module repacks (see the module docstring), in layer order. `weights` has
    `.layers` whose items may lack some of the seven (an MTP assistant's have no attn_k / attn_v)."""
    out = []
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    for lw in weights.layers:
        for m in (getattr(lw, n, None) for n in names):
            if m is not None and m.type_id == Q4_K and m.n_out % 8 == 0 and m.rows.shape[0] == m.n_out \
                    and m.rows.shape[1] == m.n_in // 256 * 144 and all(m is not o for o in out):
                out.append(m)
    return out


def decide(mode: str, speculative: bool = False) -> tuple[bool, str]:
    """(repack?, why not) for a mode, the active kernel table and whether the model will verify
    draft batches (see the module docstring)."""
    if mode == "0":
        return False, f"{ENV}=0"
    table = isa_mod.active()
    if mode == "auto" and table != "avx2":
        return False, f"the active kernel table is {table} (auto repacks on avx2 only; {ENV}=1 forces it)"
    if mode == "auto" and speculative:
        return False, f"speculative decoding (its verify batches ran slower repacked; {ENV}=1 forces it)"
    return True, ""


def _page_up(n: int) -> int:
    return -(-n // _mmap.PAGESIZE) * _mmap.PAGESIZE


def new_bytes(weights) -> int:
    """Anonymous memory a repack of mapped weights allocates: the matrices' bytes, each rounded up to
    whole pages (copied weights are repacked in place and need none)."""
    return sum(_page_up(m.rows.nbytes) for m in candidates(weights))


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def apply(weights, copied: bool, workers: int = 1, file_map=None, report: Report | None = None) -> Report:
    """Repack the candidate matrices: in place when `copied` (every copy a RowPlacement names as
    well), else into one new anonymous buffer (report.buffer keeps it), dropping the mapped pages
    of each (file_map: the file's mmap.mmap). Sets Mat.type_id to Q4_K_R8 and Mat.rows to the
    repacked array."""
    from gemma4cpu.placement import AnonBuffer
    rep = report or Report()
    mats = candidates(weights)
    t0 = time.perf_counter()
    jobs = []   # (mat, [(src, dst)])
    buf, off = None, 0
    if not copied and mats:
        buf = AnonBuffer(max(1, new_bytes(weights)), huge=True)
        rep.buffer = buf
    for m in mats:
        if copied:
            arrays, seen = [m.rows], {_addr(m.rows)}
            pl = m.placement
            for c in (getattr(pl, "copies", None) or ()):
                c = np.asarray(c)
                if _addr(c) not in seen:
                    seen.add(_addr(c))
                    arrays.append(c)
            if not all(a.flags.writeable for a in arrays):   # not a copy after all: left as it is
                rep.notes.append(f"{m.name}: read-only rows, not repacked")
                continue
            jobs.append((m, [(a, a) for a in arrays]))
        else:
            dst = buf.array[off:off + m.rows.nbytes].reshape(m.rows.shape)
            off += _page_up(m.rows.nbytes)
            jobs.append((m, [(m.rows, dst)]))

    def run(job):
        m, pairs = job
        for src, dst in pairs:
            K.repack_q4_K_r8(src, m.n_in, out=dst)
        return m

    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=workers) as ex:
            list(ex.map(run, jobs))
    else:
        for j in jobs:
            run(j)
    page = _mmap.PAGESIZE
    base = None
    if file_map is not None and not copied:
        base = _addr(np.frombuffer(file_map, np.uint8, count=1))
    for m, pairs in jobs:
        src, dst = pairs[0]
        a0, a1 = _addr(src), _addr(src) + src.nbytes
        if base is not None and hasattr(file_map, "madvise") and base <= a0 and a1 <= base + len(file_map):
            lo, hi = -(-(a0 - base) // page) * page, (a1 - base) // page * page
            if hi > lo:
                try:
                    file_map.madvise(_mmap.MADV_DONTNEED, lo, hi - lo)
                except (OSError, ValueError):
                    pass
        m.rows = dst
        m.type_id = K.Q4_K_R8
        rep.bytes += sum(d.nbytes for _, d in pairs)
    rep.new_bytes = 0 if buf is None else buf.nbytes
    rep.mats = len(jobs)
    rep.done = bool(jobs)
    rep.why = "in place (copied weights)" if copied else "into new memory (the mapped pages dropped)"
    if not jobs:
        rep.why = "no Q4_K layer matrix with a multiple of 8 rows"
    rep.seconds = time.perf_counter() - t0
    return rep
